"""Framework log noise off, for our command and examples (never on import of the library).

Paddle's C++ INFO lines (glog: "New Executor is Running"...), Paddle 3's
"No ccache found" warning and MXNet's "Cannot decide type" warning (type
inference on a graph whose data inputs have no declared dtype yet) tell a user
nothing about their training. ``quiet_frameworks()`` turns them off; call it
before importing a framework, since glog reads its environment at import.
Warnings and errors of the frameworks, and every message of ours, still show.
"""
from __future__ import annotations

import os
import warnings

# Environment read by the frameworks' C++ logging when they are imported.
NOISE_ENV = {
    "GLOG_minloglevel": "2",          # Paddle: glog INFO and WARNING lines off, errors stay
    "FLAGS_call_stack_level": "1",    # Paddle: errors without the C++ stack
}
# Python warnings that are framework housekeeping, not a message about the user's model.
NOISE_WARNINGS = (
    r"No ccache found",
    r"Cannot decide type for the following arguments",
)


def quiet_frameworks() -> None:
    """Set ``NOISE_ENV`` (unless the user set those variables) and ignore ``NOISE_WARNINGS``."""
    for key, value in NOISE_ENV.items():
        os.environ.setdefault(key, value)
    for message in NOISE_WARNINGS:
        warnings.filterwarnings("ignore", message=message)
