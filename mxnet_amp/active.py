"""The policy ``mxnet_amp.init`` installed: one small state module that the trainer (and
anything else that only needs to *read* the active policy) asks, without importing the
op-patching machinery."""
from __future__ import annotations

from typing import Optional

from amp_adapters import Policy

_policy: Optional[Policy] = None


def active_policy() -> Optional[Policy]:
    """The policy ``init`` installed, or None."""
    return _policy


def set_policy(policy: Optional[Policy]) -> None:
    """Record the policy in force (``init``) or none (``reset``)."""
    global _policy
    _policy = policy
