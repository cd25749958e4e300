"""``init`` / ``reset``: cast wrappers around MXNet's op functions, and their removal.

Every Python function that dispatches to an op the policy does not leave to
``follow`` is replaced, wherever MXNet binds it (``mx.nd``, ``mx.sym`` and
their ``op``/``_internal``/``contrib``/``linalg`` modules, and ``mx.np``,
``mx.npx``, ``mx.nd.np``, ``mx.sym.np``... including the module globals the
ndarray operators such as ``a @ b`` go through). A wrapper asks
``amp_adapters.plan_op`` how the op runs, given its input dtypes and slot
names, its attributes and the ops that have a low-precision kernel on the
current device, and applies exactly what the plan says: casts, a runtime
``amp_multicast`` for a promote op with traced inputs, emulation round trips.
It decides once per call signature (the argument dtypes, the device type when
kernels take part, the attribute values the policy reads, and, when the policy has
layer rules, the Gluon blocks being called: ``Policy.layers`` matches an imperative or
traced op call by their paths from the model's root, e.g. ``2``, and their names, e.g.
``dense2``): a repeated call
costs a dict lookup plus the casts it needs. Imperative calls see real dtypes;
while a HybridBlock is traced only parameters declare theirs, and a traced
value of unknown dtype gets the plan's cast-if-needed (``amp_cast`` is free at
run time when the dtype already matches). A parameter is cast once per traced
graph however many ops use it (the cache lives for that one trace).

Wrappers add no host sync; the first call of an op on a device type may
probe its kernel once, forward and backward: ``init`` is for training (see ``kernels``).
"""
from __future__ import annotations

import functools
import inspect
import json
import logging
import sys
import threading
import warnings
import weakref
from typing import Any, Callable, Optional

import numpy as np
import mxnet as mx
from mxnet import base

from amp_adapters import (UNKNOWN, AmpConfigError, OpCall, OpDecision, Policy, ShapeClass,
                          attrs_read, effective_lists, plan_op)
from amp_adapters.rules.oplists import load_table, native_lists
from amp_adapters.rules.dtypes import AMP_DTYPES

from ._mx import (_local, bypassed, declared, call_unpatched, cast, fc_needs_split, fc_split_bias,
                  frozen_params, is_symbol, is_tensor, multicast_widest, symbol_shape,
                  dtype_name, tensor_dtype, unknown_dims, unpatched)
from .active import active_policy, forget_layer_names, note_layer_names, set_policy
from .layer_paths import block_layers, block_names, node_instance, tree_paths
from .config import init_policy
from . import copies, stepcasts, traced
from .traced import traced_shapes
from .kernels import forget_fallback_logs, log_fallback
from .speed import forget_speed_books, note_native_speed, profile
from .scaling import forget_loss_output_trainer, loss_output_scale

logger = logging.getLogger("mxnet_amp")
_MODULES = ("mxnet.ndarray", "mxnet.symbol", "mxnet.numpy", "mxnet.numpy_extension")
_NP_ALIASES = {"_npi_true_divide": ("true_divide", "divide")}

_patches: list[tuple[Any, str, Callable]] = []  # (module, attribute, original)
# (id(parameter variable), how) -> (variable, its cast): a traced weight is cast once, not per use
# (outside a Gluon trace, which has its own; see ``_traced_graph``; arrays: ``stepcasts``)
_param_casts: dict[tuple[int, str], tuple[Any, Any]] = {}


def init(target_dtype: object = "float16", target_precision_ops: Optional[list] = None,
         conditional_fp32_ops: Optional[list] = None, fp32_ops: Optional[list] = None, *,
         policy: Any = None, emulate: bool = False) -> Policy:
    """Turn AMP on: patch the ops of ``mx.nd``, ``mx.sym``, ``mx.np`` and ``mx.npx``.

    Same arguments as ``mxnet.contrib.amp.init``; as natively each list given
    replaces the default list it names (``target_precision_ops`` -> lower,
    ``fp32_ops`` -> fp32, ``conditional_fp32_ops`` -> (op, attr, values) rules),
    the others keep their defaults, and an op listed wins over a default list not
    passed. Unknown names and names in two lists raise before anything is
    patched, and ``policy=`` (a Policy, preset name or TOML path) wins over
    ``target_dtype``. ``emulate=True`` rounds through float16 where the device
    has no float16 kernel. Call before the model is hybridized/traced.
    Calling it again with the same policy is a no-op; with another policy it
    raises (call ``reset()`` first). Returns the policy in force.
    """
    resolved = init_policy(target_dtype, target_precision_ops, conditional_fp32_ops, fp32_ops,
                              policy=policy, emulate=emulate)
    current = active_policy()
    if current is not None:
        if resolved == current:
            return current
        raise AmpConfigError("mxnet_amp.init was already called with a different policy "
                             f"(dtype={current.dtype}, emulate={current.emulate}); call "
                             "mxnet_amp.reset() first to change it")
    targets = _targets(resolved)
    for fn, places in targets.items():
        wrapper = _wrap(resolved, places[0][2], fn)
        for module, attr, _op in places:
            _patches.append((module, attr, fn))
            setattr(module, attr, wrapper)
    _wrap_loss_outputs(resolved)
    # a low array copied to float32 is one cast into the copy's `out` (copies.py): outermost,
    # over the policy's wrapper where it lists _copyto (the native's lists: float32)
    _patches.extend(copies.install(_bindings().get(id(mx.nd._internal._copyto), [])))
    if resolved.layer_patterns("mxnet"):  # layer rules: ops must know the block calling them
        block = mx.gluon.Block
        _patches.append((block, "__call__", block.__call__))
        block.__call__ = _named_call(block.__call__)
    _patches.extend(stepcasts.install())  # imperative: a weight cast once per forward
    hybrid = mx.gluon.HybridBlock
    _patches.append((hybrid, "_get_graph", hybrid._get_graph))
    hybrid._get_graph = _traced_graph(hybrid._get_graph)
    _patches.append((hybrid, "_call_cached_op", hybrid._call_cached_op))
    hybrid._call_cached_op = _retraced_on_new_dtypes(hybrid._call_cached_op)
    set_policy(resolved)
    if policy is None:  # the native's decisions: say if they are slower than float32 here
        note_native_speed(resolved, training=True)
    if resolved.enabled:  # under O0 a graph traced before init is the graph O0 gives
        traced.remember_traced_before_init()
    _patches.extend(traced.record_tracing())
    return resolved


def reset() -> None:
    """Undo ``init`` completely: every patched function is restored, the policy dropped,
    and blocks traced under ``init`` trace again, in float32, on their next forward."""
    traced.restore_float32()
    while _patches:
        module, attr, original = _patches.pop()
        setattr(module, attr, original)
    set_policy(None)
    _param_casts.clear()
    stepcasts.forget()
    forget_fallback_logs()
    forget_speed_books()
    forget_loss_output_trainer()
    _warned_loss_outputs.clear()
    forget_layer_names()
    _trees.clear()


def _wrap_loss_outputs(policy: Policy) -> None:
    """The native's loss-output functions (``SoftmaxOutput``, ``*RegressionOutput``) make their
    gradient themselves, ignoring the head gradient ``scale_loss`` scales. Called on arrays,
    their ``grad_scale`` is multiplied by the loss scale (``scaling.loss_output_scale``; the
    trainer divides it out again), as natively; in a symbol (a symbolic or hybridized
    model) it cannot be, and a warning says so once per function, as natively (each call)."""
    if not policy.enabled:  # O0: float32, nothing scaled
        return
    for name in native_lists("mxnet", policy.dtype).loss_output:
        for module, arrays in ((mx.nd, True), (mx.nd.op, True), (mx.sym, False),
                               (mx.sym.op, False)):
            fn = getattr(module, name, None)
            if fn is not None:
                _patches.append((module, name, fn))
                setattr(module, name, (_scaled_loss_output if arrays else _warned)(fn))


def _scaled_loss_output(fn: Callable) -> Callable:
    @functools.wraps(fn)
    def scaled(*args: Any, **kwargs: Any) -> Any:
        if not bypassed():
            kwargs["grad_scale"] = kwargs.get("grad_scale", 1.0) * loss_output_scale()
        return fn(*args, **kwargs)
    return scaled


_warned_loss_outputs: set[str] = set()


def _warned(fn: Callable) -> Callable:
    @functools.wraps(fn)
    def warned(*args: Any, **kwargs: Any) -> Any:
        if fn.__name__ not in _warned_loss_outputs and not bypassed():
            _warned_loss_outputs.add(fn.__name__)
            logger.warning("%s does not support dynamic loss scaling in symbolic and "
                           "hybridized execution (its grad_scale is not multiplied by the "
                           "loss scale)", fn.__name__)
        return fn(*args, **kwargs)
    return warned


def _ops_to_wrap(policy: Policy) -> set[str]:
    lists = effective_lists(policy, "mxnet")
    names = set(lists["lower"]) | set(lists["fp32"]) | set(lists["promote"])
    names |= set(load_table("mxnet").conditional)
    names |= {rule[0] for rule in policy.mxnet_ops.conditional_fp32}
    return names


def _bindings() -> dict[int, list[tuple[Any, str]]]:
    """{id(function): [(module, attribute)]} over MXNet's op-carrying modules."""
    out: dict[int, list[tuple[Any, str]]] = {}
    for name, module in list(sys.modules.items()):
        if module is None or not name.startswith(_MODULES):
            continue
        for attr, value in list(vars(module).items()):
            if inspect.isfunction(value):
                out.setdefault(id(value), []).append((module, attr))
    return out


def _roots(op: str) -> list[Callable]:
    """The functions that dispatch to ``op``: legacy ones, and mx.np/npx ones."""
    found = []
    if op.startswith(("_np_", "_npi_", "_npx_")):
        short = op.split("_", 2)[2]
        pkgs = ((mx.numpy_extension, mx.nd.numpy_extension, mx.sym.numpy_extension)
                if op.startswith("_npx_") else (mx.numpy, mx.nd.numpy, mx.sym.numpy))
        for pkg in pkgs:
            for attr in _NP_ALIASES.get(op, (short,)):
                found.append(getattr(pkg, attr, None))
    for module in (mx.ndarray, mx.symbol):
        prefix = base._get_op_name_prefix(op)
        if prefix and (prefix != "_random_" or op.endswith("_like")):
            found.append(getattr(getattr(module, prefix[1:-1]), op[len(prefix):], None))
        found.append(getattr(module._internal if op.startswith("_") else module, op, None))
    return [f for f in found if inspect.isfunction(f)]


def _targets(policy: Policy) -> dict[Callable, list[tuple[Any, str, str]]]:
    index = _bindings()
    targets: dict[Callable, list[tuple[Any, str, str]]] = {}
    for op in sorted(_ops_to_wrap(policy)):
        for fn in _roots(op):
            targets.setdefault(fn, [(m, a, op) for m, a in index.get(id(fn), [])])
    return {fn: places for fn, places in targets.items() if places}


_ND, _SYM = mx.nd.NDArray, mx.sym.Symbol  # legacy and numpy flavours subclass these
_TENSORS = (_ND, _SYM)
_MEMO_LIMIT = 4096  # distinct call signatures per op kept; beyond, the memo starts over


def _find(args: tuple, kwargs: dict) -> list[tuple[Any, Optional[int], Any]]:
    """(argument index or keyword, list index or None, tensor) of every tensor argument,
    one level into lists and tuples."""
    found = []
    for i, a in enumerate(args):
        if isinstance(a, _TENSORS):
            found.append((i, None, a))
        elif isinstance(a, (list, tuple)):
            found.extend((i, j, x) for j, x in enumerate(a) if isinstance(x, _TENSORS))
    for k, v in kwargs.items():
        if k != "out" and isinstance(v, _TENSORS):
            found.append((k, None, v))
    return found


def _signature(args: tuple, kwargs: dict) -> Optional[tuple]:
    """The dtype of every tensor argument, by position (False: not a tensor; an unknown
    traced dtype is UNKNOWN), one level into lists; None if there is no tensor at all."""
    key = []
    any_tensor = False
    for a in args:
        if isinstance(a, _ND):
            key.append(a.dtype)
            any_tensor = True
        elif isinstance(a, _SYM):
            key.append(tensor_dtype(a) or UNKNOWN)
            any_tensor = True
        elif isinstance(a, (list, tuple)):
            inner = tuple(x.dtype if isinstance(x, _ND) else
                          (tensor_dtype(x) or UNKNOWN) if isinstance(x, _SYM) else False
                          for x in a)
            any_tensor = any_tensor or any(t is not False for t in inner)
            key.append(inner)
        else:
            key.append(False)
    if kwargs:
        for k, v in kwargs.items():
            if k != "out" and isinstance(v, _TENSORS):
                key.append((k, v.dtype if isinstance(v, _ND) else tensor_dtype(v) or UNKNOWN))
                any_tensor = True
    return tuple(key) if any_tensor else None


class _Blocks(threading.local):
    names: tuple[str, ...] = ()  # the Gluon blocks being called, innermost first: name, path
    paths: Optional[dict] = None  # {id(block): path} of the tree of the root being called


_blocks = _Blocks()
# root block -> {id(block): its path} of its tree, computed at its first call under init
_trees: "weakref.WeakKeyDictionary[Any, dict]" = weakref.WeakKeyDictionary()


def _named_call(call: Callable) -> Callable:
    """``Block.__call__`` that keeps the blocks being called, innermost first, while it runs:
    each one's path from the root (the outermost block being called: ``2``) and its
    ``block.name`` (``dense2``), the instance names an op call has for the policy's layer
    rules (``Policy.layers``), in imperative calls and in a hybridized block's trace
    alike. A root's tree is walked once (its paths; also noted as the model's layer names,
    which ``check_layers`` matches the rules against). Installed only when the policy has
    layer rules; a tuple push and pop per block call."""
    @functools.wraps(call)
    def called(block: Any, *args: Any) -> Any:
        outer, outer_paths = _blocks.names, _blocks.paths
        if outer_paths is None:  # a root: the model (or the loss) being called
            paths = _trees.get(block)
            if paths is None:
                paths = _trees[block] = tree_paths(block)
                note_layer_names(block_names(block))
                note_layer_names(paths.values())
            _blocks.paths = paths
        path = _blocks.paths.get(id(block))
        _blocks.names = (block.name, path, *outer) if path else (block.name, *outer)
        try:
            return call(block, *args)
        finally:
            _blocks.names, _blocks.paths = outer, outer_paths
    called.__amp_original__ = call  # type: ignore[attr-defined]
    return called


def _wrap(policy: Policy, op: str, fn: Callable) -> Callable:
    """A cast wrapper for ``fn`` (which dispatches to ``op``) under ``policy``.

    The decision is memoized per call signature: (tensor positions, their
    dtypes, device type, the attribute values the policy reads), so a repeated
    call costs a dict lookup plus the casts the plan asks for. The memo lives
    in this wrapper: ``reset()``/``init()`` drop it with the wrapper.
    """
    try:
        arg_names = list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        arg_names = []
    read = tuple((a, arg_names.index(a) if a in arg_names else None)
                 for a in attrs_read(policy, "mxnet", op))
    # a generated legacy op function dispatches straight to the engine, calling no other
    # (patched) Python op, so it needs no bypass around it; mx.np functions do call others
    direct = getattr(getattr(fn, "__code__", None), "co_filename", "") == "<string>"
    memo: dict[tuple, Any] = {}  # key -> (decision, act?), or {device type id: that}
    measured = policy.speed == "measured" and policy.enabled
    layered = bool(policy.layer_patterns("mxnet"))  # the calling blocks take part (_blocks)

    def decide(key: tuple, args: tuple, kwargs: dict,
               shape: Optional[ShapeClass] = None) -> tuple[OpDecision, bool]:
        found = _find(args, kwargs)
        first = found[0][2]
        ctx = mx.context.current_context() if is_symbol(first) else first.context
        entry = memo.get(key)
        if type(entry) is dict and ctx.device_typeid in entry:
            return entry[ctx.device_typeid]
        names = [arg_names[i] if isinstance(i, int) and i < len(arg_names) else
                 (i if isinstance(i, str) else "") for i, _, _ in found]
        dtypes = [UNKNOWN if dt is None else dt for dt in (tensor_dtype(x) for _, _, x in found)]
        attrs = {k: v for k, v in kwargs.items() if not isinstance(v, _TENSORS)}
        attrs.update((name, a) for name, a in zip(arg_names, args)  # attributes by position
                     if not isinstance(a, (_TENSORS, list, tuple)))
        device = profile(policy, ctx, True)
        d = plan_op(policy, "mxnet", OpCall(
            op, dtypes, shape=shape, attrs=attrs, input_names=names,
            instance=_blocks.names if layered else None), device=device)
        if d.emulated or d.fell_back:
            log_fallback(op, ctx, d)
        if len(memo) >= _MEMO_LIMIT:
            memo.clear()
        value = (d, d.needs_action)
        if d.device_dependent:
            memo.setdefault(key, {})[ctx.device_typeid] = value
        else:
            memo[key] = value
        return value

    @functools.wraps(fn)
    def amp_wrapper(*args: Any, **kwargs: Any) -> Any:
        if _local.bypass:
            return fn(*args, **kwargs)
        key = _signature(args, kwargs)
        if key is None:  # no tensor argument
            return fn(*args, **kwargs)
        if read:
            key = (key, *[str(kwargs[a]) if a in kwargs else
                          str(args[p]) if p is not None and p < len(args) else None
                          for a, p in read])
        shape = None
        if measured:  # measured speed depends on the operands' shape class: part of the key
            shape = shape_class(_find(args, kwargs),
                                lambda: call_unpatched(fn, args, kwargs))
            key = (key, shape.key)
        if layered:
            key = (key, _blocks.names)
        entry = memo.get(key)
        if entry is None or type(entry) is dict:
            entry = decide(key, args, kwargs, shape)  # a miss, or a decision made per device
        d, act = entry
        run = functools.partial(fc_split_bias, fn) if fc_needs_split(op, args, kwargs) \
            else None  # MXNet's FC backward skips the bias of a frozen weight: see _mx.py
        if not act:
            if run is not None:
                with unpatched():
                    return run(args, kwargs)
            return fn(*args, **kwargs) if direct else call_unpatched(fn, args, kwargs)
        with unpatched():
            args, kwargs = _apply(d, _find(args, kwargs), args, kwargs)
            out = run(args, kwargs) if run is not None else fn(*args, **kwargs)
            return _round_outputs(d, out) if d.round_outputs else out

    amp_wrapper.__amp_original__ = fn  # type: ignore[attr-defined]
    return amp_wrapper


_FLOAT_KINDS = ("f", "V")  # numpy kinds of float16/32/64 and of MXNet's bfloat16


def shape_class(found: list, op_symbol: Optional[Callable[[], Any]] = None) -> ShapeClass:
    """The shape class of an op's floating operands (``_find``'s tensors, in order): an
    array's shape; a traced symbol's from the shapes of the block's inputs in this trace
    (``_trace.shapes``), unknown dimensions None. A parameter whose shape waits for its
    first use (a ``Dense`` without ``in_units``: ``(1024, 0)``) is inferred through the op
    itself (``op_symbol``: the op built on the same symbols, unpatched, never run). No
    result rank: MXNet has no rule that reads it, and a plan of the same op in a graph
    (``graph.py``) keys the same way."""
    operands = []  # (tensor, its shape)
    for _, _, x in found:
        if isinstance(x, _ND):
            if np.dtype(x.dtype).kind in _FLOAT_KINDS:
                operands.append((x, x.shape))
        elif tensor_dtype(x) in (None, *AMP_DTYPES, "float64"):
            operands.append((x, symbol_shape(x, _trace.shapes or {})))
    if op_symbol is not None and any(s is None or None in s for _, s in operands):
        operands = _through_op(operands, op_symbol)
    return ShapeClass.of([s for _, s in operands])


def _through_op(operands: list, op_symbol: Callable[[], Any]) -> list:
    """``operands`` with the unknown shapes of variable operands inferred from the op's own
    shape rule (partial inference of the op's symbol from the trace's known inputs)."""
    try:
        out = op_symbol()
        names = out.list_arguments()
        known = {k: v for k, v in (_trace.shapes or {}).items() if k in names}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            arg_shapes, _, _ = out.infer_shape_partial(**known)
    except (mx.base.MXNetError, TypeError, ValueError, AttributeError):
        return operands
    inferred = dict(zip(names, (unknown_dims(s) for s in arg_shapes or ())))
    return [(x, inferred.get(x.name, s)) if is_symbol(x) and (s is None or None in s)
            and x.list_arguments() == [x.name] else (x, s) for x, s in operands]


def _apply(d: OpDecision, found: list, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """The arguments with the plan's casts and roundings applied (inputs are not mutated)."""
    values = [x for _, _, x in found]
    if d.multicast:
        live = [n for n, dt in enumerate(d.input_dtypes) if dt in AMP_DTYPES or dt == UNKNOWN]
        for n, y in zip(live, multicast_widest([values[n] for n in live])):
            values[n] = y
    else:
        for n, (x, target, rnd) in enumerate(zip(values, d.casts, d.round_inputs)):
            known = d.input_dtypes[n] if d.input_dtypes[n] != UNKNOWN else None
            if rnd:
                values[n] = _param_cast(x, f"{d.low_dtype}->float32", known,
                                        lambda v: cast(cast(v, d.low_dtype), "float32"))
            elif target is not None and not (known is None and target == "float32"
                                             and _inferred_float32(x)):
                values[n] = _param_cast(x, target, known, lambda v, t=target: cast(v, t))
    new_args = [list(a) if isinstance(a, (list, tuple)) else a for a in args]
    kwargs = dict(kwargs)
    for (i, j, _), v in zip(found, values):
        if isinstance(i, str):
            kwargs[i] = v
        elif j is None:
            new_args[i] = v
        else:
            new_args[i][j] = v
    return tuple(type(a)(b) if isinstance(a, tuple) else b
                 for a, b in zip(args, new_args)), kwargs


def _param_cast(x: Any, how: str, known: Optional[str], make: Callable[[Any], Any]) -> Any:
    """``make(x)``, shared by every use of ``x`` when it is a traced parameter (a variable
    with a declared dtype), so a weight used by several ops is cast once per graph. The
    cache belongs to the graph being traced (``traced_graph``); outside a Gluon trace
    (symbols built by hand) it lives until ``reset()``. In a traced graph a value's
    rounding (emulation) is shared too, whatever the value. An array: once per imperative
    forward when it is a parameter's, or a value of the graph autograd records (``stepcasts``:
    MXNet refuses to write those in place; an NDArray has no version counter, so any other
    array is cast per reader)."""
    if not is_symbol(x):
        return stepcasts.cast_once(x, how, make)
    rounding = how.endswith("->float32")
    if known is None and not (rounding and _trace.casts is not None):
        return make(x)
    # in a traced graph a value is immutable: its rounding (emulation) is shared by every
    # op that reads it, activations too (one float32 copy per value, not one per reader)
    casts = _trace.casts if _trace.casts is not None else _param_casts
    key = (id(x), how)
    if key not in casts:
        casts[key] = (x, make(x))  # holding x keeps its id unique
    return casts[key][1]


class _Trace(threading.local):
    casts: Optional[dict] = None  # the parameter casts of the graph being traced, if any
    shapes: Optional[dict] = None  # {input variable: shape} of the graph being traced
    dtypes: Optional[dict] = None  # {input variable: dtype} of the graph being traced
    inferred: Optional[dict] = None  # id(value) -> (value, is it float32) in this trace


# block -> the dtypes of the arrays it was traced with (``_retraced_on_new_dtypes``)
_traced_dtypes: "weakref.WeakKeyDictionary[Any, tuple]" = weakref.WeakKeyDictionary()


def _inferred_float32(x: Any) -> bool:
    """A traced value that type inference, from the dtypes of the arrays the block is traced
    with and the parameters' declared ones, says is float32: a cast-if-needed to float32 in
    front of it is an identity, and not free: MXNet copies a graph input through it and
    plans its buffers around it (a CNN's peak 1.07x of fp32's under a policy that lowers
    nothing). Its graph is traced again if the block is called with other dtypes."""
    if not is_symbol(x) or _trace.dtypes is None or _trace.inferred is None:
        return False
    hit = _trace.inferred.get(id(x))
    if hit is None:
        try:
            names = x.list_arguments()
            typed = declared(x, {n: d for n, d in _trace.dtypes.items() if n in names})
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                _, out, _ = typed.infer_type_partial()
            f32 = bool(out) and out[0] is not None and np.dtype(out[0]) == np.float32
        except (mx.base.MXNetError, TypeError, ValueError, AttributeError):
            f32 = False
        hit = _trace.inferred[id(x)] = (x, f32)  # holding x keeps its id unique
    return hit[1]


def _array_dtypes(args: tuple) -> tuple:
    from mxnet.gluon.block import _flatten
    return tuple(str(a.dtype) if isinstance(a, _ND) else None
                 for a in _flatten(args, "input")[0])


def _retraced_on_new_dtypes(call_cached: Callable) -> Callable:
    """``HybridBlock._call_cached_op`` that traces the block again when it is called with
    arrays of other dtypes than its graph was traced with: the graph leaves out the casts
    to float32 that its traced dtypes made identities (``_inferred_float32``)."""
    @functools.wraps(call_cached)
    def call(block: Any, *args: Any) -> Any:
        traced = _traced_dtypes.get(block)
        if traced is not None and block._cached_op is not None and \
                traced != _array_dtypes(args):
            block._clear_cached_op()
        return call_cached(block, *args)
    call.__amp_original__ = call_cached  # type: ignore[attr-defined]
    return call


_trace = _Trace()


def _traced_graph(get_graph: Callable) -> Callable:
    """``HybridBlock._get_graph`` with a parameter-cast cache for the one graph it traces;
    after the trace, one log line about the model: how many ops run in the low dtype, how
    many stay float32 and why (from its cast report, ``report.summarize_block``)."""
    @functools.wraps(get_graph)
    def traced(block: Any, *args: Any) -> Any:
        if block._cached_graph or _trace.casts is not None:
            return get_graph(block, *args)
        _trace.casts, _trace.inferred = {}, {}
        _trace.shapes = traced_shapes[block] = _input_shapes(args)
        _trace.dtypes = _input_dtypes(args)
        _traced_dtypes[block] = _array_dtypes(args)
        frozen_params.names = frozenset(p.name for p in block.collect_params().values()
                                        if p.grad_req == "null")
        try:
            out = get_graph(block, *args)
            out = _plan_with_readers(block, out, args)
        finally:
            _trace.casts = _trace.shapes = _trace.dtypes = _trace.inferred = None
            frozen_params.names = frozenset()
        from .report import summarize_block  # report imports this module
        summarize_block(block)
        _note_layers(block)
        return out
    traced.__amp_original__ = get_graph  # type: ignore[attr-defined]
    return traced


def _plan_with_readers(block: Any, graph: tuple, args: tuple) -> tuple:
    """O2: the traced graph, rewritten where an op between float32 neighbours follows them
    (``graph.with_lone_ops_following``: the op wrappers planned it before its readers
    existed); the block's cached graph is what its ``CachedOp`` is built from."""
    policy = active_policy()
    if policy is None or policy.level != "O2" or not policy.enabled:
        return graph
    from .graph import with_lone_ops_following  # graph imports this module's helpers
    from .report import block_context
    inputs, sym = graph
    from mxnet.gluon.block import _flatten
    flat = [a for a in _flatten(args, "input")[0] if a is not None]
    known = {i.name: (tensor_dtype(a) or "float32") for i, a in zip(inputs, flat)}
    params = block.collect_params()
    known.update({name: dtype_name(p.dtype) for name, p in params.items()})
    try:
        layers = block_layers(block, paths=_blocks.paths) \
            if policy.layer_patterns("mxnet") else None  # the names the op calls had
        new = with_lone_ops_following(
            sym, known, policy, block_context(block), frozenset(params.keys()),
            traced_shapes.get(block),
            None if layers is None else functools.partial(node_instance, layers=layers))
    except (mx.base.MXNetError, KeyError, ValueError, TypeError) as e:
        # a graph the rewrite cannot plan keeps the trace (each op as it was called)
        logger.info("mxnet_amp: block %s: traced graph kept as traced (%s: %s)", block.name,
                    type(e).__name__, e)
        return graph
    if new is None:
        return graph
    block._cached_graph = (inputs, new)
    return block._cached_graph


def _input_shapes(args: tuple) -> dict:
    """{variable name: shape} of a block's array arguments, named as ``HybridBlock._get_graph``
    names its input variables (``data``, or ``data0``, ``data1``... for several)."""
    from mxnet.gluon.block import _flatten
    flat = [a for a in _flatten(args, "input")[0] if a is not None]
    names = ["data"] if len(flat) == 1 else [f"data{i}" for i in range(len(flat))]
    return {n: a.shape for n, a in zip(names, flat) if isinstance(a, _ND)}


def _input_dtypes(args: tuple) -> dict:
    """{variable name: dtype} of a block's array arguments (named as ``_input_shapes``)."""
    from mxnet.gluon.block import _flatten
    flat = [a for a in _flatten(args, "input")[0] if a is not None]
    names = ["data"] if len(flat) == 1 else [f"data{i}" for i in range(len(flat))]
    return {n: dtype_name(a.dtype) for n, a in zip(names, flat) if isinstance(a, _ND)}


def _note_layers(block: Any) -> None:
    """After a trace under a policy with layer rules: the node names of its graph (and its
    blocks' names and paths) join the names ``check_layers`` matches the rules against."""
    policy = active_policy()
    if policy is None or not policy.layer_patterns("mxnet") or not block._cached_graph:
        return
    note_layer_names(block_names(block))
    note_layer_names(n["name"] for n in json.loads(block._cached_graph[1].tojson())["nodes"]
                     if n["op"] != "null")


def _round_outputs(d: OpDecision, out: Any) -> Any:
    """Round the floating outputs of an emulated op through its low dtype."""
    def rnd(x: Any) -> Any:
        if not is_tensor(x) or (not is_symbol(x) and tensor_dtype(x) not in AMP_DTYPES):
            return x
        return cast(cast(x, d.low_dtype), "float32")
    if isinstance(out, (list, tuple)):
        return type(out)(rnd(o) for o in out)
    if is_symbol(out) and len(out.list_outputs()) > 1:
        return mx.sym.Group([rnd(out[i]) for i in range(len(out.list_outputs()))])
    return rnd(out)
