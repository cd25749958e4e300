"""The PIR program rewrite: the core's decisions applied to a Paddle 3 (PIR) program.

The PIR twin of ``rewrite.Rewriter``, with the same surface (``plan``,
``param_plan``, ``low_params``, ``set_low_params``, ``rewrite``) and the same
decisions: every op's PIR name and operand names are translated into the
legacy vocabulary (``opnames``) and the core's ``plan_op`` (for O2 parameter
storage ``plan_params``) decides, with the slots the table keeps fp32, the
inputs and outputs to round. This module only applies that answer; then,
before the backward pass is built (so gradient casts come from the forward
casts):

- each planned cast is a ``pd_op.cast`` inserted before the op (before the
  ``builtin.combine`` for list operands such as concat's), cached per value
  and target dtype (SSA: a value only changes under an in-place op);
- results of an op that runs in the low dtype are retyped to it (except the
  decision's ``kept_outputs``, statistics that stay fp32);
- an ``emulated`` op computes in fp32 on the inputs the decision rounds
  (``round_inputs``) and, with ``round_outputs``, rounds its results through
  the low dtype (cast low, cast back);
- operands that were attributes in the legacy IR (scale factors, axes,
  shapes: no gradient semantics) are never cast;
- a control-flow op (``pd_op.if``, ``pd_op.while``) runs its blocks in fp32:
  low-precision outer values it reads are cast to fp32, in its blocks too.

Ops are tracked by ``op.id()`` and values by ``value.id``, never by list index
or Python identity (builders insert at the start of the block; two wrappers
of one value are different objects). ``==`` is never applied to values: on a
PIR value it builds an ``equal`` op.
"""
from __future__ import annotations

import collections.abc
import dataclasses
from typing import AbstractSet, Any, Iterator, Optional

import paddle
from amp_adapters import (AmpConfigError, CastReport, OpDecision, ParamPlan, ParamUse, Policy,
                          plan_op, plan_params)
from amp_adapters.dtypes import FLOAT_DTYPES, LOW_DTYPES, dtype_name
from amp_adapters.fallback import FallbackNotices

from . import opnames
from .pir_guard import guarded_ops

_pir = paddle.base.libpaddle.pir
_DEVICE = "this device"  # the kernels set was probed on the place the program will run on
_CONTROL_FLOW = "control flow: its blocks run in float32"


def value_dtype(value) -> Optional[str]:
    """The floating dtype of a dense-tensor PIR ``value`` ('float16'...), else None."""
    if value is None or not value.initialized() or not value.is_dense_tensor_type():
        return None
    name = dtype_name(value.dtype)
    return name if name in FLOAT_DTYPES else None


def _name(value) -> Optional[str]:
    """A value's name where PIR keeps one (data, parameters, persistables), else None."""
    try:
        return value.name if value.has_name else None
    except (ValueError, RuntimeError):
        return None


def _nested_ops(op) -> list:
    """Every op in ``op``'s blocks, and in theirs, recursively."""
    out = []
    for block in op.blocks():
        for inner in block.ops:
            out.append(inner)
            if inner.num_regions():
                out.extend(_nested_ops(inner))
    return out


class _Attrs(collections.abc.Mapping):
    """An op's attributes, read on demand: the core looks only at those its rules name (so
    the rewrite keeps no copy of which ops have conditional rules)."""

    def __init__(self, op) -> None:
        self._op = op
        self._read: Optional[dict] = None

    def _all(self) -> dict:
        if self._read is None:
            self._read = dict(self._op.attrs())
        return self._read

    def __getitem__(self, name: str) -> Any:
        return self._all()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._all())

    def __len__(self) -> int:
        return len(self._all())


@dataclasses.dataclass(frozen=True)
class _Slot:
    """One tensor input of an op: ``owner.operand(index)`` reads ``value`` (``owner`` is the op
    itself, or the ``builtin.combine`` that packs a list operand such as concat's ``x``)."""

    owner: object
    index: int
    name: str  # the op's operand name (snake_case)
    value: object
    cast: bool  # False: an attribute turned operand (no gradient semantics), never cast


@dataclasses.dataclass
class PirRewriter:
    """Rewrites the global block of PIR programs under one policy on one device's kernels.

    ``use_guard``: only ops built inside ``paddle_amp.fp16_guard()`` may leave fp32.
    ``black_varnames``: ops reading or writing these named values run in fp32.
    """

    policy: Policy
    kernels: Optional[AbstractSet[str]]  # legacy names with a low kernel here; None: all (GPU)
    use_guard: bool = False
    black_varnames: AbstractSet[str] = frozenset()

    def __post_init__(self) -> None:
        self._notices = FallbackNotices("paddle_amp")  # each op type warns once per decorate
        self._guarded: frozenset[int] = frozenset()

    # -- decisions ---------------------------------------------------------------------------

    def _forced_fp32(self, op) -> Optional[str]:
        if self.use_guard and op.id() not in self._guarded:
            return "outside fp16_guard"
        if self.black_varnames:
            values = list(op.operands_source()) + list(op.results())
            if any(_name(v) in self.black_varnames for v in values):
                return "uses a custom_black_varnames var"
        return None

    def _slots(self, op) -> list[_Slot]:
        """The op's inputs, list operands unpacked, with whether each may be cast."""
        names = op.get_input_names()
        grads = op.get_input_grad_semantics()
        out = []
        for i, value in enumerate(op.operands_source()):
            name = names[i] if i < len(names) else str(i)
            cast = grads[i] if i < len(grads) else False
            if value.initialized() and value.is_combine():
                combine = value.get_defining_op()
                out.extend(_Slot(combine, j, name, v, cast)
                           for j, v in enumerate(combine.operands_source()))
            else:
                out.append(_Slot(op, i, name, value, cast))
        return out

    def plan(self, op, slots: list[_Slot], force_fp32: Optional[str] = None) -> OpDecision:
        """The core's decision for ``op`` given the current dtypes of its ``slots`` (named in
        the legacy vocabulary, so the core keeps the table's fp32 slots: ``kept``)."""
        legacy = opnames.legacy_name(op.name())
        dtypes = [value_dtype(s.value) if s.cast else None for s in slots]
        decision = plan_op(self.policy, "paddle", legacy, dtypes, lowp_kernels=self.kernels,
                           attrs=_Attrs(op), force_fp32=force_fp32 or self._forced_fp32(op),
                           input_names=[opnames.camel(s.name) for s in slots])
        self._notices.note(legacy, _DEVICE, decision)
        return decision

    # -- O2 parameters -------------------------------------------------------------------------

    def param_plan(self, program) -> ParamPlan:
        """O2: the storage dtype of every parameter, decided by the core (``plan_params``)
        from its readers; an op in a control-flow block runs in float32."""
        self._prepare(program)
        top = {op.id() for op in program.global_block().ops}
        uses: dict[str, list[ParamUse]] = {}
        for param in _parameters(program):
            uses[param.name] = [use for user in param.all_used_ops()
                                for use in self._param_uses(user, param, user.id() in top)]
        return plan_params(self.policy, "paddle", uses, lowp_kernels=self.kernels)

    def _param_uses(self, user, param, top: bool) -> list[ParamUse]:
        """How ``user`` (``top``: an op of the global block, not of a control-flow block)
        reads ``param``: one ``ParamUse`` per operand slot it feeds."""
        if user.num_regions() or not top:
            return [ParamUse(opnames.legacy_name(user.name()), force_fp32=_CONTROL_FLOW)]
        if opnames.is_plumbing(user.name()) and user.name() != "builtin.combine":
            return [ParamUse(user.name(), force_fp32="program plumbing reads the stored value")]
        if user.name() == "builtin.combine":  # a list operand: the op reading the list
            user = user.result(0).all_used_ops()[0]
        legacy, attrs, forced = opnames.legacy_name(user.name()), _Attrs(user), \
            self._forced_fp32(user)
        slots = [opnames.camel(s.name) for s in self._slots(user) if s.value.is_same(param)]
        return [ParamUse(legacy, attrs, slot, forced) for slot in slots or [None]]

    def low_params(self, program, optimizer_type: Optional[str] = None) -> frozenset[str]:
        """O2: the parameters stored in the low dtype (see ``param_plan``); none when
        ``optimizer_type`` has no low kernel here (PIR has no emulated masters)."""
        if optimizer_type is not None and self.kernels is not None \
                and optimizer_type not in self.kernels:
            return frozenset()
        return self.param_plan(program).low

    def set_low_params(self, program, names: AbstractSet[str]) -> None:
        """Declare the parameters ``names`` in the low dtype (O2; ``amp_init`` converts values)."""
        for param in _parameters(program):
            if param.name in names and value_dtype(param) == "float32":
                param.set_type(_retyped(param, self.policy.dtype))

    # -- rewrite ------------------------------------------------------------------------------

    def _prepare(self, program) -> None:
        self._guarded = guarded_ops(program) if self.use_guard else frozenset()
        if self.use_guard and not self._guarded:
            raise AmpConfigError(
                "use_fp16_guard/use_amp_guard is set, but no op of this PIR program was built "
                "inside paddle_amp.fp16_guard(). Under PIR ops keep no name scope, so "
                "paddle.static.amp.fp16_guard() leaves no trace: build the guarded part "
                "inside `with paddle_amp.fp16_guard():`, or decorate without the guard")
        if self.black_varnames:
            named = {_name(v) for op in program.global_block().ops
                     for v in op.results()} - {None}
            unknown = sorted(set(self.black_varnames) - named)
            if unknown:
                raise AmpConfigError(
                    f"custom_black_varnames {unknown} name no value of this PIR program: "
                    f"under PIR only data, parameters and persistable values keep a name. "
                    f"Name those, or keep the op in fp32 with custom_black_list")

    def rewrite(self, program) -> CastReport:
        """Rewrite the forward ops of ``program``'s global block; return the decisions."""
        self._prepare(program)
        self._cast_of: dict[tuple[int, str], object] = {}
        self._rounded: set[int] = set()
        decisions = []
        try:
            for op in list(program.global_block().ops):  # a snapshot: inserted casts not seen
                if opnames.is_plumbing(op.name()):
                    continue
                if op.num_regions():
                    decisions.append(self._control_flow(op))
                    continue
                slots = self._slots(op)
                d = self.plan(op, slots)
                decisions.append(d)
                if op.name() != "pd_op.cast":  # a cast after a cast is a chain: nothing to do
                    self._inputs(op, slots, d)
                    self._outputs(op, d)
                if op.name().endswith("_"):  # in-place: casts of the values it wrote are stale
                    self._forget(op)
        finally:
            paddle.pir.reset_insertion_point_to_end()
        self._notices.summarize("paddle_amp: program", decisions, _DEVICE)
        return CastReport("paddle", tuple(decisions))

    def _inputs(self, op, slots: list[_Slot], d: OpDecision) -> None:
        for slot, target in zip(slots, d.casts):
            if target is not None:
                slot.owner.operand(slot.index).set_source(self._cast(slot.owner, slot.value,
                                                                     target))
        for slot, rnd in zip(slots, d.round_inputs):
            if rnd:
                current = slot.owner.operand_source(slot.index)
                slot.owner.operand(slot.index).set_source(self._round(slot.owner, current))
        for owner in {id(s.owner): s.owner for s in slots if s.owner is not op}.values():
            _retype_combine(owner)

    def _cast(self, before, value, target: str):
        """``value`` in ``target``, inserted before the op ``before`` (cached)."""
        if value_dtype(value) == target:
            return value
        key = (value.id, target)
        if key not in self._cast_of:
            paddle.pir.set_insertion_point(before)
            self._cast_of[key] = paddle.cast(value, target)
        return self._cast_of[key]

    def _round(self, before, value):
        """``value`` rounded through the low dtype (emulation), as a float32 value."""
        if value.id in self._rounded or value_dtype(value) != "float32":
            return value
        key = (value.id, "round")
        if key not in self._cast_of:
            low = self._cast(before, value, self.policy.dtype)
            paddle.pir.set_insertion_point(before)
            out = paddle.cast(low, "float32")
            self._cast_of[key] = out
            self._rounded.add(out.id)
        return self._cast_of[key]

    def _outputs(self, op, d: OpDecision) -> None:
        """Retype (low) or round (emulated) ``op``'s float32 results."""
        if d.run_dtype is None:
            return
        keep = {opnames.snake(s) for s in d.kept_outputs}
        names = op.get_output_names()
        for i, result in enumerate(op.results()):
            if (names[i] if i < len(names) else "") in keep or value_dtype(result) != "float32":
                continue
            if d.run_dtype in LOW_DTYPES:
                if not _fixed_dtype(op):  # its infer-meta is not re-run: only retype results
                    result.set_type(_retyped(result, d.run_dtype))  # that follow the inputs
            elif d.round_outputs:
                paddle.pir.set_insertion_point_after(op)
                low = paddle.cast(result, d.low_dtype)
                back = paddle.cast(low, "float32")
                result.replace_all_uses_with(back)
                low.get_defining_op().operand(0).set_source(result)
                self._rounded.add(back.id)

    def _forget(self, op) -> None:
        """Drop cached casts of values an in-place ``op`` overwrote."""
        ids = {v.id for v in op.operands_source() if v.initialized()}
        for key in [k for k in self._cast_of if k[0] in ids]:
            del self._cast_of[key]
        self._rounded -= ids

    def _control_flow(self, op) -> OpDecision:
        """A control-flow op: its blocks run in fp32, so low-precision values it reads (as
        operands or directly from the enclosing block) are cast to fp32, everywhere inside."""
        outer = list(op.operands_source()) + list(_pir.get_used_external_value(op))
        values, seen = [], set()
        for v in outer:
            if v.initialized() and v.id not in seen:
                seen.add(v.id)
                values.append(v)
        d = plan_op(self.policy, "paddle", opnames.legacy_name(op.name()),
                    [value_dtype(v) for v in values], lowp_kernels=self.kernels,
                    force_fp32=_CONTROL_FLOW)
        for value, target in zip(values, d.casts):
            if target is None:
                continue
            new = self._cast(op, value, target)
            for user in [op, *_nested_ops(op)]:
                for i, source in enumerate(user.operands_source()):
                    if source.initialized() and source.is_same(value):
                        user.operand(i).set_source(new)
        return d


def _fixed_dtype(op) -> bool:
    """True if ``op``'s result dtype is set by its ``dtype`` attribute (``sum(x,
    dtype='float32')``), not by its inputs: such a result keeps its declared dtype."""
    if not op.has_attr("dtype"):
        return False
    return not str(op.attrs()["dtype"]).endswith("UNDEFINED")


def _parameters(program) -> list:
    """The parameter values of ``program``'s global block (``builtin.parameter`` results)."""
    return [op.result(0) for op in program.global_block().ops
            if op.name() == "builtin.parameter"]


def _retyped(value, dtype: str):
    """``value``'s type with ``dtype`` as element type (a throwaway cast supplies the type)."""
    paddle.pir.set_insertion_point_after(value.get_defining_op())
    probe = paddle.cast(value, dtype)
    new = paddle.pir.create_shaped_type(probe.type(), value.shape)
    probe.get_defining_op().erase()
    paddle.pir.reset_insertion_point_to_end()
    return new


def _retype_combine(combine) -> None:
    """A ``builtin.combine`` whose inputs changed dtype: its vector result follows them."""
    result = combine.result(0)
    result.set_type(_pir.create_vec_type([v.type() for v in combine.operands_source()]))


__all__ = ["PirRewriter", "value_dtype"]
