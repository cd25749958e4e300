"""Framework log noise off, for our command and examples (never on import of the library).

Paddle's C++ INFO lines (glog: "New Executor is Running"...), Paddle 3's
"No ccache found" warning, the UserWarning Paddle 3.3's own PIR backward
raises ("Tensor do not have 'place' interface for pir graph mode") and MXNet's
"Cannot decide type" warning (type inference on a graph whose data inputs have
no declared dtype yet) tell a user nothing about their training.
``quiet_frameworks()`` turns them off; call it before importing a framework,
since glog reads its environment at import.

Paddle 3 also gives the root logger a stderr handler at INFO when it is
imported, so every library's INFO line shows, timestamped (on Paddle 2.6, and
without Paddle, Python's default shows WARNING and above only). Our own
loggers are therefore set to WARNING here, unless a level was set for them:
the same lines show on Paddle 3 as on 2.6. Warnings and errors of the
frameworks, and every warning of ours, still show.
"""
from __future__ import annotations

import contextlib
import logging
import os
import sys
import warnings
from typing import Iterator

# Environment read by the frameworks' C++ logging when they are imported.
NOISE_ENV = {
    "GLOG_minloglevel": "2",          # Paddle: glog INFO and WARNING lines off, errors stay
    "FLAGS_call_stack_level": "1",    # Paddle: errors without the C++ stack
}
# Python warnings that are framework housekeeping, not a message about the user's model.
NOISE_WARNINGS = (
    r"No ccache found",
    r"Cannot decide type for the following arguments",
    r"Tensor do not have 'place' interface for pir graph mode",
)
# Our loggers: INFO (what emulation does where) is for a user who asks for it.
OUR_LOGGERS = ("amp_adapters", "mxnet_amp", "paddle_amp")


def quiet_frameworks() -> None:
    """Set ``NOISE_ENV`` (unless the user set those variables), ignore ``NOISE_WARNINGS``, and
    show our loggers' WARNING and above only (unless their level was set)."""
    for key, value in NOISE_ENV.items():
        os.environ.setdefault(key, value)
    for message in NOISE_WARNINGS:
        warnings.filterwarnings("ignore", message=message)
    for name in OUR_LOGGERS:
        logger = logging.getLogger(name)
        if logger.level == logging.NOTSET:
            logger.setLevel(logging.WARNING)


@contextlib.contextmanager
def stderr_silenced() -> Iterator[None]:
    """File descriptor 2 to /dev/null, for a kernel probe: a probe that fails is an expected
    answer, and the frameworks' C++ log it there (MXNet's oneDNN "could not create a
    primitive descriptor iterator", Paddle's "conv2d raises an exception ... not
    implemented for data type bfloat16"), which tells a user nothing."""
    sys.stderr.flush()
    saved, devnull = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)
