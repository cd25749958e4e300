"""The policy ``mxnet_amp.init`` installed, and the layer names its op calls have seen: one
small state module that the trainer (and anything else that only needs to *read* the active
policy) asks, without importing the op-patching machinery."""
from __future__ import annotations

from typing import Iterable, Optional

from amp_adapters import Policy
from amp_adapters.rules.layers import check_matched

_policy: Optional[Policy] = None
_layer_names: set[str] = set()    # the node names, block names and paths seen under init
_layers_checked: list[bool] = []  # check_layers ran (once per init)


def active_policy() -> Optional[Policy]:
    """The policy ``init`` installed, or None."""
    return _policy


def set_policy(policy: Optional[Policy]) -> None:
    """Record the policy in force (``init``) or none (``reset``)."""
    global _policy
    _policy = policy


def note_layer_names(names: Iterable[str]) -> None:
    """Names of the model called under ``init`` (block paths and names, traced node names)
    that ``check_layers`` matches the policy's layer rules against."""
    _layer_names.update(names)


def forget_layer_names() -> None:
    """``reset``: no layer seen, no check made."""
    _layer_names.clear()
    _layers_checked.clear()


def check_layers() -> None:
    """Once per ``init``, when a loss is first scaled (every block of the step has been called
    by then): raise ``AmpConfigError`` if a layer rule of the policy matches no block path,
    block name or traced node name seen, naming the closest. Raised before the step scales
    anything (the trainer's loss-scale state is untouched), and again at each later
    ``scale_loss`` until ``reset()`` and an ``init`` with a policy that matches."""
    policy = _policy
    if _layers_checked or policy is None or not policy.enabled \
            or not policy.layer_patterns("mxnet"):
        return
    check_matched(policy.layer_patterns("mxnet"), _layer_names,
                  "the model called under mxnet_amp.init")
    _layers_checked.append(True)
