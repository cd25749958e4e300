"""``cast_report(layer, *inputs, policy=...)``: the project's ``CastReport`` of the ops
``layer(*inputs)`` runs in eager mode under a policy (the twin of ``mxnet_amp.cast_report``
and ``paddle_amp.cast_report``): each wrapped op call, in call order, with its program op
name, canonical name, input dtypes, run dtype, how it ran (kernel, emulated, fell back)
and why. Built from decisions alone (no graph to count casts in)."""
from __future__ import annotations

from typing import Any

from amp_adapters import CastReport

from . import dispatch
from .config import policy_of


def cast_report(layer: Any, *inputs: Any, policy: Any = None, training: bool = True,
                **auto_cast_kwargs: Any) -> CastReport:
    """Run ``layer(*inputs)`` once, without gradients, under ``auto_cast(policy=policy,
    **auto_cast_kwargs)`` (the native's defaults without either), and report each op call's
    decision: as a training step decides it (``training``, the default: gradient kernels
    and their refusals count) or an inference forward. The arguments are checked as
    ``auto_cast`` checks them."""
    import paddle
    if not callable(layer):
        raise TypeError(f"cast_report: layer must be a paddle.nn.Layer or a callable, got "
                        f"{type(layer).__name__}")
    resolved = policy_of(policy=policy, **auto_cast_kwargs)
    log: list = []
    frame = dispatch.push(resolved, log=log, training=training)
    try:
        with paddle.no_grad():
            layer(*inputs)
    finally:
        dispatch.pop(frame)
    return CastReport("paddle", tuple(log))
