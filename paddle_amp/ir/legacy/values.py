"""The legacy IR's values and op walk (``protocol.ValuesIR``): var names, their dtypes and
shapes, the forward ops in order, their slots, guards and readers.

The walk's position is a ``Cursor`` it owns, on the op it yields; writing inserts where the
cursor of the op it is given says (``writing``).
"""
from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Iterator, Optional

from paddle.base import core, framework

from amp_adapters import ParamUse
from amp_adapters.rules.dtypes import FLOAT_DTYPES
from amp_adapters.rules.oplists import passes_through
from amp_adapters.services.report import GraphCasts, cast_bytes

from ...env import VarType, dtype_name
from ..protocol import CONTROL_FLOW, OpAttrs, Slot
from .guard import in_guard

_ROLE = core.op_proto_and_checker_maker.kOpRoleAttrName()
_NOT_FORWARD = int(core.op_proto_and_checker_maker.OpRole.Backward) | int(
    core.op_proto_and_checker_maker.OpRole.Optimize) | int(
    core.op_proto_and_checker_maker.OpRole.LRSched)
_IO_OPS = frozenset({"feed", "fetch", "fetch_v2", "read", "create_py_reader"})
_NOT_TENSORS = (VarType.FEED_MINIBATCH, VarType.FETCH_LIST, VarType.READER, VarType.RAW)
RECAST = ".recast"  # in the name of a copy the backward casts again (``recompute``)


def is_forward(op) -> bool:
    """True for an op of the forward pass (not backward, optimizer or LR schedule)."""
    return not op.has_attr(_ROLE) or not int(op.attr(_ROLE)) & _NOT_FORWARD


def role(op) -> int:
    """``op``'s op role (0, forward, where it has none)."""
    return op.attr(_ROLE) if op.has_attr(_ROLE) else 0


@dataclasses.dataclass
class Cursor:
    """Where the walk stands, made explicit (``forward_ops``): ``op`` and its position ``at``
    in the block, which every op inserted before it, or after it as the rounding of its
    results, moves on (``at`` then is the last op written for it: the walk goes on after
    it); ``role``: its op role, given to those ops. Kept by position, so each insert is one
    desc insert (no whole-block sync, no Python stack capture: what made a rewrite
    quadratic)."""

    op: Any
    at: int
    role: int

    @classmethod
    def find(cls, block, op) -> "Cursor":
        """A cursor on ``op``, found in ``block`` (an insert away from the walk's op)."""
        return cls(op, next(i for i, each in enumerate(block.ops) if each is op), role(op))


class Values:
    """``LegacyProgram``'s values and walk (reading)."""

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
        """Each forward op, with the walk's ``Cursor`` on it (``self.cursor``) while the caller
        inserts around it; the ops inserted are stepped over."""
        self.block._sync_with_cpp()  # once; every insert keeps Python and C++ in step
        at = 0
        try:
            while at < len(self.block.ops):
                op = self.block.ops[at]
                if is_forward(op) and op.type not in _IO_OPS:
                    self.cursor = cursor = Cursor(op, at, role(op))
                    yield op
                    at = cursor.at
                at += 1
        finally:
            self.cursor = None

    def op_type(self, op) -> str:
        return op.type

    def attrs(self, op):
        return OpAttrs(lambda: op.attr_names, op.attr)

    def slots(self, op) -> list[Slot]:
        return [Slot(op, i, slot, name) for slot in op.input_names
                for i, name in enumerate(op.input(slot))]

    control_flow_slots = slots

    def guarding(self):
        """Nothing to record: each op keeps its name scope (``in_guard``)."""
        return contextlib.nullcontext()

    def in_guard(self, op) -> bool:
        return in_guard(op)

    def var_names(self, op) -> set:
        return set(op.input_arg_names + op.output_arg_names)

    def instance_names(self, op) -> tuple[str, ...]:
        """The names the policy's layer rules match ``op`` by: its output vars
        (``dense2.tmp_0``), the parameters it reads (``dense2.w_0``) and its name scope."""
        scope = (op.attr("op_namescope") or "").strip("/") if op.has_attr("op_namescope") \
            else ""
        return (*op.output_arg_names, *(n for n in op.input_arg_names if self.is_param(n)),
                *((scope,) if scope else ()))

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

    def param_uses(self, forced, shape_of, instance_of=lambda op: None
                   ) -> dict[str, list[ParamUse]]:
        readers, use = self._uses(forced, shape_of, instance_of)
        return {p.name: [use(i, op, slot) for i, op, slot in readers.get(p.name, ())]
                for p in self.block.all_parameters()}

    def result_uses(self, op, forced, shape_of, instance_of=lambda op: None
                    ) -> tuple[ParamUse, ...]:
        """The readers are mapped once per walk (``prepare``), at its first question: the
        ops after the walk's op are not rewritten yet, and the casts put in before it never
        read its results, so the map answers as a new one would (one per op made O2's walk
        quadratic)."""
        if self._walk_readers is None:
            forward = self._forward_list()
            self._walk_readers = (self._readers(forward),
                                  {id(o): i for i, o in enumerate(forward)})
        readers, index = self._walk_readers
        use = self._use(readers, forced, shape_of, instance_of, lone=True)
        at = index[id(op)]
        return tuple(use(j, reader, s) for out in op.output_arg_names
                     for j, reader, s in readers.get(out, ()) if j > at)

    def _forward_list(self) -> list:
        return [op for op in self.block.ops if is_forward(op) and op.type not in _IO_OPS]

    def _uses(self, forced, shape_of, instance_of):
        """({var name: [(index, forward op, slot) reading it]}, use(index, op, slot) ->
        ``ParamUse``, listing the later readers of an op that only moves values)."""
        readers = self._readers(self._forward_list())
        return readers, self._use(readers, forced, shape_of, instance_of)

    @staticmethod
    def _readers(forward: list) -> dict[str, list[tuple[int, object, str]]]:
        """{var name: [(index, forward op, slot) reading it]} over the ops ``forward``."""
        readers: dict[str, list[tuple[int, object, str]]] = {}
        for i, op in enumerate(forward):
            for slot in op.input_names:
                for name in op.input(slot):
                    readers.setdefault(name, []).append((i, op, slot))
        return readers

    def _use(self, readers: dict, forced, shape_of, instance_of, lone: bool = False):
        """use(index, op, slot) -> ``ParamUse``, listing the later readers (in ``readers``)
        of an op that only moves values; ``lone``: also of the first op that computes on
        the way (a result's readers: ``plan_op`` judges an op between float32 neighbours
        with them, ``ProgramIR.result_uses``)."""
        def use(i: int, op, slot: str, expand: bool = lone) -> ParamUse:
            reason = CONTROL_FLOW if op.has_attr("sub_block") else forced(op)
            attrs = self.attrs(op)
            then = None
            moves = passes_through("paddle", op.type, attrs)
            if reason is None and (moves or expand):
                then = tuple(use(j, reader, s, expand and moves)
                             for out in op.output_arg_names
                             for j, reader, s in readers.get(out, ()) if j > i)
            return ParamUse(op.type, attrs, slot, reason, then, shape_of(op), instance_of(op))

        return use

    def end_forward(self) -> None:
        """Nothing: every op carries its role (forward, backward, optimize)."""

    def graph_casts(self) -> Optional[GraphCasts]:
        """Forward ``cast`` ops (not the backward's), emulation's round trips apart, with the
        bytes each writes where its shape is known (a batch not yet fed is not); and the
        backward's casts of copies made again (``recompute``)."""
        block = self.block

        def entry(op):
            out = block._var_recursive(op.output("Out")[0])
            return (op.input("X")[0], op.output("Out")[0], dtype_name(out),
                    cast_bytes(tuple(out.shape), dtype_name(out)))
        return GraphCasts.count((entry(op) for op in block.ops
                                 if op.type == "cast" and is_forward(op)),
                                (entry(op)[3] for op in block.ops if op.type == "cast"
                                 and not is_forward(op) and RECAST in op.output("Out")[0]))
