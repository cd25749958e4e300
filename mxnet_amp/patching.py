"""``init`` / ``reset``: cast wrappers around MXNet's op functions, and their removal.

Every Python function that dispatches to an op the policy does not leave to
``follow`` is replaced, wherever MXNet binds it (``mx.nd``, ``mx.sym`` and
their ``op``/``_internal``/``contrib``/``linalg`` modules, and ``mx.np``,
``mx.npx``, ``mx.nd.np``, ``mx.sym.np``... including the module globals the
ndarray operators such as ``a @ b`` go through). A wrapper asks
``amp_adapters.plan_op`` how the op runs, given its input dtypes and the ops
that have a low-precision kernel on the current device, and inserts exactly
the casts the plan returns. Imperative calls see real dtypes. While a
HybridBlock is traced only parameters declare theirs, so a traced value of
unknown dtype gets an ``amp_cast`` in front of ``lower`` and ``fp32`` ops (free
at run time when the dtype already matches) and ``amp_multicast`` in front of
``promote`` ops (the widest input, decided at run time); a parameter is
cast once per graph, however many ops use it. ``emulated`` ops round their
floating inputs and outputs through the low dtype and compute in float32.

Wrappers add no host sync; the first call of an op on a device type may
probe its kernel once (see ``kernels``).
"""
from __future__ import annotations

import functools
import inspect
import sys
from typing import Any, Callable, Optional

import mxnet as mx
from mxnet import base

from amp_adapters import AmpConfigError, OpDecision, Policy, effective_lists, plan_op
from amp_adapters.oplists import load_table

from ._mx import (ROUNDED, bypassed, cast, is_symbol, is_tensor, multicast_widest, tensor_dtype,
                  unpatched)
from .config import resolve_policy
from . import traced
from .kernels import KernelSet, forget_fallback_logs, log_fallback

_MODULES = ("mxnet.ndarray", "mxnet.symbol", "mxnet.numpy", "mxnet.numpy_extension")
_NP_ALIASES = {"_npi_true_divide": ("true_divide", "divide")}

_policy: Optional[Policy] = None
_patches: list[tuple[Any, str, Callable]] = []  # (module, attribute, original)
# (id(parameter variable), how) -> (variable, its cast): a traced weight is cast once, not per use
_param_casts: dict[tuple[int, str], tuple[Any, Any]] = {}


def active_policy() -> Optional[Policy]:
    """The policy ``init`` installed, or None."""
    return _policy


def init(target_dtype: object = "float16", target_precision_ops: Optional[list] = None,
         conditional_fp32_ops: Optional[list] = None, fp32_ops: Optional[list] = None, *,
         policy: Any = None, emulate: bool = False) -> Policy:
    """Turn AMP on: patch the ops of ``mx.nd``, ``mx.sym``, ``mx.np`` and ``mx.npx``.

    Same arguments as ``mxnet.contrib.amp.init``, but the lists EXTEND the
    defaults (a listed op moves to that category: ``target_precision_ops`` ->
    lower, ``fp32_ops`` -> fp32, ``conditional_fp32_ops`` -> (op, attr, values)
    rules), unknown names and names in two lists raise before anything is
    patched, and ``policy=`` (a Policy, preset name or TOML path) wins over
    ``target_dtype``. ``emulate=True`` rounds through float16 where the device
    has no float16 kernel. Call before the model is hybridized/traced.
    Calling it again with the same policy is a no-op; with another policy it
    raises (call ``reset()`` first). Returns the policy in force.
    """
    global _policy
    resolved = resolve_policy(target_dtype, target_precision_ops, conditional_fp32_ops, fp32_ops,
                              policy=policy, emulate=emulate)
    if _policy is not None:
        if resolved == _policy:
            return _policy
        raise AmpConfigError("mxnet_amp.init was already called with a different policy "
                             f"(dtype={_policy.dtype}, emulate={_policy.emulate}); call "
                             "mxnet_amp.reset() first to change it")
    targets = _targets(resolved)
    for fn, places in targets.items():
        wrapper = _wrap(resolved, places[0][2], fn)
        for module, attr, _op in places:
            _patches.append((module, attr, fn))
            setattr(module, attr, wrapper)
    _policy = resolved
    traced.warn_traced_before_init()
    _patches.extend(traced.record_tracing())
    return resolved


def reset() -> None:
    """Undo ``init`` completely: every patched function is restored, the policy dropped,
    and blocks traced under ``init`` trace again, in float32, on their next forward."""
    global _policy
    traced.restore_float32()
    while _patches:
        module, attr, original = _patches.pop()
        setattr(module, attr, original)
    _policy = None
    _param_casts.clear()
    forget_fallback_logs()


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


def _slots(args: tuple, kwargs: dict, arg_names: list[str]) -> list[tuple[Any, Any, str]]:
    """(container, key, name) of every tensor argument, one level into lists."""
    out = []
    for i, a in enumerate(args):
        name = arg_names[i] if i < len(arg_names) else ""
        if is_tensor(a):
            out.append((args, i, name))
        elif isinstance(a, list):
            out.extend((a, j, name) for j, x in enumerate(a) if is_tensor(x))
    for k, v in kwargs.items():
        if k != "out" and is_tensor(v):
            out.append((kwargs, k, k))
    return out


def _wrap(policy: Policy, op: str, fn: Callable) -> Callable:
    keep_fp32 = set(load_table("mxnet").keep_fp32_inputs.get(op, ()))
    try:
        arg_names = list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        arg_names = []

    @functools.wraps(fn)
    def amp_wrapper(*args: Any, **kwargs: Any) -> Any:
        if bypassed():
            return fn(*args, **kwargs)
        args_l = [list(a) if isinstance(a, (list, tuple)) else a for a in args]
        slots = _slots(args_l, kwargs, arg_names)  # args_l is mutated through the slots
        if not slots:
            return fn(*args, **kwargs)
        tensors = [c[k] for c, k, _ in slots]
        symbolic = is_symbol(tensors[0])
        ctx = mx.context.current_context() if symbolic else tensors[0].context
        known = [tensor_dtype(t) for t in tensors]  # None: a traced value, dtype not known yet
        dtypes = [None if name in keep_fp32 else (k or "float32")
                  for (_, _, name), k in zip(slots, known)]
        attrs = {k: v for k, v in kwargs.items() if not is_tensor(v)}
        attrs.update((name, a) for name, a in zip(arg_names, args)  # attributes by position
                     if not is_tensor(a) and not isinstance(a, (list, tuple)))
        d = plan_op(policy, "mxnet", op, dtypes, lowp_kernels=KernelSet(ctx, policy.dtype),
                    attrs=attrs)
        if d.emulated or d.fell_back:
            log_fallback(op, ctx, d.reason)
        with unpatched():
            _cast_inputs(d, slots, dtypes, known)
            out = fn(*[type(a)(b) if isinstance(a, tuple) else b for a, b in zip(args, args_l)],
                     **kwargs)
            return _round_outputs(d, out) if d.emulated else out

    amp_wrapper.__amp_original__ = fn  # type: ignore[attr-defined]
    return amp_wrapper


def _cast_inputs(d: OpDecision, slots: list, dtypes: list, known: list) -> None:
    """Apply the plan's casts in place; a traced value of unknown dtype is cast whenever
    the plan could need it (``amp_cast`` is free at run time if the dtype matches)."""
    unknown = [(c, k) for (c, k, _), dt, kn in zip(slots, dtypes, known)
               if dt is not None and kn is None]
    if d.category == "promote" and unknown:
        live = [(c, k) for (c, k, _), dt in zip(slots, dtypes) if dt is not None]
        if len(live) > 1:
            for (c, k), y in zip(live, multicast_widest([c[k] for c, k in live])):
                c[k] = y
        return
    for (c, k, _), dt, kn, target in zip(slots, dtypes, known, d.casts):
        if d.emulated and dt in ROUNDED:  # traced inputs count as float32
            c[k] = _param_cast(c[k], f"{d.low_dtype}->float32", kn,
                               lambda x: cast(cast(x, d.low_dtype), "float32"))
        elif kn is None and dt is not None and d.category in ("lower", "fp32"):
            c[k] = cast(c[k], d.run_dtype)
        elif target is not None:
            c[k] = _param_cast(c[k], target, kn, lambda x: cast(x, target))


def _param_cast(x: Any, how: str, known: Optional[str], make: Callable[[Any], Any]) -> Any:
    """``make(x)``, shared by every use of ``x`` when it is a traced parameter (a variable
    with a declared dtype), so a weight used by several ops is cast once per step."""
    if not (is_symbol(x) and known is not None):
        return make(x)
    key = (id(x), how)
    if key not in _param_casts:
        _param_casts[key] = (x, make(x))  # holding x keeps its id unique
    return _param_casts[key][1]


def _round_outputs(d: OpDecision, out: Any) -> Any:
    """Round the floating outputs of an emulated op through its low dtype."""
    def rnd(x: Any) -> Any:
        if not is_tensor(x) or (not is_symbol(x) and tensor_dtype(x) not in ROUNDED):
            return x
        return cast(cast(x, d.low_dtype), "float32")
    if isinstance(out, (list, tuple)):
        return type(out)(rnd(o) for o in out)
    if is_symbol(out) and len(out.list_outputs()) > 1:
        return mx.sym.Group([rnd(out[i]) for i in range(len(out.list_outputs()))])
    return rnd(out)
