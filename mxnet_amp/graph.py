"""Symbol graphs: the plan of every op (for reports) and the rewrite with casts (for convert).

One walk does both: in topological order it asks ``amp_adapters.plan_op`` about
each op, given the dtypes the plan so far gives its inputs, and types the op's
outputs by MXNet's type inference on the op alone; it decides nothing itself.
``amp_cast``/``amp_multicast`` nodes a traced graph already has (the casts
``init`` inserted) are taken out and planned again. No host sync: type inference
runs on the graph, not on data.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import AbstractSet, Callable, Iterator, Mapping, Optional

import mxnet as mx

from amp_adapters import (LOW_DTYPES, DeviceProfile, OpCall, OpDecision, ParamUse, Policy,
                          ShapeClass, plan_op, widest)
from amp_adapters.rules.dtypes import AMP_DTYPES, FLOAT_RANK
from amp_adapters.rules.dtypes import FLOAT_DTYPES as FLOATS
from amp_adapters.rules.oplists import passes_through

from ._mx import cast, declared, dtype_name, graph_shapes, input_names, mx_dtype, unpatched
from .kernels import log_fallback
from .speed import profile

@dataclass(frozen=True)
class Node:
    """One op of a graph: its symbol, op name, attributes, input and output entry names."""

    symbol: mx.sym.Symbol
    name: str
    op: str
    attrs: Mapping[str, str]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]


def nodes(sym: mx.sym.Symbol) -> Iterator[Node]:
    """Every node of ``sym`` in topological order (variables have op 'null')."""
    ops = {n["name"]: n for n in json.loads(sym.tojson(remove_amp_cast=False))["nodes"]}
    internals = sym.get_internals()
    names = internals.list_outputs()
    i = 0
    while i < len(names):
        s = internals[i]
        j = i + 1
        while j < len(names) and internals[j].name == s.name and ops[s.name]["op"] != "null":
            j += 1
        node = ops[s.name]
        children = s.get_children()
        yield Node(s, s.name, node["op"], node.get("attrs", {}),
                   tuple(children.list_outputs()) if children is not None else (),
                   tuple(names[i:j]))
        i = j


def _plan(n: Node, dtypes: list[Optional[str]], policy: Policy,
          device: Optional[DeviceProfile], params: AbstractSet[str] = frozenset(),
          free: Optional[list[bool]] = None,
          shapes: Optional[Mapping[str, Optional[tuple]]] = None,
          instance_of: Optional[Callable[[str], tuple]] = None,
          readers: Optional[tuple[ParamUse, ...]] = None) -> OpDecision:
    """The core's decision for node ``n`` given its input dtypes (non-floats count as None);
    the node's name is the instance name the policy's layer rules match (``dense2_fwd``),
    with ``instance_of(name)``'s names where given (its blocks' names and paths:
    ``layer_paths.node_instance``);
    ``params``: the graph inputs that are parameters (the planner's promote rule reads it);
    ``free``: which inputs have no dtype of their own yet (the planner's free rule);
    ``shapes``: {entry: inferred shape} under measured speed (the shape class of the
    floating inputs, as ``patching.shape_class`` keys an imperative call); ``readers``: under
    O2, the ops reading its outputs (``result_uses``)."""
    shape = None if shapes is None else ShapeClass.of(
        [shapes.get(e) for e, d in zip(n.inputs, dtypes) if d is None or d in FLOATS])
    return plan_op(policy, "mxnet", OpCall(
        n.op, [d if d in FLOATS else None for d in dtypes], shape=shape, attrs=n.attrs,
        input_names=input_names(n.op),
        param_inputs=[e in params for e in n.inputs] if params else None, free=free,
        instance=instance_of(n.name) if instance_of else n.name, readers=readers), device=device)


def result_uses(ns: list[Node], policy: Policy,
                shapes: Optional[Mapping[str, Optional[tuple]]] = None
                ) -> Optional[Mapping[str, tuple[ParamUse, ...]]]:
    """O2: {entry: the ops reading it} over the op nodes ``ns`` (``plan_op``'s ``readers``:
    an op O2 lowers for being O2 alone is lowered only where a reader computes low), an op
    that only moves values listing its own readers (``ParamUse.then``), and so does the
    first op that computes on the way (an op between float32 neighbours is judged with its
    readers); None under another level (nothing asks)."""
    if policy.level != "O2" or not policy.enabled:
        return None
    read: dict[str, list[tuple[Node, Optional[str]]]] = {}
    for n in ns:
        if n.op == "null":
            continue
        slots = input_names(n.op)
        for i, e in enumerate(n.inputs):
            read.setdefault(e, []).append((n, slots[i] if i < len(slots) else None))

    def use(n: Node, slot: Optional[str], expand: bool = True) -> ParamUse:
        then = None
        moves = passes_through("mxnet", n.op, n.attrs)
        if moves or expand:
            then = tuple(use(r, s, expand and moves) for o in n.outputs
                         for r, s in read.get(o, ()))
        shape = None if shapes is None else ShapeClass.of([shapes.get(e) for e in n.inputs])
        return ParamUse(n.op, dict(n.attrs), slot, then=then, shape=shape,
                        instance=(n.name,))

    return {e: tuple(use(r, s) for r, s in rs) for e, rs in read.items()}


def _device(ctx: Optional[mx.Context], policy: Policy,
            training: bool = False) -> Optional[DeviceProfile]:
    """What ``ctx`` runs in ``policy.dtype`` (inference unless ``training``); None (every op)
    without a device, except under measured speed: a speed is a device's, so it is this
    machine's CPU's (what a user converting for here with ``policy="auto"`` expects; to
    plan for another machine, name a profile measured there: ``Policy.profile``)."""
    if ctx is None and policy.speed == "measured" and policy.enabled:
        ctx = mx.cpu()
    return None if ctx is None else profile(policy, ctx, training)


def _entry_shapes(sym: mx.sym.Symbol, device: Optional[DeviceProfile],
                  shapes: Optional[Mapping[str, tuple]]) -> Optional[dict]:
    """{entry: shape} when the device's costs take part (measured speed), else None."""
    if device is None or device.costs is None:
        return None
    return graph_shapes(sym, shapes or {})


def plan_graph(sym: mx.sym.Symbol, known: Mapping[str, str], policy: Policy,
               ctx: Optional[mx.Context], shapes: Optional[Mapping[str, tuple]] = None,
               training: bool = False,
               instance_of: Optional[Callable[[str], tuple]] = None) -> list[OpDecision]:
    """The decision for every op of ``sym``, in topological order; ``ctx`` None plans for no
    device in particular (every op has its low-precision kernel). ``shapes``: the known
    shapes of its inputs (measured speed plans at the shape classes inferred from them);
    ``training``: plan as ``init`` does, for forward and backward; ``instance_of``: a node
    name's instance names for the layer rules (default: the name alone).

    AMP casts already in ``sym`` (those ``init`` put in a traced graph) are taken out and
    the graph is planned as ``rewrite`` plans it: each op sees the dtypes the plan gives
    its producers, so an op that follows a GEMM running on a real bf16 kernel is reported
    in bf16, as it runs (type inference on the uncast graph would say float32).
    """
    bare = mx.sym.load_json(sym.tojson())  # tojson() drops amp_cast/amp_multicast nodes
    device = _device(ctx, policy, training)
    return _rewrite(bare, known, policy, ctx, device, {},
                    frozenset(), frozenset(), entry_shapes=_entry_shapes(bare, device, shapes),
                    instance_of=instance_of)[3]


def rewrite(sym: mx.sym.Symbol, known: Mapping[str, str], policy: Policy,
            ctx: Optional[mx.Context],
            device: Optional[DeviceProfile] = None,
            optional_params: AbstractSet[str] = frozenset(),
            keep_casts: bool = False,
            params: AbstractSet[str] = frozenset(),
            free_params: AbstractSet[str] = frozenset(),
            shapes: Optional[Mapping[str, tuple]] = None,
            instance_of: Optional[Callable[[str], tuple]] = None) -> mx.sym.Symbol:
    """A copy of ``sym`` with the casts the plan asks for inserted (``instance_of``: a node
    name's instance names for the layer rules, as in ``plan_graph``).

    ``keep_casts``: the ``amp_cast``/``amp_multicast`` nodes already in ``sym`` are the
    user's and stay (a symbol given to ``convert_symbol``); else they are dropped (the
    casts ``init`` put in a traced graph, planned again here).
    ``device``: what the device runs in ``policy.dtype``; by default probed on ``ctx``, and
    with ``ctx`` None every op has a kernel: a device-free graph transform (what the user asked
    for, as the native ``convert_symbol`` gives, whatever this machine runs), except under
    measured speed, which measures on this machine's CPU (``_device``). ``shapes``: the
    known shapes of inputs; measured speed plans each op at the shape class MXNet's
    partial shape inference gives from them (an unknown dimension, such as the batch,
    measured at ``amp_adapters.rules.device.UNKNOWN_DIM``).
    ``params``: the inputs that are parameters (weights), so that a promote op casts a
    float32 parameter down beside a low activation rather than the activation up.
    ``optional_params`` (the native ``cast_optional_params``): of these parameter
    variables, the ones every consumer reads cast to one low dtype are declared in
    that dtype instead (``__dtype__``; the casts go), so they can be stored so.
    ``free_params``: the parameter variables whose dtype MXNet infers from the ops
    reading them, as in the native conversion: one a follow op reads uncast takes
    that op's dtype, and is declared in it when that is a low dtype (FullyConnected
    after an fp16 op, in no list: its weight is float16, as natively).

    A value is cast at most once per dtype (a weight shared by several ops gets
    one cast), and a cast back to a value's source dtype reuses the source
    (cast chains collapse). Emulated ops round inputs and outputs through the
    low dtype. A cast of entry ``e`` is named ``e_amp_cast_<dtype>``: the native's name
    for a variable and for an output the op names (``data_amp_cast_bfloat16``,
    ``fc1_output_amp_cast_float32``); for an op that names no outputs (relu, Cast) the
    native uses the index (``relu0_0_amp_cast_float32``, here ``relu0_output_...``), which
    MXNet's Python API does not show.

    The graph's outputs keep the dtypes the unconverted graph gives them, as the
    native pass keeps them: an op's output the unconverted graph has in float32 and the
    plan in a low dtype is cast back to float32 (a bfloat16 ``Dense`` ending a network
    still hands its caller float32).
    """
    if not keep_casts:
        sym = mx.sym.load_json(sym.tojson())  # drops amp_cast nodes a traced graph may have
    device = _device(ctx, policy) if device is None else device
    heads = _float32_heads(sym, {k: v for k, v in known.items() if k not in free_params})
    entry_shapes = _entry_shapes(sym, device, shapes)
    out, uses, took, plan = _rewrite(sym, known, policy, ctx, device, {}, params,
                                     free_params, heads, entry_shapes, instance_of)
    declared = {p: next(iter(u)) for p, u in uses.items()
                if (p in optional_params or p in took) and len(u) == 1
                and next(iter(u)) in LOW_DTYPES}
    if declared:  # again, with those parameters already in their low dtype
        out, _, _, plan = _rewrite(sym, {**known, **declared}, policy, ctx, device,
                                   declared, params, free_params, heads, entry_shapes,
                                   instance_of)
    if ctx is not None:
        for d in plan:
            if d.emulated or d.fell_back:
                log_fallback(d.op, ctx, d)
    return out


def with_lone_ops_following(sym: mx.sym.Symbol, known: Mapping[str, str], policy: Policy,
                            ctx: mx.Context, params: AbstractSet[str] = frozenset(),
                            shapes: Optional[Mapping[str, tuple]] = None,
                            instance_of: Optional[Callable[[str], tuple]] = None
                            ) -> Optional[mx.sym.Symbol]:
    """O2 on a graph ``init``'s op wrappers traced: each op was planned as it was called,
    before the ops reading it existed, so an op O2 lowers for being O2 alone between float32
    neighbours (the attention's scale between an emulated GEMM and softmax) was lowered,
    with a cast down and one back up. Planned with its readers (``result_uses``), the core
    has it follow its neighbours: where that changes a decision, the graph rewritten as
    ``rewrite`` plans it (the plan ``cast_report`` shows), else None (the trace stands)."""
    if policy.level != "O2" or not policy.enabled:
        return None
    bare = mx.sym.load_json(sym.tojson())
    device = _device(ctx, policy, training=True)
    entry_shapes = _entry_shapes(bare, device, shapes)
    plan = _rewrite(bare, known, policy, ctx, device, {}, params, frozenset(),
                    entry_shapes=entry_shapes, instance_of=instance_of)[3]
    # under O2 an op that follows or promotes its inputs runs float32 with a kernel at hand
    # (not emulated, not fallen back) only by following its float32 neighbours
    if not any(d.category in ("follow", "promote") and d.run_dtype == "float32"
               and not (d.emulated or d.fell_back) for d in plan):
        return None
    return rewrite(bare, known, policy, ctx, device=device, params=params, shapes=shapes,
                   instance_of=instance_of)


def _float32_heads(sym: mx.sym.Symbol, known: Mapping[str, str]) -> frozenset[str]:
    """The outputs of ``sym`` made by ops that its type inference, from the ``known`` dtypes
    of its inputs (the others free, as a parameter a user's cast feeds is), gives float32 or
    no dtype at all; every op's output where it cannot infer (the native's rule: it casts
    back any output it made low)."""
    try:
        _, types, _ = declared(sym, dict(known)).infer_type_partial()
    except mx.base.MXNetError:
        types = [None] * len(sym.list_outputs())
    inputs = set(sym.list_inputs())
    return frozenset(h for h, t in zip(sym.list_outputs(), types)
                     if h not in inputs and (t is None or dtype_name(t) == "float32"))


def _rewrite(sym, known, policy, ctx, device, low_params, params, free_params,
             float32_heads=frozenset(), entry_shapes=None, instance_of=None):
    """``rewrite`` proper (``float32_heads``: the outputs handed back in float32); also
    returns {parameter: the dtypes its consumers read it in} ("raw" when one reads it
    uncast), the free parameters a follow op took, and the decision for every op (under
    O2, with the ops reading it: ``result_uses``)."""
    plan: list[OpDecision] = []
    uses: dict[str, set] = {}
    took: set[str] = set()
    value: dict[str, mx.sym.Symbol] = {}
    dtype: dict[str, Optional[str]] = dict(known)
    source: dict[str, str] = {}  # entry made by a cast -> the entry it was cast from
    label: dict[str, str] = {}  # entry made by a cast -> the cast node's name

    def cast_entry(e: str, to: str) -> str:
        if dtype.get(e) == to:
            return e
        src = source.get(e)
        if src is not None and dtype.get(src) == to and \
                FLOAT_RANK[dtype[e]] >= FLOAT_RANK[to]:
            return src  # a widening cast undone: the source itself
        key = f"{e}->{to}"
        if key not in value:
            label[key] = f"{label.get(e, e)}_amp_cast_{to}"
            value[key], dtype[key], source[key] = cast(value[e], to, label[key]), to, e
        return key

    with unpatched():
        ns = list(nodes(sym))
        uses_of = result_uses(ns, policy, entry_shapes)
        for n in ns:
            if n.op == "null":
                value[n.name] = n.symbol
                if n.name in low_params:
                    attrs = {k: v for k, v in n.attrs.items() if k != "__dtype__"}
                    value[n.name] = mx.sym.var(n.name, attr=attrs,
                                               dtype=mx_dtype(low_params[n.name]))
                continue
            ins = list(n.inputs)
            free = [e in free_params for e in ins]
            d = _plan(n, [dtype.get(e) for e in ins], policy, device,
                      params=params, free=free, shapes=entry_shapes, instance_of=instance_of,
                      readers=None if uses_of is None else
                      tuple(u for o in n.outputs for u in uses_of.get(o, ())))
            takes = [f and d.category == "follow" and c is None and not r and not k
                     and n.op not in ("amp_cast", "amp_multicast")  # a user's cast reads as cast
                     for f, c, r, k in zip(free, d.casts, d.round_inputs,
                                           d.kept or (False,) * len(ins))]
            took.update(e for e, t in zip(ins, takes) if t)
            plan.append(d)
            for i, (target, rnd) in enumerate(zip(d.casts, d.round_inputs)):
                if rnd:
                    ins[i] = cast_entry(cast_entry(ins[i], d.low_dtype), "float32")
                elif target is not None:
                    ins[i] = cast_entry(ins[i], target)
            for orig, now, t in zip(n.inputs, ins, takes):
                uses.setdefault(orig, set()).add(
                    d.run_dtype if t else _read_as(n, orig, now, d, dtype, known))
            outs = n.symbol._gen_atomic_symbol()(*[value[e] for e in ins], name=n.name)
            inferred = _output_dtypes(n, [None if t else dtype.get(e)
                                          for e, t in zip(ins, takes)])
            for k, o in enumerate(n.outputs):
                value[o] = outs[k] if len(n.outputs) > 1 else outs
                dtype[o] = inferred[k]
                if d.round_outputs and dtype[o] in AMP_DTYPES:
                    o_round = cast_entry(cast_entry(o, d.low_dtype), "float32")
                    value[o], dtype[o] = value[o_round], "float32"
        heads = [cast_entry(h, "float32") if h in float32_heads and dtype.get(h) in LOW_DTYPES
                 else h for h in sym.list_outputs()]
    out = value[heads[0]] if len(heads) == 1 else mx.sym.Group([value[h] for h in heads])
    return out, uses, took, plan


def _read_as(n: Node, orig: str, now: str, d: OpDecision,
             dtype: Mapping[str, Optional[str]], inputs: Mapping[str, str]) -> Optional[str]:
    """The dtype node ``n`` reads its input ``orig`` in ("raw": as it is). A user's
    ``amp_cast`` reads it in its ``dtype``; an ``amp_multicast`` of graph inputs only, in
    the widest dtype of the others (as the native ``cast_optional_params`` does)."""
    if d.emulated:
        return "raw"
    if now != orig:
        return dtype.get(now)
    if n.op == "amp_cast":
        return dtype_name(n.attrs["dtype"])
    if n.op == "amp_multicast":
        others = [e for e in n.inputs if e != orig]
        if others and all(inputs.get(e) in FLOATS for e in others):
            return widest([inputs[e] for e in others])
    return "raw"


def _output_dtypes(n: Node, in_dtypes: list[Optional[str]]) -> list[Optional[str]]:
    """Output dtypes of one node given its input dtypes (type inference on the node alone)."""
    names = [f"__amp_in{i}" for i in range(len(in_dtypes))]
    mini = n.symbol._gen_atomic_symbol()(*[mx.sym.var(v, dtype=mx_dtype(d) if d else None)
                                           for v, d in zip(names, in_dtypes)])
    _, types, _ = mini.infer_type_partial()
    return [dtype_name(t) if t is not None else None for t in types]
