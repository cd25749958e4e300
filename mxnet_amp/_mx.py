"""Thin MXNet glue shared by the backend: the op registry, dtype names and casts.

Every helper here translates, none decides: precision decisions come from
``amp_adapters.plan_op``. The cast helpers capture MXNet's own ``amp_cast`` /
``amp_multicast`` at import time, so they keep working while ops are patched. At the
end: the workaround of MXNet 1.9.1's FullyConnected that drops the bias gradient of a
frozen weight (``fc_needs_split``/``fc_split_bias``, called by the op wrappers).
"""
from __future__ import annotations

import contextlib
import ctypes
import functools
import inspect
import json
import threading
import warnings
from typing import Any, Callable, Mapping, Optional

import numpy as np
import mxnet as mx
from mxnet import ndarray as nd
from mxnet import symbol as sym
from mxnet.base import _LIB, check_call, py_str
from mxnet.ndarray.ndarray import _DTYPE_MX_TO_NP, _DTYPE_NP_TO_MX

from amp_adapters import dtype_name

_ND_AMP_CAST, _SYM_AMP_CAST = nd.amp_cast, sym.amp_cast
_SYM_AMP_MULTICAST = sym.amp_multicast
_BF16 = np.dtype([("bfloat16", np.uint16)])  # how MXNet 1.x spells bfloat16 in numpy


class _Local(threading.local):
    bypass = False  # inside ``unpatched``: patched ops call straight through


_local = _Local()


@contextlib.contextmanager
def unpatched():
    """Inside this block patched ops call straight through (probes, our own casts)."""
    prev = _local.bypass
    _local.bypass = True
    try:
        yield
    finally:
        _local.bypass = prev


def bypassed() -> bool:
    return _local.bypass


def call_unpatched(fn: Any, args: tuple, kwargs: dict) -> Any:
    """``fn(*args, **kwargs)`` with patched ops calling straight through (``unpatched``,
    without the context manager's cost: this is on every wrapped call)."""
    prev = _local.bypass
    _local.bypass = True
    try:
        return fn(*args, **kwargs)
    finally:
        _local.bypass = prev


@functools.lru_cache(maxsize=None)
def registry() -> frozenset[str]:
    """Every op name registered in this MXNet build (``MXListAllOpNames``)."""
    plist, size = ctypes.POINTER(ctypes.c_char_p)(), ctypes.c_uint()
    check_call(_LIB.MXListAllOpNames(ctypes.byref(size), ctypes.byref(plist)))
    return frozenset(py_str(plist[i]) for i in range(size.value))


def is_symbol(x: Any) -> bool:
    return isinstance(x, sym.Symbol)


def is_tensor(x: Any) -> bool:
    """An NDArray or Symbol, legacy or numpy flavour (np.ndarray and _Symbol subclass them)."""
    return isinstance(x, (nd.NDArray, sym.Symbol))


def tensor_dtype(x: Any) -> Optional[str]:
    """The dtype of an NDArray, or of a variable Symbol that declares one (Gluon parameters
    do); None for any other Symbol, whose dtype is known only after type inference."""
    if not is_symbol(x):
        return dtype_name(x.dtype)
    code = x.attr("__dtype__") if x.get_children() is None else None
    return dtype_name(_DTYPE_MX_TO_NP[int(code)]) if code not in (None, "-1") else None


def mx_dtype(dtype: str) -> Any:
    """``dtype`` as MXNet 1.x takes it: numpy names, and the structured dtype for bfloat16."""
    return _BF16 if dtype == "bfloat16" else dtype


def declared(sym: "sym.Symbol", dtypes: "dict[str, Optional[str]]") -> "sym.Symbol":
    """A copy of ``sym`` whose variables named in ``dtypes`` declare that dtype (``__dtype__``).

    Type inference then starts from them. MXNet 1.9.1's ``infer_type(_partial)`` silently
    drops a bfloat16 given as a keyword argument, while a declared one holds.
    """
    graph = json.loads(sym.tojson(remove_amp_cast=False))
    for node in graph["nodes"]:
        want = dtypes.get(node["name"]) if node["op"] == "null" else None
        if want is not None:
            code = _DTYPE_NP_TO_MX[_BF16] if want == "bfloat16" else \
                _DTYPE_NP_TO_MX[np.dtype(want).type]
            node.setdefault("attrs", {})["__dtype__"] = str(code)
    return mx.sym.load_json(json.dumps(graph))


def symbol_shape(x: Any, known: Mapping[str, tuple]) -> Optional[tuple]:
    """The shape of a single-output symbol by MXNet's partial shape inference from the
    ``known`` shapes of its variables (an unknown dimension is None; None if its rank is
    unknown). No host sync: inference runs on the graph."""
    if len(x.list_outputs()) != 1:
        return None
    args = x.list_arguments()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _, out, _ = x.infer_shape_partial(**{k: v for k, v in known.items() if k in args})
    except mx.base.MXNetError:
        return None
    return unknown_dims(out[0] if out else None)


def unknown_dims(shape: Optional[tuple]) -> Optional[tuple]:
    """An inferred shape with MXNet's unknowns (0 in legacy shape mode, -1 in numpy mode) as
    None; None for an unknown rank (None, or a legacy empty shape)."""
    if shape is None or (len(shape) == 0 and not mx.util.is_np_shape()):
        return None
    legacy = not mx.util.is_np_shape()
    return tuple(None if d is None or d < 0 or (legacy and d == 0) else int(d) for d in shape)


def graph_shapes(sym: "sym.Symbol", known: Mapping[str, tuple]) -> dict[str, Optional[tuple]]:
    """{entry: shape} for every entry of ``sym`` (variables and op outputs, named as
    ``get_internals().list_outputs()``), by partial shape inference from the ``known``
    shapes of its variables (and the shapes variables declare); unknown dimensions None.
    Empty if inference fails. No host sync."""
    internals = sym.get_internals()
    args = set(sym.list_arguments())
    given = {**_ranks_of_inputs(sym, set(known)), **{k: v for k, v in known.items() if k in args}}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _, out, _ = internals.infer_shape_partial(**given)
    except mx.base.MXNetError:
        return {}
    return {e: unknown_dims(s) for e, s in zip(internals.list_outputs(), out or ())}


_CONVS = ("Convolution", "Deconvolution")


def _declared_shape(node: dict) -> Optional[tuple]:
    text = node.get("attrs", {}).get("__shape__")
    if node["op"] != "null" or not text:
        return None
    return tuple(int(d) for d in text.strip("()[] ").split(",") if d.strip())


def _ranks_of_inputs(sym: "sym.Symbol", known: set) -> dict[str, tuple]:
    """{input: shape with an unknown batch} for each input of unknown shape read as the data
    of a FullyConnected (``flatten``: (batch, in_units)) or a convolution ((batch, channels,
    unknown spatial sizes)) whose weight declares its shape (a Gluon parameter's
    ``__shape__``): MXNet's inference does not carry a weight's sizes back to its data."""
    nodes = json.loads(sym.tojson(remove_amp_cast=False))["nodes"]
    out: dict[str, tuple] = {}
    for n in nodes:
        if n["op"] not in ("FullyConnected", *_CONVS) or len(n["inputs"]) < 2:
            continue
        src, weight = nodes[n["inputs"][0][0]], _declared_shape(nodes[n["inputs"][1][0]])
        if src["op"] != "null" or src["name"] in known or _declared_shape(src) or \
                not weight or any(d <= 0 for d in weight):
            continue
        attrs = n.get("attrs", {})
        if n["op"] == "FullyConnected":
            if str(attrs.get("flatten", "True")) in ("True", "true", "1") and len(weight) == 2:
                out.setdefault(src["name"], (0, weight[1]))
        else:
            groups = int(attrs.get("num_group", 1))
            channels = weight[0] if n["op"] == "Deconvolution" else weight[1] * groups
            out.setdefault(src["name"], (0, channels) + (0,) * (len(weight) - 2))
    return out


def cast(x: Any, dtype: str, name: Optional[str] = None) -> Any:
    """``x`` cast to ``dtype``, differentiably (the gradient is cast back on the way down);
    a symbol's cast node is called ``name`` (default: MXNet's ``amp_castN``).

    Arrays and symbols get ``amp_cast`` (a no-op on integers and on values that
    already have ``dtype``; numpy-flavoured symbols go through a legacy view);
    numpy-flavoured arrays, which legacy ops refuse, use ``astype``.
    """
    if isinstance(x, mx.numpy.ndarray):
        return x.astype(dtype)
    mx_dtype = _BF16 if dtype == "bfloat16" else dtype
    named = {} if name is None else {"name": name}
    if isinstance(x, mx.symbol.numpy._Symbol):
        return _SYM_AMP_CAST(x.as_nd_ndarray(), dtype=mx_dtype, **named).as_np_ndarray()
    if is_symbol(x):
        return _SYM_AMP_CAST(x, dtype=mx_dtype, **named)
    return _ND_AMP_CAST(x, dtype=mx_dtype)


def multicast_widest(xs: list) -> list:
    """Symbols cast to the widest floating dtype among them, decided when the graph runs."""
    np_flavour = isinstance(xs[0], mx.symbol.numpy._Symbol)
    legacy = [x.as_nd_ndarray() if np_flavour else x for x in xs]
    out = _SYM_AMP_MULTICAST(*legacy, num_outputs=len(legacy))
    return [out[i].as_np_ndarray() if np_flavour else out[i] for i in range(len(xs))]


@functools.lru_cache(maxsize=None)
def input_names(op: str) -> tuple[str, ...]:
    """The names of a legacy op's inputs, in order (from its generated Python signature)."""
    fn = getattr(sym.op, op, None) or getattr(sym._internal, op, None)
    if fn is None:
        return ()
    return tuple(inspect.signature(fn).parameters)


# -- MXNet 1.9.1: FullyConnected with a frozen weight drops its bias gradient ----------
#
# ``FullyConnected`` with a frozen weight and a trained bias: the bias gradient, computed.
#
# MXNet 1.9.1's oneDNN ``FullyConnected`` backward on CPU computes the bias gradient
# together with the weight gradient, and skips both when the weight's gradient request is
# ``null`` (``grad_req='null'`` on a layer's weight while its bias trains, as in
# fine-tuning): the bias gradient array is never written. Natively it stays 0 (the bias
# silently never trains). Under AMP the bias reaches the op through a cast (a rounding
# through fp16 when emulated, a cast to bf16 for real bf16), whose gradient buffer is fresh
# and uninitialised: its garbage (often inf or NaN) flows into the bias gradient, the
# overflow check sees it, and clean steps are skipped while the scale falls.
#
# For that case only (a frozen weight, a bias that trains), the op runs without its bias
# and the bias is added by ``broadcast_add``, whose backward always writes the bias
# gradient. The forward value is the same sum. Every other call is left as it is.

_FC_ARGS = ("data", "weight", "bias")


class _FrozenTracing(threading.local):
    names: frozenset = frozenset()  # the frozen parameters of the block being traced


frozen_params = _FrozenTracing()


def _fc_arg(args: tuple, kwargs: dict, i: int) -> Any:
    return args[i] if i < len(args) else kwargs.get(_FC_ARGS[i])


def _is_frozen_weight(weight: Any, bias: Any) -> bool:
    if is_symbol(weight):
        return weight.name in frozen_params.names and bias.name not in frozen_params.names
    return (isinstance(weight, mx.nd.NDArray) and isinstance(bias, mx.nd.NDArray)
            and weight.grad is None and bias.grad is not None)


def fc_needs_split(op: str, args: tuple, kwargs: dict) -> bool:
    """True for a ``FullyConnected`` call whose weight is frozen while its bias trains
    (judged on the caller's arguments, before any cast)."""
    if op != "FullyConnected" or kwargs.get("no_bias") in (True, "True", "true", 1):
        return False
    weight, bias = _fc_arg(args, kwargs, 1), _fc_arg(args, kwargs, 2)
    if weight is None or bias is None:
        return False
    if is_symbol(weight) and kwargs.get("flatten", True) in (False, "False", "false", 0):
        return False  # the output's rank is unknown while tracing: left as it is
    return _is_frozen_weight(weight, bias)


def fc_split_bias(fn: Callable, args: tuple, kwargs: dict) -> Any:
    """``fn`` (a FullyConnected) without its bias, plus the bias by ``broadcast_add``."""
    data, weight, bias = (_fc_arg(args, kwargs, i) for i in range(3))
    rest = {k: v for k, v in kwargs.items() if k not in _FC_ARGS}
    out = fn(data, weight, None, **{**rest, "no_bias": True})
    F = mx.sym if is_symbol(out) else mx.nd
    shape: Optional[tuple] = (1, -1) if is_symbol(out) else (1,) * (out.ndim - 1) + (-1,)
    return F.broadcast_add(out, F.reshape(bias, shape=shape))
