"""``cast_report(layer, *inputs, policy=...)``: the project's ``CastReport`` of the ops
``layer(*inputs)`` runs in eager mode under a policy (the twin of ``mxnet_amp.cast_report``
and ``paddle_amp.cast_report``): each wrapped op call, in call order, with its program op
name, canonical name, input dtypes, run dtype, how it ran (kernel, emulated, fell back)
and why. Built from decisions alone (no graph to count casts in)."""
from __future__ import annotations

import contextlib
from typing import Any, Iterator

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
        with paddle.no_grad(), _eager_if_sot(layer):
            layer(*inputs)
    finally:
        dispatch.pop(frame)
    return CastReport("paddle", tuple(log))


@contextlib.contextmanager
def _eager_if_sot(layer: Any) -> Iterator[None]:
    """A ``to_static`` model on SOT (``full_graph=False``) runs in eager mode for the report:
    SOT caches its programs by its own guards, not by the region (``jit``), so a second
    report of it saw no op; eager mode's decisions are the ones its program is built with.
    A ``full_graph=True`` model reports its program's ops (``jit``)."""
    try:
        from paddle.jit.dy2static.program_translator import (ProgramTranslator,
                                                             SymbolicStaticFunction)
    except ImportError:  # a Paddle without SOT
        yield
        return
    if not (isinstance(layer, SymbolicStaticFunction) or
            isinstance(getattr(layer, "forward", None), SymbolicStaticFunction)):
        yield
        return
    translator = ProgramTranslator.get_instance()
    before = translator.enable_to_static
    translator.enable(False)
    try:
        yield
    finally:
        translator.enable(before)
