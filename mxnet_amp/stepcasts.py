"""A Gluon parameter used by several ops in one imperative forward is cast once, not per use.

MXNet's own AMP casts a weight again at each op that reads it, so a layer applied N times
in one forward (a weight-tied recurrence, a shared embedding) keeps N casts of its weight
alive until the backward pass, and runs out of memory (apache/mxnet#19019). A traced graph
has its own cache (``patching._traced_graph``); this is the imperative one:

- the outermost ``Block.__call__`` (the model's forward) opens a step: a dict of casts,
  dropped when that call returns, so a cast lives only as long as the autograd graph that
  uses it (nothing of a step is held into the next, which casts the updated weight anew;
  pytorch#48049's cache outlived its step);
- a parameter's array is known by ``Parameter.data()``, which registers what it returns
  while a step is open (a trainable parameter only: a ``grad_req="null"`` one may be an
  auxiliary state that an op updates in place, such as BatchNorm's running mean, and a
  stale cast of it would be wrong);
- a cast is kept per (array, cast, autograd recording, training mode): a cast recorded for
  the backward pass is not reused by a paused one, nor the reverse.

Costs a thread-local check per block call and per ``Parameter.data()``, a dict lookup per
cast of a parameter; no host sync. Installed by ``init``, removed by ``reset``.
"""
from __future__ import annotations

import functools
import threading
from typing import Any, Callable, Optional

from mxnet import autograd
from mxnet.gluon import Block, Parameter


class _Step(threading.local):
    casts: Optional[dict] = None   # (id(array), how, recording, training) -> (array, cast)
    params: Optional[dict] = None  # id(array) -> array: the parameters read in this step


_step = _Step()


def step_casts() -> Optional[dict]:
    """The casts of the step running in this thread (None outside a model's forward)."""
    return _step.casts


def cast_once(x: Any, how: str, make: Callable[[Any], Any]) -> Any:
    """``make(x)``, shared by every use of ``x`` in this step when ``x`` is a trainable
    parameter's array; ``make(x)`` anew otherwise."""
    casts, params = _step.casts, _step.params
    if casts is None or params is None or id(x) not in params:
        return make(x)
    key = (id(x), how, autograd.is_recording(), autograd.is_training())
    hit = casts.get(key)
    if hit is None:
        hit = casts[key] = (x, make(x))  # holding x keeps its id unique in the step
    return hit[1]


def _call(call: Callable) -> Callable:
    @functools.wraps(call)
    def called(block: Any, *args: Any) -> Any:
        if _step.casts is not None:  # an inner block: the step is already open
            return call(block, *args)
        _step.casts, _step.params = {}, {}
        try:
            return call(block, *args)
        finally:
            _step.casts = _step.params = None
    called.__amp_original__ = call  # type: ignore[attr-defined]
    return called


def _data(data: Callable) -> Callable:
    @functools.wraps(data)
    def read(param: Any, *args: Any, **kwargs: Any) -> Any:
        out = data(param, *args, **kwargs)
        if _step.params is not None and param.grad_req != "null":
            _step.params[id(out)] = out
        return out
    read.__amp_original__ = data  # type: ignore[attr-defined]
    return read


def install() -> list[tuple[Any, str, Any]]:
    """Wrap ``Block.__call__`` and ``Parameter.data``; returns the patches as (class,
    attribute, original) for ``reset`` to undo."""
    patches = [(Block, "__call__", Block.__call__), (Parameter, "data", Parameter.data)]
    Block.__call__ = _call(Block.__call__)
    Parameter.data = _data(Parameter.data)
    return patches


def forget() -> None:
    """Drop this thread's step (``reset``; a forward that raised has already dropped it)."""
    _step.casts = _step.params = None
