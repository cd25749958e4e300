"""In eager mode a tensor is cast or rounded once per step, however many ops read it.

Without this, each op the region lowers or emulates casts its operands anew: a Linear
applied N times in one forward (a weight-tied recurrence, a shared embedding) keeps N casts
of its weight alive until the backward pass (apache/mxnet#19019 in MXNet's AMP), and an
activation read by three emulated projections is rounded into three float32 copies. As
``mxnet_amp.stepcasts`` does for imperative Gluon:

- the outermost ``paddle.nn.Layer.__call__`` inside a region (the model's forward) opens a
  step: a dict of casts, dropped when that call returns, so a cast lives only as long as the
  autograd graph that uses it, and nothing of a step is held into the next (which casts the
  updated weight anew; pytorch#48049's cache outlived its step);
- a trainable parameter's cast is kept for the step; an activation's only while gradients
  are recorded (its copy is then kept by the op's backward anyway: sharing it costs
  nothing), and it is known by a weak reference (the cache never keeps an activation alive,
  and a reused ``id`` is not taken for it);
- a cast is kept per (tensor, what was done to it, gradients recorded or not, and for an
  activation its in-place version: one written in place since is cast anew).

Installed with the region's wrappers (``dispatch``), removed with them: outside
``auto_cast`` nothing is patched. Costs a thread-local check per Layer call and a dict
lookup per cast operand.
"""
from __future__ import annotations

import functools
import threading
import weakref
from typing import Any, Callable, Optional


class _Step(threading.local):
    casts: Optional[dict] = None  # (id(x), how, grad) -> (x or a weak reference to it, out)


_step = _Step()
_original: list = []  # Layer.__call__ as it was when installed


def step_casts() -> Optional[dict]:
    """The casts of the step running in this thread (None outside a model's forward)."""
    return _step.casts


def cast_once(x: Any, how: tuple, make: Callable[[Any], Any]) -> Any:
    """``make(x)``, shared by every use of ``x`` in this step (``how``: what ``make`` does,
    e.g. ``("round", "float16")``); ``make(x)`` anew outside a step, and for an activation
    while no gradient is recorded."""
    casts = _step.casts
    if casts is None:
        return make(x)
    import paddle
    if not paddle.in_dynamic_mode() or not isinstance(x, paddle.Tensor):
        return make(x)  # a program being built (to_static): its own planner shares casts
    grad = paddle.is_grad_enabled()
    param = isinstance(x, paddle.base.framework.EagerParamBase) and not x.stop_gradient
    if not param and not grad:
        return make(x)
    # an activation written in place since (``relu_``) is a new value: its version is keyed
    key = (id(x), how, grad) if param else (id(x), how, grad, x._inplace_version())
    hit = casts.get(key)
    if hit is not None:
        held = hit[0] if param else hit[0]()
        if held is x:
            return hit[1]
    out = make(x)
    # a parameter is held (it lives on anyway, and its id stays unique in the step); an
    # activation only weakly
    casts[key] = (x if param else weakref.ref(x), out)
    return out


def _call(call: Callable) -> Callable:
    @functools.wraps(call)
    def called(layer: Any, *args: Any, **kwargs: Any) -> Any:
        if _step.casts is not None:  # an inner layer: the step is already open
            return call(layer, *args, **kwargs)
        _step.casts = {}
        try:
            return call(layer, *args, **kwargs)
        finally:
            _step.casts = None
    called.__amp_original__ = call  # type: ignore[attr-defined]
    return called


def install() -> None:
    """Open a step at each outermost Layer call (while a region's wrappers are installed)."""
    from paddle.nn import Layer
    current = Layer.__call__
    if getattr(current, "__amp_original__", None) is None:
        _original[:] = [current]
        Layer.__call__ = _call(current)


def uninstall() -> None:
    """Put ``Layer.__call__`` back (only our own wrapper: another tool's later patch stays)."""
    from paddle.nn import Layer
    if _original and getattr(Layer.__call__, "__amp_original__", None) is _original[0]:
        Layer.__call__ = _original[0]
    _original.clear()
