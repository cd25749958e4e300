"""Mixed-precision inference graphs: convert_symbol, convert_model, convert_hybrid_block,
convert_bucketing_module.

Same signatures as ``mxnet.contrib.amp``, implemented by rewriting the symbol
graph (``graph.rewrite``: type inference, ``plan_op`` per node, ``amp_cast``
nodes) instead of ``MXReducePrecisionSymbol``. Without ``policy=`` the lists
are the native's defaults (preset ``mxnet-native``) and each list argument
replaces the default list it names, as natively and as in ``init``.
``convert_symbol``/``convert_model`` are graph
transforms with no device, as natively: they give the graph the lists ask for,
whatever this machine runs (converting on a CPU for a GPU server is a real
workflow). Where a device is known (``convert_hybrid_block``'s ``ctx``, default:
the block's own context, where the native defaults to gpu(0); or an explicit
``ctx=``), an op without a low-precision kernel there stays float32 (warned once).
Under measured speed (``policy="auto"``, or ``speed = "measured"``) a speed belongs to a
device, so the plan is for one: the ``ctx`` given, else this machine's CPU, and ``auto``
runs the low dtype that device runs fast (float16 on a GPU, bfloat16 on a CPU; the conversion
a user runs with ``auto`` is for where it runs; to convert for another machine, name a
profile measured there, ``Policy(profile=...)``, whose costs then decide). Each op is
measured for inference at the shape class MXNet infers from ``input_shapes=`` (and the
shapes parameters declare); an unknown dimension, such as the batch, at
``amp_adapters.rules.device.UNKNOWN_DIM``. Parameters stay
float32 and are cast inside the graph once per dtype, unless
``cast_optional_params=True``: then a parameter that only feeds low-precision
ops is declared (``__dtype__``) and returned in that dtype, as natively.
"""
from __future__ import annotations

import functools
import warnings
from typing import Any, Callable, Optional, Sequence

import mxnet as mx
from mxnet.gluon import HybridBlock, SymbolBlock
from mxnet.ndarray.ndarray import _DTYPE_MX_TO_NP

from amp_adapters import AmpConfigError, ConflictingOpError
from amp_adapters.rules.dtypes import low_dtype
from amp_adapters.rules.layers import check_matched
from amp_adapters.rules.oplists import native_lists

from ._mx import declared as with_dtypes
from ._mx import dtype_name, mx_dtype
from .config import PolicyLike, init_policy
from .graph import nodes, rewrite
from .layer_paths import block_layers, node_instance
from .speed import note_native_speed
from .report import block_context
from .traced import block_graph, traced_shapes


def _declared_dtypes(sym: mx.sym.Symbol) -> dict[str, str]:
    """{variable: dtype} for the variables ``sym`` declares a dtype for (``__dtype__``)."""
    out = {}
    for name, attrs in sym.attr_dict().items():
        code = attrs.get("__dtype__")
        if code not in (None, "-1"):
            out[name] = dtype_name(_DTYPE_MX_TO_NP[int(code)])
    return out


class ConvertListError(AmpConfigError, AssertionError):
    """A list argument of ``convert_*`` that the native refuses with an ``assert``: an op in
    two lists, or one that runs in the widest dtype of its inputs (``list_widest_type_cast``)
    named in a list. An ``AssertionError`` too, so code written for the native still
    catches it."""


_ALSO_ASSERTIONS: dict[type, type] = {}


def _native_asserts(convert: Callable) -> Callable:
    """``convert`` whose refusals of its arguments (an ``AmpConfigError`` or a ``TypeError``,
    with their own class and message) are also ``AssertionError``s: the native checks
    ``convert_*``'s arguments with ``assert``, so code written for it catches that."""
    @functools.wraps(convert)
    def checked(*args: Any, **kwargs: Any) -> Any:
        try:
            return convert(*args, **kwargs)
        except (AmpConfigError, TypeError) as e:
            if isinstance(e, AssertionError):
                raise
            cls = type(e)
            twin = _ALSO_ASSERTIONS.setdefault(cls, type(
                cls.__name__, (cls, AssertionError),
                {"__module__": cls.__module__, "__doc__": cls.__doc__}))
            again = BaseException.__new__(twin)  # the same error: its args and fields
            again.args, again.__dict__ = e.args, dict(vars(e))
            raise again.with_traceback(e.__traceback__) from e.__cause__
    return checked


def _names(value: Optional[Sequence[str]], what: str) -> Optional[list[str]]:
    """A list argument of names; a bare string is refused, as natively (it would read as its
    characters: ``excluded_sym_names="fc1"`` would exclude nothing)."""
    if value is None:
        return None
    if isinstance(value, str) or not all(isinstance(v, str) for v in value):
        raise ConvertListError(f"{what} must be a list of names, got {value!r}"
                               + (f"; for one name pass [{value!r}]"
                                  if isinstance(value, str) else ""))
    return list(value)


def _convert_policy(target_dtype, target_dtype_ops, fp32_ops, conditional_fp32_ops, policy,
                    emulate, ctx):
    """``init_policy`` with the native ``convert_symbol``'s list checks, for the device the
    graph is planned for (``ctx``, else this machine's CPU, as ``graph`` plans it)."""
    target_dtype_ops = _names(target_dtype_ops, "target_dtype_ops")
    fp32_ops = _names(fp32_ops, "fp32_ops")
    if policy is None:
        dtype = low_dtype(target_dtype, "target_dtype")
        native = native_lists("mxnet", dtype)
        named = [*(target_dtype_ops or ()), *(fp32_ops or ()),
                 *(rule[0] for rule in conditional_fp32_ops or ())]
        widest = sorted({op for op in named if native.category(op) == "promote"})
        if widest:
            raise ConvertListError(
                f"{widest} run in the widest dtype of their inputs (list_widest_type_cast("
                f"{dtype!r})): convert_* takes ops from list_lp16_ops, list_fp32_ops, "
                f"list_lp16_fp32_ops or list_conditional_fp32_ops only, as natively (to "
                f"change them anyway, pass policy= with Policy.mxnet_ops)")
    try:
        return init_policy(target_dtype, target_dtype_ops, conditional_fp32_ops, fp32_ops,
                           policy=policy, emulate=emulate, ctx=ctx or mx.cpu())
    except ConflictingOpError as e:
        raise ConvertListError(str(e)) from e


def _cast_params(params: dict, dtypes: dict[str, str]) -> dict:
    """A copy of ``params`` with each array in its declared dtype (bf16 through amp_cast)."""
    out = {}
    for name, array in params.items():
        want = dtypes.get(name)
        if want is None or dtype_name(array.dtype) == want:
            out[name] = array
        elif want == "bfloat16":
            out[name] = mx.nd.amp_cast(array, dtype=mx_dtype(want))
        else:
            out[name] = array.astype(want)
    return out


@_native_asserts
def convert_symbol(sym: mx.sym.Symbol, target_dtype: str = "float16",
                   target_dtype_ops: Optional[Sequence[str]] = None,
                   fp32_ops: Optional[Sequence[str]] = None,
                   conditional_fp32_ops: Optional[Sequence[tuple]] = None,
                   excluded_sym_names: Optional[Sequence[str]] = None,
                   data_names: Optional[Sequence[str]] = None,
                   cast_optional_params: bool = False, *, policy: Optional[PolicyLike] = None,
                   emulate: bool = False, ctx: Optional[mx.Context] = None,
                   input_dtypes: Optional[dict] = None,
                   input_shapes: Optional[dict] = None,
                   layers: Optional[dict] = None) -> mx.sym.Symbol:
    """``sym`` (a float32 model) with the casts of the policy inserted.

    ``excluded_sym_names``: nodes kept in float32, as ``Policy.mxnet_layers.fp32`` says it
    (they are added to it, so a call with them and a policy file listing them agree; a
    name also covers nodes named after it, ``fc1`` -> ``fc1_...``, as a layer rule does).
    A layer name matching no node raises ``AmpConfigError`` before anything is converted,
    naming the closest node names. ``layers``: {block name: its path} of the block ``sym``
    was traced from (``convert_hybrid_block`` gives it: a layer rule then also matches a
    node by its blocks' names and paths, ``2``, as under ``init``). ``input_dtypes``: dtypes of
    inputs that are not float32 (every other input, data or parameter, is).
    ``data_names``: the data inputs (default, as natively: the inputs without a
    declared ``__dtype__``); the other inputs are parameters, which
    ``cast_optional_params`` may declare low precision. ``ctx`` (default: none, a
    device-free transform) makes the plan device-aware: ops without a low-precision
    kernel on it stay float32. ``policy="auto"``: the low dtype ``ctx`` runs fast (float16
    on a GPU, bfloat16 on a CPU; no ``ctx``: this machine's CPU), and an op stays float32
    where its low kernel is not measured faster there, at the
    shapes inferred from ``input_shapes`` ({input: shape}; unknown batch: measured at
    ``UNKNOWN_DIM``).
    """
    if not isinstance(sym, mx.sym.Symbol):
        raise TypeError(f"convert_symbol expects a Symbol, got {type(sym).__name__}")
    if not (isinstance(cast_optional_params, int) and cast_optional_params in (0, 1)):
        raise TypeError(f"cast_optional_params must be True or False, "
                        f"got {cast_optional_params!r}")
    excluded_sym_names = _names(excluded_sym_names, "excluded_sym_names")
    data_names = _names(data_names, "data_names")
    pol = _convert_policy(target_dtype, target_dtype_ops, fp32_ops, conditional_fp32_ops,
                          policy, emulate, ctx)
    if policy is None:  # the native's decisions: say if they are slower than float32 here
        note_native_speed(pol, training=False)
    if excluded_sym_names:
        pol = pol.replace(mxnet_layers=pol.mxnet_layers.with_fp32(excluded_sym_names))
    layers = dict(layers or {})
    if pol.enabled and pol.layer_patterns("mxnet"):
        check_matched(pol.layer_patterns("mxnet"),
                      [*layers, *layers.values(),
                       *(n.name for n in nodes(sym) if n.op != "null")], "the symbol converted")
    inputs = sym.list_inputs()
    declared = _declared_dtypes(sym)
    known = {name: declared.get(name, "float32") for name in inputs}
    known.update({k: dtype_name(v) for k, v in (input_dtypes or {}).items()})
    if data_names is None:
        data_names = [n for n in inputs if n not in declared]
    params = frozenset(inputs) - set(data_names)
    out = rewrite(sym, known, pol, ctx,
                  optional_params=params if cast_optional_params else frozenset(),
                  keep_casts=True, params=params, free_params=params,
                  shapes={k: tuple(v) for k, v in (input_shapes or {}).items()},
                  instance_of=(lambda node: node_instance(node, layers)) if layers else None)
    # the parameters declare their dtype, as natively: a Module binding the converted
    # graph with data shapes alone then infers every parameter's dtype
    now = _declared_dtypes(out)
    return with_dtypes(out, {p: known[p] for p in params if p not in now})


@_native_asserts
def convert_model(sym: mx.sym.Symbol, arg_params: dict, aux_params: dict,
                  target_dtype: str = "float16", target_dtype_ops: Optional[Sequence[str]] = None,
                  fp32_ops: Optional[Sequence[str]] = None,
                  conditional_fp32_ops: Optional[Sequence[tuple]] = None,
                  excluded_sym_names: Optional[Sequence[str]] = None,
                  cast_optional_params: bool = False, **kw: Any) -> tuple:
    """(converted symbol, arg_params, aux_params), the parameters in the dtypes the converted
    graph declares for them (float32 unless ``cast_optional_params``), as natively. The
    given dicts are not modified (the native overwrites their entries)."""
    if not isinstance(arg_params, dict) or not isinstance(aux_params, dict):
        raise TypeError("arg_params and aux_params must be dicts of name -> NDArray")
    data_names = [n for n in sym.list_inputs() if n not in arg_params and n not in aux_params]
    out = convert_symbol(sym, target_dtype, target_dtype_ops, fp32_ops, conditional_fp32_ops,
                         excluded_sym_names, data_names, cast_optional_params, **kw)
    dtypes = _declared_dtypes(out)
    return out, _cast_params(arg_params, dtypes), _cast_params(aux_params, dtypes)


@_native_asserts
def convert_hybrid_block(block: HybridBlock, target_dtype: str = "float16",
                         target_dtype_ops: Optional[Sequence[str]] = None,
                         fp32_ops: Optional[Sequence[str]] = None,
                         conditional_fp32_ops: Optional[Sequence[tuple]] = None,
                         excluded_sym_names: Optional[Sequence[str]] = None,
                         ctx: Optional[mx.Context] = None, cast_optional_params: bool = False,
                         **kw: Any) -> SymbolBlock:
    """A SymbolBlock running the hybridized ``block``'s graph in mixed precision, for inference.

    The block must have been hybridized and run once. ``ctx`` defaults to the
    block's own context (the native defaults to gpu(0)); ``policy="auto"`` runs its fast
    low dtype (float16 on a GPU, bfloat16 on a CPU) and measures there,
    for inference, at the shapes the block was traced with under ``init`` (else the batch
    at ``UNKNOWN_DIM``, the rest inferred from its parameters). With
    ``cast_optional_params`` the parameters that only feed low-precision ops are
    stored in that dtype.
    """
    inputs, sym = block_graph(block)
    sym = mx.sym.load_json(sym.tojson())  # without the casts init put in a traced graph
    ctx = ctx or block_context(block)
    data_names = [i.name for i in inputs]
    kw.setdefault("input_shapes", traced_shapes.get(block))
    converted = convert_symbol(sym, target_dtype, target_dtype_ops, fp32_ops,
                               conditional_fp32_ops, excluded_sym_names, data_names,
                               cast_optional_params, ctx=ctx,
                               layers=block_layers(block), **kw)
    dtypes = _declared_dtypes(converted)
    with warnings.catch_warnings():  # the data inputs have no dtype until called: MXNet's
        warnings.filterwarnings("ignore", message="Cannot decide type")  # noise, not the user's
        ret = SymbolBlock(converted, inputs)
    params = _cast_params({name: p._reduce() for name, p in block.collect_params().items()},
                          dtypes)
    for name, param in ret.collect_params().items():
        if name in params and dtype_name(param.dtype) != dtype_name(params[name].dtype):
            param.cast(params[name].dtype)
    ret.collect_params().load_dict(params, ctx=ctx, cast_dtype=False)
    return ret


@_native_asserts
def convert_bucketing_module(bucketing_mod, target_dtype: str = "float16",
                             target_dtype_ops: Optional[Sequence[str]] = None,
                             fp32_ops: Optional[Sequence[str]] = None,
                             conditional_fp32_ops: Optional[Sequence[tuple]] = None,
                             excluded_sym_names: Optional[Sequence[str]] = None,
                             cast_optional_params: bool = False, **kw: Any):
    """A new ``BucketingModule`` whose every bucket's symbol is converted (``convert_model``)
    and whose parameters are in the converted graphs' dtypes, as natively. The plan is for
    the module's (first) context unless ``ctx=`` says otherwise."""
    from mxnet.module import BucketingModule
    if not isinstance(bucketing_mod, BucketingModule):
        raise TypeError(f"convert_bucketing_module expects a BucketingModule, "
                        f"got {type(bucketing_mod).__name__}")
    if not bucketing_mod._buckets:
        raise ValueError("the BucketingModule has no bucket: bind it first")
    if not bucketing_mod.params_initialized:
        raise ValueError("initialise the BucketingModule's parameters (init_params or "
                         "set_params) before converting it")
    arg_params, aux_params = bucketing_mod.get_params()
    context = bucketing_mod._context  # a device is known: plan for it
    kw.setdefault("ctx", context[0] if isinstance(context, (list, tuple)) else context)
    sym_dict = {}
    for key, mod in bucketing_mod._buckets.items():
        sym_dict[key], args, auxs = convert_model(
            mod._symbol, arg_params, aux_params, target_dtype, target_dtype_ops, fp32_ops,
            conditional_fp32_ops, excluded_sym_names, cast_optional_params, **kw)
    return BucketingModule.load_dict(
        sym_dict, sym_gen=bucketing_mod._sym_gen, arg_params=args, aux_params=auxs,
        default_bucket_key=bucketing_mod._default_bucket_key, logger=bucketing_mod.logger,
        context=bucketing_mod._context, work_load_list=bucketing_mod._work_load_list,
        fixed_param_names=bucketing_mod._fixed_param_names,
        state_names=bucketing_mod._state_names, group2ctxs=bucketing_mod._group2ctxs,
        compression_params=bucketing_mod._compression_params)
