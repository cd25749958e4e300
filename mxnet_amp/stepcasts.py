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
  the backward pass is not reused by a paused one, nor the reverse;
- an activation's cast or rounding (emulation) is shared by all its readers too, while
  autograd records and only while the array is a value of the recorded graph: MXNet then
  refuses to write it in place ("Assigning to NDArrays that are already in a computational
  graph...": ``+=``, ``x[:] =``, ``out=x`` raise), so the one rounding cannot go stale.
  Checked at every use, not only the first: a ``backward`` inside the forward frees the
  graph (the array may be written again: not shared after it), and a write under
  ``autograd.pause()`` is not refused, so turning recording off starts a new generation of
  activation casts (``set_recording`` counts it). An NDArray has no version counter, so an
  array outside a recorded graph (the input batch, an inference forward) may change
  between two reads: it is cast per reader, as MXNet does. The price: the strong reference
  that keeps an array's id unique (an NDArray takes no weak reference) keeps a cast
  activation until the forward returns, where it could go after its last reader if
  neither its producer nor a reader saves it for the backward (a rounding's input under
  emulation, when the op before it was emulated too); never into the backward pass.

Costs a thread-local check per block call and per ``Parameter.data()``, a dict lookup per
cast of a parameter, and a call of MXNet's (about a microsecond: is the array in the
recorded graph?) per cast of an activation while recording; no host sync. Installed by
``init``, removed by ``reset``.
"""
from __future__ import annotations

import ctypes
import functools
import threading
from typing import Any, Callable, Optional

import mxnet as mx
from mxnet import autograd
from mxnet.base import _LIB, SymbolHandle
from mxnet.gluon import Block, Parameter


class _Step(threading.local):
    casts: Optional[dict] = None   # (id(array), how, recording, training) -> (array, cast)
    params: Optional[dict] = None  # id(array) -> array: the parameters read in this step
    pauses: int = 0  # times recording was turned off in this step (a generation of casts)


_step = _Step()


def step_casts() -> Optional[dict]:
    """The casts of the step running in this thread (None outside a model's forward)."""
    return _step.casts


def cast_once(x: Any, how: str, make: Callable[[Any], Any]) -> Any:
    """``make(x)``, shared by every use of ``x`` in this step when ``x`` is a trainable
    parameter's array, or, while autograd records, a value of the recorded graph (an
    activation); ``make(x)`` anew otherwise."""
    casts, params = _step.casts, _step.params
    if casts is None or params is None:
        return make(x)
    if id(x) in params:
        key: tuple = (id(x), how, autograd.is_recording(), autograd.is_training())
    elif autograd.is_recording() and in_recorded_graph(x):  # frozen: see the module doc
        key = (id(x), how, True, autograd.is_training(), _step.pauses)
    else:
        return make(x)
    hit = casts.get(key)
    if hit is None:
        hit = casts[key] = (x, make(x))  # holding x keeps its id unique in the step
    return hit[1]


def in_recorded_graph(x: Any) -> bool:
    """Whether ``x`` is a value of the graph autograd is recording (an op's recorded output,
    or an array with ``attach_grad``), which MXNet refuses to write in place while recording;
    False after a ``backward`` freed that graph, and for an array no recorded op wrote. It is
    MXNet's own test (``AGInfo::IsNone``, read through ``MXAutogradGetSymbol``, which fails
    on exactly those arrays), the one its recording uses to refuse the write; O(1)."""
    handle = SymbolHandle()
    if _LIB.MXAutogradGetSymbol(x.handle, ctypes.byref(handle)) != 0:
        return False
    _LIB.MXSymbolFree(handle)
    return True


def _call(call: Callable) -> Callable:
    @functools.wraps(call)
    def called(block: Any, *args: Any) -> Any:
        if _step.casts is not None:  # an inner block: the step is already open
            return call(block, *args)
        _step.casts, _step.params, _step.pauses = {}, {}, 0
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


def _set_recording(set_recording: Callable) -> Callable:
    @functools.wraps(set_recording)
    def counted(is_recording: bool) -> Any:
        if not is_recording and _step.casts is not None:
            _step.pauses += 1  # an array of the graph may be written now: a new generation
        return set_recording(is_recording)
    counted.__amp_original__ = set_recording  # type: ignore[attr-defined]
    return counted


def install() -> list[tuple[Any, str, Any]]:
    """Wrap ``Block.__call__``, ``Parameter.data`` and autograd's ``set_recording`` (which
    ``pause()`` and ``record()`` call; the contrib module's ``set_is_training``); returns the
    patches as (owner, attribute, original) for ``reset`` to undo."""
    patches = [(Block, "__call__", Block.__call__), (Parameter, "data", Parameter.data)]
    Block.__call__ = _call(Block.__call__)
    Parameter.data = _data(Parameter.data)
    for module, attr in ((mx.autograd, "set_recording"),
                         (mx.contrib.autograd, "set_is_training")):  # sets recording too
        patches.append((module, attr, getattr(module, attr)))
        setattr(module, attr, _set_recording(getattr(module, attr)))
    return patches


def forget() -> None:
    """Drop this thread's step (``reset``; a forward that raised has already dropped it)."""
    _step.casts = _step.params = None
