"""Mixed-precision inference graphs: convert_symbol, convert_model, convert_hybrid_block.

Same signatures as ``mxnet.contrib.amp``, implemented by rewriting the symbol
graph (``graph.rewrite``: type inference, ``plan_op`` per node, ``amp_cast``
nodes) instead of ``MXReducePrecisionSymbol``. The lists EXTEND the defaults,
as in ``init``; the plan is device-aware for ``ctx`` (default: the block's own
context, where the native defaults to gpu(0)). Parameters stay float32 and
are cast inside the graph, once per dtype.
"""
from __future__ import annotations

import warnings
from typing import Any, Optional, Sequence

import mxnet as mx
from mxnet.gluon import HybridBlock, SymbolBlock

from amp_adapters import AmpConfigError

from .config import PolicyLike, resolve_policy
from .graph import rewrite
from .report import block_context, block_graph


def convert_symbol(sym: mx.sym.Symbol, target_dtype: str = "float16",
                   target_dtype_ops: Optional[Sequence[str]] = None,
                   fp32_ops: Optional[Sequence[str]] = None,
                   conditional_fp32_ops: Optional[Sequence[tuple]] = None,
                   excluded_sym_names: Optional[Sequence[str]] = None,
                   data_names: Optional[Sequence[str]] = None,
                   cast_optional_params: bool = False, *, policy: Optional[PolicyLike] = None,
                   emulate: bool = False, ctx: Optional[mx.Context] = None,
                   input_dtypes: Optional[dict] = None) -> mx.sym.Symbol:
    """``sym`` (a float32 model) with the casts of the policy inserted.

    ``excluded_sym_names``: nodes kept in float32. ``input_dtypes``: dtypes of
    inputs that are not float32 (every other input, data or parameter, is).
    ``data_names`` is accepted for the native signature and not needed. ``ctx``
    (default cpu) decides which ops have low-precision kernels.
    """
    if not isinstance(sym, mx.sym.Symbol):
        raise TypeError(f"convert_symbol expects a Symbol, got {type(sym).__name__}")
    if cast_optional_params:
        raise AmpConfigError("cast_optional_params=True is not supported: parameters stay "
                             "float32 and are cast inside the graph")
    pol = resolve_policy(target_dtype, target_dtype_ops, conditional_fp32_ops, fp32_ops,
                         policy=policy, emulate=emulate)
    known = {name: "float32" for name in sym.list_inputs()}
    known.update(input_dtypes or {})
    return rewrite(sym, known, pol, ctx or mx.cpu(), frozenset(excluded_sym_names or ()))


def convert_model(sym: mx.sym.Symbol, arg_params: dict, aux_params: dict,
                  target_dtype: str = "float16", target_dtype_ops: Optional[Sequence[str]] = None,
                  fp32_ops: Optional[Sequence[str]] = None,
                  conditional_fp32_ops: Optional[Sequence[tuple]] = None,
                  excluded_sym_names: Optional[Sequence[str]] = None,
                  cast_optional_params: bool = False, **kw: Any) -> tuple:
    """(converted symbol, arg_params, aux_params); the parameters are returned unchanged."""
    if not isinstance(arg_params, dict) or not isinstance(aux_params, dict):
        raise TypeError("arg_params and aux_params must be dicts of name -> NDArray")
    out = convert_symbol(sym, target_dtype, target_dtype_ops, fp32_ops, conditional_fp32_ops,
                         excluded_sym_names, cast_optional_params=cast_optional_params, **kw)
    return out, arg_params, aux_params


def convert_hybrid_block(block: HybridBlock, target_dtype: str = "float16",
                         target_dtype_ops: Optional[Sequence[str]] = None,
                         fp32_ops: Optional[Sequence[str]] = None,
                         conditional_fp32_ops: Optional[Sequence[tuple]] = None,
                         excluded_sym_names: Optional[Sequence[str]] = None,
                         ctx: Optional[mx.Context] = None, cast_optional_params: bool = False,
                         **kw: Any) -> SymbolBlock:
    """A SymbolBlock running the hybridized ``block``'s graph in mixed precision, for inference.

    The block must have been hybridized and run once. ``ctx`` defaults to the
    block's own context (the native defaults to gpu(0)).
    """
    inputs, sym = block_graph(block)
    ctx = ctx or block_context(block)
    converted = convert_symbol(sym, target_dtype, target_dtype_ops, fp32_ops,
                               conditional_fp32_ops, excluded_sym_names,
                               cast_optional_params=cast_optional_params, ctx=ctx, **kw)
    with warnings.catch_warnings():  # the data inputs have no dtype until called: MXNet's
        warnings.filterwarnings("ignore", message="Cannot decide type")  # noise, not the user's
        ret = SymbolBlock(converted, inputs)
    params = {name: p._reduce() for name, p in block.collect_params().items()}
    ret.collect_params().load_dict(params, ctx=ctx)
    return ret
