"""``cast_report``: what every op of a hybridized block runs in, and why."""
from __future__ import annotations

import dataclasses
import json
import logging
import warnings
from typing import Optional

import mxnet as mx
from mxnet.gluon import HybridBlock

from amp_adapters import CastReport, Policy
from amp_adapters.rules.policy import PolicyLike
from amp_adapters.services.report import GraphCasts, cast_bytes

from ._mx import dtype_name
from .active import active_policy
from .config import user_policy
from .graph import plan_graph
from .layer_paths import block_layers, node_instance
from .kernels import summarize_fallbacks
from .traced import block_graph, traced_shapes, traced_without_amp

logger = logging.getLogger("mxnet_amp")


def graph_casts(sym: mx.sym.Symbol, shapes: Optional[dict] = None,
                dtypes: Optional[dict] = None) -> GraphCasts:
    """The ``amp_cast`` / ``amp_multicast`` nodes of a traced graph (emulation's included);
    with the shapes of its inputs (``{variable: shape}``) and the dtypes of its variables,
    the bytes each ``amp_cast`` writes: nothing where its input already has the dtype (MXNet
    runs it in place), unknown for a multicast (its dtype is decided at run time)."""
    nodes = json.loads(sym.tojson(remove_amp_cast=False))["nodes"]
    casts = [n for n in nodes if n["op"] in ("amp_cast", "amp_multicast")]
    if shapes is None:
        return GraphCasts.count((nodes[n["inputs"][0][0]]["name"], n["name"],
                                 n.get("attrs", {}).get("dtype")
                                 if n["op"] == "amp_cast" else None) for n in casts)
    out_shapes, out_types = _outputs(sym, shapes, dtypes or {})

    def entry(n: dict) -> tuple:
        src, to = nodes[n["inputs"][0][0]], n.get("attrs", {}).get("dtype")
        if n["op"] != "amp_cast":
            return src["name"], n["name"], None, None
        name = src["name"] if src["op"] == "null" else _output_name(src, n["inputs"][0][1])
        same = (dtypes or {}).get(name, out_types.get(name)) == to
        return (src["name"], n["name"], to,
                0 if same else cast_bytes(out_shapes.get(n["name"] + "_output"), to))
    return GraphCasts.count(entry(n) for n in casts)


def _output_name(node: dict, index: int) -> str:
    outputs = int(node.get("attrs", {}).get("num_outputs", 1))
    return f"{node['name']}_output" + (str(index) if outputs > 1 else "")


def _outputs(sym: mx.sym.Symbol, shapes: dict, dtypes: dict) -> tuple[dict, dict]:
    """({internal output: shape}, {internal output: dtype name}) of a graph, inferred from
    its inputs' shapes and variables' dtypes (unknown dimensions 0, as MXNet writes them);
    empty where MXNet cannot infer them."""
    internals = sym.get_internals()
    args, names = internals.list_arguments(), internals.list_outputs()
    shape_of, type_of = {}, {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            _, out, _ = internals.infer_shape_partial(
                **{k: v for k, v in shapes.items() if k in args})
            shape_of = dict(zip(names, out or ()))
        except (mx.base.MXNetError, TypeError, ValueError):
            pass
        try:
            _, types, _ = internals.infer_type_partial(
                **{k: v for k, v in dtypes.items() if k in args and v != "bfloat16"})
            type_of = {k: dtype_name(t) for k, t in zip(names, types or ()) if t is not None}
        except (mx.base.MXNetError, TypeError, ValueError):
            pass
    return shape_of, type_of


def block_context(block: HybridBlock) -> mx.Context:
    """The context of the block's first parameter (where it runs)."""
    for p in block.collect_params().values():
        return p.list_ctx()[0]
    return mx.current_context()


def cast_report(block: HybridBlock, *, policy: Optional[PolicyLike] = None,
                input_dtype: str = "float32", ctx: Optional[mx.Context] = None) -> CastReport:
    """Per op of the block's traced graph: framework name, canonical name, input dtypes, run dtype.

    Uses the policy of ``init`` unless ``policy`` is given (``init``'s policy is planned for
    training, forward and backward, as ``init`` plans; another for inference), the block's
    context unless ``ctx`` is, and ``input_dtype`` for the data inputs. A node is matched
    by the policy's layer rules as the traced call was: by its name and its blocks' names
    and paths from ``block`` (``2``: a layer rule written as a path shows it in
    ``OpDecision.layer``). Under measured speed each op is planned at the shape class of
    the arrays the block was traced with (unknown dimensions measured at ``UNKNOWN_DIM``
    when it was traced without ``init``). An op that stays float32 for lack of a kernel,
    or is emulated, says so in its ``reason``. The casts are counted in the traced graph,
    the one that runs (``GraphCasts``).
    """
    chosen = (user_policy(policy, ctx or block_context(block)) if policy is not None
              else active_policy())
    if chosen is None:
        raise RuntimeError("no AMP policy: call mxnet_amp.init() first or pass policy=")
    inputs, sym = block_graph(block)
    known = {i.name: input_dtype for i in inputs}
    known.update({name: dtype_name(p.dtype) for name, p in block.collect_params().items()})
    stale = policy is None and traced_without_amp(block)
    layers = block_layers(block)
    plan = plan_graph(sym, known, Policy.preset("O0") if stale else chosen,
                      ctx or block_context(block), shapes=traced_shapes.get(block),
                      training=chosen == active_policy(),
                      instance_of=lambda node: node_instance(node, layers))
    if stale:  # the graph that runs was traced before init: every op as traced, float32
        plan = [dataclasses.replace(d, reason="traced before mxnet_amp.init(): the cached "
                                              "graph has no AMP casts (hybridize again)")
                for d in plan]
    return CastReport("mxnet", tuple(plan), graph_casts(sym, traced_shapes.get(block), known))


def summarize_block(block: HybridBlock) -> None:
    """After ``init``'s policy traced ``block``: the summary line of its cast report (one per
    model; nothing when every op planned low precision has its kernel here). A graph the
    report cannot plan costs the line, never the forward pass that traced it."""
    policy = active_policy()
    if policy is None or not policy.enabled:
        return
    ctx = block_context(block)
    try:
        report = cast_report(block, policy=policy, ctx=ctx)
    except (mx.base.MXNetError, KeyError, ValueError, TypeError, RuntimeError) as e:
        logger.info("mxnet_amp: block %s: no summary (%s: %s)", block.name, type(e).__name__, e)
        return
    summarize_fallbacks(f"mxnet_amp: block {block.name} ({type(block).__name__})",
                        report.decisions, ctx)
