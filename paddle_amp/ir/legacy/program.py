"""``LegacyProgram``: the ``ProgramIR`` protocol on a legacy-IR program (Paddle 2.6, and 3.x
with ``FLAGS_enable_pir_api=0``).

Values are var names. The walk keeps the current op's position as casts go in
before and after it, so each insert is one desc insert (no whole-block sync, no
Python stack capture: what made a rewrite quadratic).
"""
from __future__ import annotations

from typing import AbstractSet, Iterator, Optional

import paddle
from paddle.base import core, framework, unique_name

from amp_adapters import ParamUse
from amp_adapters.oplists import passes_through
from amp_adapters.dtypes import FLOAT_DTYPES, SHORT_NAMES
from amp_adapters.report import GraphCasts

from ...env import DTYPE_OF, VarType, VARTYPE_OF, dtype_name
from ...guard import BF16_GUARD_PATTERN, GUARD_PATTERN
from .probe import PROBE, onednn_attrs
from ..protocol import CONTROL_FLOW, OpAttrs, Slot
from . import doctor as _doctor
from .ops import BlockOps
from .skip import cond_block, skip

_ROLE = core.op_proto_and_checker_maker.kOpRoleAttrName()
_NOT_FORWARD = int(core.op_proto_and_checker_maker.OpRole.Backward) | int(
    core.op_proto_and_checker_maker.OpRole.Optimize) | int(
    core.op_proto_and_checker_maker.OpRole.LRSched)
_NAMESCOPE = core.op_proto_and_checker_maker.kOpNameScopeAttrName()
_IO_OPS = frozenset({"feed", "fetch", "fetch_v2", "read", "create_py_reader"})
_NOT_TENSORS = (VarType.FEED_MINIBATCH, VarType.FETCH_LIST, VarType.READER, VarType.RAW)


def is_forward(op) -> bool:
    """True for an op of the forward pass (not backward, optimizer or LR schedule)."""
    return not op.has_attr(_ROLE) or not int(op.attr(_ROLE)) & _NOT_FORWARD


def _ops_within(op) -> list:
    """Every op in ``op``'s sub-block, and in theirs, recursively."""
    out = []
    for inner in op._block_attr("sub_block").ops:
        out.append(inner)
        if inner.has_attr("sub_block"):
            out.extend(_ops_within(inner))
    return out


def _insert_cast_op(block, i: int, src: str, out: str, in_dtype, out_dtype, role,
                    attrs: dict) -> None:
    """A ``cast`` op at position ``i``, straight into the desc (its output var exists), with
    ``attrs`` besides its dtypes (oneDNN's: ``LegacyProgram._cast_attrs``)."""
    desc = block.desc._insert_op(i)
    desc.set_type("cast")
    desc.set_input("X", [src])
    desc.set_output("Out", [out])
    desc._set_int32_attr("in_dtype", int(in_dtype))
    desc._set_int32_attr("out_dtype", int(out_dtype))
    desc._set_int32_attr(_ROLE, int(role))
    desc._set_attr(_NAMESCOPE, framework._full_name_scope())
    for name, value in attrs.items():
        desc._set_attr(name, value)
    desc.check_attrs()  # the cast op's defaults (use_mkldnn, ...)
    block.ops.insert(i, framework.Operator(block, desc))


class LegacyProgram:
    """A legacy ``framework.Program``, through the ``ProgramIR`` protocol."""

    name = "legacy"

    def __init__(self, program) -> None:
        self.program = program
        self.block = program.global_block()
        self._onednn_casts = False
        self._plain_readers: AbstractSet[str] = frozenset()  # (``use_onednn_casts``)
        self._at = 0          # the walk's op, by position (casts shift it)
        self._role = 0        # its op role, given to the casts inserted for it
        self._startup_block = None  # where the update's constants are filled
        self._read: Optional[set] = None  # (``is_output``)
        self._walk_readers: Optional[tuple] = None  # (``result_uses``)

    # -- values --------------------------------------------------------------------------------

    def dtype(self, value) -> Optional[str]:
        """(Of a var name, or of a ``Variable`` such as the loss.)"""
        return dtype_name(value if isinstance(value, framework.Variable)
                          else self.block._find_var_recursive(value))

    def rank(self, value) -> Optional[int]:
        var = self.block._find_var_recursive(value)
        return None if var is None else len(var.shape)

    def shape(self, value) -> Optional[tuple[Optional[int], ...]]:
        var = self.block._find_var_recursive(value)
        return None if var is None else tuple(d if d >= 0 else None for d in var.shape)

    def key(self, value):
        return value

    def holds_var(self, name: str) -> bool:
        return self.block.has_var(name)

    def is_param(self, value) -> bool:
        return isinstance(self.block._find_var_recursive(value), framework.Parameter)

    def reached_params(self, loss) -> set[str]:
        needed = {loss.name}
        for op in reversed(self.block.ops):  # the ops loss depends on, and their inputs
            if needed.intersection(op.output_arg_names):
                for name in op.input_arg_names:
                    var = self.block._find_var_recursive(name)
                    if var is not None and not var.stop_gradient:
                        needed.add(name)
        return {p.name for p in self.block.all_parameters()
                if p.trainable and not p.stop_gradient and p.name in needed}

    def persistables(self) -> list[str]:
        """Every persistable var of the program but feed/fetch lists, readers and raw vars."""
        return [v.name for v in self.program.list_vars()
                if v.persistable and v.type not in _NOT_TENSORS]

    # -- the op walk: reading ------------------------------------------------------------------

    def prepare(self, use_guard, black_varnames) -> None:
        """Nothing to check: the guard is a name scope, every var has a name."""
        self._read = None  # the names the program's ops read (``is_output``)
        self._walk_readers = None  # the forward readers of each var (``result_uses``)

    def forward_ops(self) -> Iterator:
        self.block._sync_with_cpp()  # once; every insert keeps Python and C++ in step
        self._at = 0
        while self._at < len(self.block.ops):
            op = self.block.ops[self._at]
            if is_forward(op) and op.type not in _IO_OPS:
                self._role = op.attr(_ROLE) if op.has_attr(_ROLE) else 0
                yield op
            self._at += 1

    def op_type(self, op) -> str:
        return op.type

    def attrs(self, op):
        return OpAttrs(lambda: op.attr_names, op.attr)

    def slots(self, op) -> list[Slot]:
        return [Slot(op, i, slot, name) for slot in op.input_names
                for i, name in enumerate(op.input(slot))]

    control_flow_slots = slots

    def in_guard(self, op) -> bool:
        scope = op.attr("op_namescope") or ""
        return GUARD_PATTERN in scope or BF16_GUARD_PATTERN in scope

    def var_names(self, op) -> set:
        return set(op.input_arg_names + op.output_arg_names)

    def is_control_flow(self, op) -> bool:
        return op.has_attr("sub_block")

    def is_cast(self, op) -> bool:
        return op.type == "cast"

    def is_output(self, op, loss) -> bool:
        outs = op.output_arg_names
        if loss is not None and getattr(loss, "name", loss) in outs:
            return True
        if self._read is None:  # once per walk: before any cast reads a result
            self._read = {n for block in self.program.blocks for each in block.ops
                          for n in each.input_arg_names}
        return not self._read.intersection(outs) and any(
            self.dtype(n) in FLOAT_DTYPES for n in outs)

    def param_uses(self, forced, shape_of) -> dict[str, list[ParamUse]]:
        readers, use = self._uses(forced, shape_of)
        return {p.name: [use(i, op, slot) for i, op, slot in readers.get(p.name, ())]
                for p in self.block.all_parameters()}

    def result_uses(self, op, forced, shape_of) -> tuple[ParamUse, ...]:
        """The readers are mapped once per walk (``prepare``), at its first question: the
        ops after the walk's op are not rewritten yet, and the casts put in before it never
        read its results, so the map answers as a new one would (one per op made O2's walk
        quadratic)."""
        if self._walk_readers is None:
            forward = self._forward_list()
            self._walk_readers = (self._readers(forward),
                                  {id(o): i for i, o in enumerate(forward)})
        readers, index = self._walk_readers
        use = self._use(readers, forced, shape_of)
        at = index[id(op)]
        return tuple(use(j, reader, s) for out in op.output_arg_names
                     for j, reader, s in readers.get(out, ()) if j > at)

    def _forward_list(self) -> list:
        return [op for op in self.block.ops if is_forward(op) and op.type not in _IO_OPS]

    def _uses(self, forced, shape_of):
        """({var name: [(index, forward op, slot) reading it]}, use(index, op, slot) ->
        ``ParamUse``, listing the later readers of an op that only moves values)."""
        readers = self._readers(self._forward_list())
        return readers, self._use(readers, forced, shape_of)

    @staticmethod
    def _readers(forward: list) -> dict[str, list[tuple[int, object, str]]]:
        """{var name: [(index, forward op, slot) reading it]} over the ops ``forward``."""
        readers: dict[str, list[tuple[int, object, str]]] = {}
        for i, op in enumerate(forward):
            for slot in op.input_names:
                for name in op.input(slot):
                    readers.setdefault(name, []).append((i, op, slot))
        return readers

    def _use(self, readers: dict, forced, shape_of):
        """use(index, op, slot) -> ``ParamUse``, listing the later readers (in ``readers``)
        of an op that only moves values."""
        def use(i: int, op, slot: str) -> ParamUse:
            reason = CONTROL_FLOW if op.has_attr("sub_block") else forced(op)
            attrs = self.attrs(op)
            then = None
            if reason is None and passes_through("paddle", op.type, attrs):
                then = tuple(use(j, reader, s) for out in op.output_arg_names
                             for j, reader, s in readers.get(out, ()) if j > i)
            return ParamUse(op.type, attrs, slot, reason, then, shape_of(op))

        return use

    def end_forward(self) -> None:
        """Nothing: every op carries its role (forward, backward, optimize)."""

    def graph_casts(self) -> Optional[GraphCasts]:
        """Forward ``cast`` ops (not the backward's), emulation's round trips apart."""
        block = self.block
        return GraphCasts.count(
            (op.input("X")[0], op.output("Out")[0],
             dtype_name(block._var_recursive(op.output("Out")[0])))
            for op in block.ops if op.type == "cast" and is_forward(op))

    # -- the op walk: writing ------------------------------------------------------------------

    def _insert_cast(self, i: int, src: str, target: str, stem: str, plain: bool = False
                     ) -> str:
        var = self.block._var_recursive(src)
        out = self.block.create_var(name=unique_name.generate(stem), dtype=VARTYPE_OF[target],
                                    shape=var.shape, lod_level=var.lod_level, persistable=False,
                                    stop_gradient=var.stop_gradient)
        _insert_cast_op(self.block, i, var.name, out.name, var.dtype, out.dtype, self._role,
                        {} if plain else self._cast_attrs(var.dtype, out.dtype))
        return out.name

    def cast(self, before, value: str, dtype: str, plain: bool = False) -> str:
        out = self._insert_cast(self._at, value, dtype, f"{value}.cast_{SHORT_NAMES[dtype]}",
                                plain)
        self._at += 1
        return out

    def round(self, before, value: str, low: str) -> str:
        mid = self._insert_cast(self._at, value, low, f"{value}.emul_{SHORT_NAMES[low]}")
        out = self._insert_cast(self._at + 1, mid, "float32", f"{value}.emul")
        self._at += 2
        return out

    def set_input(self, slot: Slot, old: str, new: str) -> None:
        slot.owner._rename_input(old, new)

    def current(self, slot: Slot) -> str:
        return slot.owner.input(slot.name)[slot.index]

    def rewire_within(self, op, old: str, new: str) -> None:
        for each in [op, *_ops_within(op)]:
            each._rename_input(old, new)

    def chain_cast(self, op) -> None:
        op._set_attr("in_dtype", self.block._var_recursive(op.input("X")[0]).dtype)

    def overwritten(self, op) -> set:
        return set(op.output_arg_names)

    def float_outputs(self, op, kept) -> list:
        """XShape, the shape-only output of reshape2/flatten/transpose2..., holds no data."""
        return [name for slot in op.output_names if slot not in kept and slot != "XShape"
                for name in op.output(slot) if self.dtype(name) == "float32"]

    def retype(self, op, value: str, dtype: str) -> None:
        self.block._find_var_recursive(value).desc.set_dtype(VARTYPE_OF[dtype])

    def round_output(self, op, value: str, low: str) -> str:
        var = self.block._find_var_recursive(value)
        raw = self.block.create_var(name=unique_name.generate(f"{value}.raw"), dtype=var.dtype,
                                    shape=var.shape, lod_level=var.lod_level, persistable=False,
                                    stop_gradient=var.stop_gradient)
        op._rename_output(value, raw.name)
        mid = self._insert_cast(self._at + 1, raw.name, low, f"{value}.emul_{SHORT_NAMES[low]}")
        _insert_cast_op(self.block, self._at + 2, mid, var.name, VARTYPE_OF[low], var.dtype,
                        self._role, self._cast_attrs(VARTYPE_OF[low], var.dtype))
        self._at += 2
        return value

    probe = PROBE  # its device probe (``kernels``)

    def use_onednn(self, op) -> None:
        for name, value in onednn_attrs(op).items():
            op._set_attr(name, value)

    def use_onednn_casts(self, plain_readers: AbstractSet[str] = frozenset()) -> None:
        self._onednn_casts = True
        self._plain_readers = frozenset(plain_readers)

    def _cast_attrs(self, in_dtype, out_dtype) -> dict:
        """oneDNN's attributes for a cast between float32 and bfloat16, once the walk asked
        for them (``use_onednn_casts``); a cast's gradient op copies them."""
        pair = {DTYPE_OF.get(in_dtype), DTYPE_OF.get(out_dtype)}
        return onednn_attrs() if self._onednn_casts and pair == {"float32", "bfloat16"} else {}

    def require_grad(self, value: str) -> None:
        self.block._var_recursive(value).stop_gradient = False

    def set_param_dtype(self, names, dtype: str) -> None:
        for name in names:
            if self.block.has_var(name):
                self.block.var(name).desc.set_dtype(VARTYPE_OF[dtype])

    # -- O2's emulated float32 masters --------------------------------------------------------

    def new_master(self, param, name: str):
        return self.block.create_parameter(
            name=name, shape=param.shape, dtype="float32", trainable=True,
            optimize_attr=param.optimize_attr, regularizer=param.regularizer,
            need_clip=getattr(param, "need_clip", True))

    def master_grad(self, grad):
        """A plain cast where ``grad`` comes from the gradient op of a plain reader (its layout
        is one oneDNN's cast cannot read: ``use_onednn_casts``)."""
        g32 = self.block.create_var(name=unique_name.generate(f"{grad.name}.fp32"),
                                    dtype="float32", shape=grad.shape, persistable=False)
        writer = next((op for op in reversed(self.block.ops)
                       if grad.name in op.output_arg_names), None) if self._plain_readers \
            else None
        plain = writer is not None and writer.type.removesuffix("_grad") in self._plain_readers
        self.block.append_op(type="cast", inputs={"X": [grad]}, outputs={"Out": [g32]},
                             attrs={"in_dtype": grad.dtype, "out_dtype": g32.dtype,
                                    _ROLE: int(core.op_proto_and_checker_maker.OpRole.Backward),
                                    **({} if plain else
                                       self._cast_attrs(grad.dtype, g32.dtype))})
        return g32

    def write_cast(self, src, dst) -> None:
        with self.program._optimized_guard([]):
            self.block.append_op(type="cast", inputs={"X": [src]}, outputs={"Out": [dst]},
                                 attrs={"in_dtype": src.dtype, "out_dtype": dst.dtype,
                                        **self._cast_attrs(src.dtype, dst.dtype)})

    # -- loss scaling ----------------------------------------------------------------------------

    def optimizer_section(self):
        return self.program._optimized_guard([])

    def state_var(self, dtype: str, shape: list, value, stem: str):
        if self._startup_block is None:  # the startup program of the first build (backward)
            self._startup_block = paddle.static.default_startup_program().global_block()
        return paddle.static.create_global_var(shape=shape, value=value, dtype=dtype,
                                               persistable=True,
                                               name=unique_name.generate(stem))

    def scale_loss(self, loss, scale):
        out = self.block.create_var(name=unique_name.generate("scaled_loss"), dtype=loss.dtype,
                                    shape=loss.shape)
        self.block.append_op(type="elementwise_mul", inputs={"X": [loss], "Y": [scale]},
                             outputs={"Out": [out]}, attrs={"axis": -1})
        return out

    def unscale(self, grads: list, scale):
        by_dtype: dict = {}
        for g in grads:
            by_dtype.setdefault(g.dtype, []).append(g)
        ops, found = BlockOps(self.block), []
        for group in by_dtype.values():
            f = ops.tmp(VarType.BOOL)
            self.block.append_op(type="check_finite_and_unscale",
                                 inputs={"X": group, "Scale": [scale]},
                                 outputs={"Out": group, "FoundInfinite": [f]})
            found.append(f)
        for f in found[1:]:
            found[0] = ops.binary("logical_or", found[0], f, VarType.BOOL)
        return found[0]

    def all_reduce_max(self, flag, ring_id: int):
        """An int32 cast of the flag (the CPU/gloo kernels have no bool) all-reduced (max):
        ``c_allreduce_max`` where registered (Paddle 2.6), else ``all_reduce`` with
        ``reduce_type`` 1 = max (Paddle 3.x dropped ``c_allreduce_*``)."""
        ops = BlockOps(self.block)
        as_int = ops.cast(flag, VarType.INT32)
        if "c_allreduce_max" in framework.OpProtoHolder.instance().op_proto_map:
            self.block.append_op(type="c_allreduce_max", inputs={"X": [as_int]},
                                 outputs={"Out": [as_int]},
                                 attrs={"ring_id": ring_id, "use_calc_stream": True})
        else:
            self.block.append_op(type="all_reduce", inputs={"x": [as_int]},
                                 outputs={"out": [as_int]},
                                 attrs={"ring_id": ring_id, "reduce_type": 1})
        return ops.cast(as_int, VarType.BOOL)

    def record_nonfinite(self, found_inf, grads: list, dst) -> None:
        def build(sub):
            ops, flags = BlockOps(sub), []
            for g in grads:
                each = ops.unary("isfinite_v2", g, VarType.BOOL)
                flag = ops.tmp(VarType.BOOL)
                sub.append_op(type="reduce_all", inputs={"X": [each]}, outputs={"Out": [flag]},
                              attrs={"reduce_all": True, "dim": [0], "keep_dim": False})
                flags.append(flag)
            stacked = ops.tmp(VarType.BOOL)
            sub.append_op(type="stack", inputs={"X": flags}, outputs={"Y": [stacked]},
                          attrs={"axis": 0})
            ops.assign(stacked, dst)
        cond_block(self.program, self.block, found_inf, build)

    def state_ops(self) -> BlockOps:
        return BlockOps(self.block, self._startup_block)

    def fused_update(self, carrier, found_inf, state: dict, config) -> None:
        c = config
        self.block.append_op(
            type="update_loss_scaling",
            inputs={"X": [carrier], "FoundInfinite": [found_inf],
                    "PrevLossScaling": [state["scale"]], "InGoodSteps": [state["good_steps"]],
                    "InBadSteps": [state["bad_steps"]]},
            outputs={"Out": [carrier], "LossScaling": [state["scale"]],
                     "OutGoodSteps": [state["good_steps"]], "OutBadSteps": [state["bad_steps"]]},
            attrs={"incr_every_n_steps": c.growth_interval,
                   "decr_every_n_nan_or_inf": c.hysteresis, "incr_ratio": c.growth_factor,
                   "decr_ratio": c.backoff_factor, "stop_update": False})

    def clip(self, var, lo: float, hi: float) -> None:
        self.block.append_op(type="clip", inputs={"X": [var]}, outputs={"Out": [var]},
                             attrs={"min": lo, "max": hi})

    def mark(self) -> int:
        return len(self.block.ops)

    def skip(self, optimizer, mark: int, found_inf, grads: list, state: dict):
        return skip(self.program, self.block, optimizer, mark, found_inf, grads, state)

    # -- the numerics doctor ----------------------------------------------------------------

    def doctor_ops(self) -> tuple:
        """By op role: the optimizer's, the LR schedule's and the feed/fetch ops dropped."""
        return _doctor.doctor_ops(self.program, is_forward)

    def end_backward(self, params_grads: list) -> None:
        """Nothing: every op carries its role."""

    def float32_twin(self, clone):
        return _doctor.float32_twin(clone)

    def inserted_cast(self, op) -> bool:
        """By the rewrite's var-name suffixes (``.cast_fp16``, ``.emul``, ``.raw``)."""
        return _doctor.inserted_cast(op)

    def fetchable(self, clone, name: str) -> bool:
        return _doctor.fetchable(clone, name)

    def fetch_list(self, clone, names: list) -> list:
        return list(names)
