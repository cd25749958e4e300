"""``FullyConnected`` with a frozen weight and a trained bias: the bias gradient, computed.

MXNet 1.9.1's oneDNN ``FullyConnected`` backward on CPU computes the bias gradient
together with the weight gradient, and skips both when the weight's gradient request is
``null`` (``grad_req='null'`` on a layer's weight while its bias trains, as in
fine-tuning): the bias gradient array is never written. Natively it stays 0 (the bias
silently never trains). Under AMP the bias reaches the op through a cast (a rounding
through fp16 when emulated, a cast to bf16 for real bf16), whose gradient buffer is fresh
and uninitialised: its garbage (often inf or NaN) flows into the bias gradient, the
overflow check sees it, and clean steps are skipped while the scale falls.

For that case only (a frozen weight, a bias that trains), the op runs without its bias
and the bias is added by ``broadcast_add``, whose backward always writes the bias
gradient. The forward value is the same sum. Every other call is left as it is.
"""
from __future__ import annotations

import threading
from typing import Any, Callable, Optional

import mxnet as mx

from ._mx import is_symbol

_ARGS = ("data", "weight", "bias")


class _Tracing(threading.local):
    names: frozenset = frozenset()  # the frozen parameters of the block being traced


tracing = _Tracing()


def _arg(args: tuple, kwargs: dict, i: int) -> Any:
    return args[i] if i < len(args) else kwargs.get(_ARGS[i])


def _is_frozen_weight(weight: Any, bias: Any) -> bool:
    if is_symbol(weight):
        return weight.name in tracing.names and bias.name not in tracing.names
    return (isinstance(weight, mx.nd.NDArray) and isinstance(bias, mx.nd.NDArray)
            and weight.grad is None and bias.grad is not None)


def needs_split(op: str, args: tuple, kwargs: dict) -> bool:
    """True for a ``FullyConnected`` call whose weight is frozen while its bias trains
    (judged on the caller's arguments, before any cast)."""
    if op != "FullyConnected" or kwargs.get("no_bias") in (True, "True", "true", 1):
        return False
    weight, bias = _arg(args, kwargs, 1), _arg(args, kwargs, 2)
    if weight is None or bias is None:
        return False
    if is_symbol(weight) and kwargs.get("flatten", True) in (False, "False", "false", 0):
        return False  # the output's rank is unknown while tracing: left as it is
    return _is_frozen_weight(weight, bias)


def split_bias(fn: Callable, args: tuple, kwargs: dict) -> Any:
    """``fn`` (a FullyConnected) without its bias, plus the bias by ``broadcast_add``."""
    data, weight, bias = (_arg(args, kwargs, i) for i in range(3))
    rest = {k: v for k, v in kwargs.items() if k not in _ARGS}
    out = fn(data, weight, None, **{**rest, "no_bias": True})
    F = mx.sym if is_symbol(out) else mx.nd
    shape: Optional[tuple] = (1, -1) if is_symbol(out) else (1,) * (out.ndim - 1) + (-1,)
    return F.broadcast_add(out, F.reshape(bias, shape=shape))
