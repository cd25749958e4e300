"""PIR's values and op walk (``protocol.ValuesIR``): values, their dtypes and shapes, the
forward ops (plumbing skipped), their slots in the legacy vocabulary (``opnames``), guards
and readers. Ops are tracked by ``op.id()`` and values by ``value.id``, never by index or
Python identity, and ``==`` is never applied to a value (it builds an ``equal`` op).
"""
from __future__ import annotations

from typing import Iterator, Optional

import paddle

from amp_adapters import AmpConfigError, ParamUse, dtype_name
from amp_adapters.rules.dtypes import FLOAT_DTYPES
from amp_adapters.rules.oplists import passes_through
from amp_adapters.services.report import GraphCasts, cast_bytes

from ..protocol import CONTROL_FLOW, OpAttrs, Slot
from . import opnames
from .guard import guarded_ops, recording

_pir = paddle.base.libpaddle.pir


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


def _attrs(op) -> OpAttrs:
    return OpAttrs(lambda: op.attrs().keys(), lambda name: op.attrs()[name])


def _parameters(program) -> list:
    """The parameter values of ``program``'s global block (``builtin.parameter`` results)."""
    return [op.result(0) for op in program.global_block().ops
            if op.name() == "builtin.parameter"]


def _retype_combine(combine) -> None:
    """A ``builtin.combine`` whose inputs changed dtype: its vector result follows them."""
    result = combine.result(0)
    result.set_type(_pir.create_vec_type([v.type() for v in combine.operands_source()]))


class Values:
    """``PirProgram``'s values and walk (reading)."""

    @property
    def block(self):
        return self.program.global_block()

    # -- values --------------------------------------------------------------------------------

    def dtype(self, value) -> Optional[str]:
        return value_dtype(value)

    def rank(self, value) -> Optional[int]:
        return len(value.shape) if value.is_dense_tensor_type() else None

    def shape(self, value) -> Optional[tuple[Optional[int], ...]]:
        if not value.is_dense_tensor_type():
            return None
        return tuple(d if d >= 0 else None for d in value.shape)

    def key(self, value):
        return value.id

    def is_param(self, value) -> bool:
        maker = value.get_defining_op()
        return maker is not None and maker.name() == "builtin.parameter"

    def holds_var(self, name: str) -> bool:
        return any(op.name() == "pd_op.data" and op.result(0).name == name
                   for op in self.block.ops)

    def reached_params(self, loss) -> set[str]:
        params, seen, todo = set(), set(), [loss]
        while todo:
            value = todo.pop()
            if not value.initialized() or value.id in seen:  # (an empty optional operand)
                continue
            seen.add(value.id)
            if value.is_dense_tensor_type() and (value.stop_gradient or
                                                 value_dtype(value) is None):
                continue  # no gradient flows through it (PIR marks argmax's int64 result
                # as not stop_gradient, but no gradient reaches an integer value)
            op = value.get_defining_op()
            if op is None:  # a block argument
                continue
            if op.name() == "builtin.parameter":
                params.add(value.name)
                continue
            todo.extend(op.operands_source())
            if op.num_regions():  # what its blocks read from outside
                todo.extend(_pir.get_used_external_value(op))
        return params

    def persistables(self) -> list[str]:
        """The parameters and the persistable ``pd_op.data`` values (optimizer accumulators,
        the learning rate, the loss-scale state) of the global block."""
        return [op.result(0).name for op in self.block.ops
                if op.name() == "builtin.parameter"
                or (op.name() == "pd_op.data" and op.result(0).persistable)]

    # -- the op walk: reading ------------------------------------------------------------------

    def prepare(self, use_guard, black_varnames) -> None:
        """Ops keep no name scope under PIR, and only data, parameters and persistables keep a
        name: a guard that recorded nothing, or a black var name that names nothing, would
        silently mean nothing, so each is an error."""
        self._guarded = guarded_ops(self.program) if use_guard else frozenset()
        self._top = None  # the ids of the global block's ops (``result_uses``)
        if use_guard and not self._guarded:
            raise AmpConfigError(
                "use_fp16_guard/use_bf16_guard/use_amp_guard is set, but no op of this PIR "
                "program was built inside a guard: paddle_amp.fp16_guard(), "
                "paddle_amp.bf16.bf16_guard() or the native paddle.static.amp.fp16_guard(), "
                "paddle.static.amp.bf16.bf16_guard(). Under PIR ops keep no name scope, so a "
                "guard is seen only when entered after paddle_amp was imported: import "
                "paddle_amp before building the model, build the guarded part inside `with "
                "paddle_amp.fp16_guard():` (bf16: `with paddle_amp.bf16.bf16_guard():`), or "
                "decorate without the guard")
        if black_varnames:
            named = {_name(v) for op in self.block.ops for v in op.results()} - {None}
            unknown = sorted(set(black_varnames) - named)
            if unknown:
                raise AmpConfigError(
                    f"custom_black_varnames {unknown} name no value of this PIR program: "
                    f"under PIR only data, parameters and persistable values keep a name. "
                    f"Name those, or keep the op in fp32 with custom_black_list")

    def forward_ops(self) -> Iterator:
        try:
            for op in list(self.block.ops):  # a snapshot: inserted casts not seen
                if not opnames.is_plumbing(op.name()):
                    yield op
        finally:
            paddle.pir.reset_insertion_point_to_end()

    def op_type(self, op) -> str:
        return opnames.legacy_name(op.name())

    def attrs(self, op):
        return _attrs(op)

    def slots(self, op) -> list[Slot]:
        """List operands unpacked (their ``builtin.combine`` owns them)."""
        names = op.get_input_names()
        grads = op.get_input_grad_semantics()
        out = []
        for i, value in enumerate(op.operands_source()):
            name = opnames.camel(names[i] if i < len(names) else str(i))
            cast = grads[i] if i < len(grads) else False
            if value.initialized() and value.is_combine():
                combine = value.get_defining_op()
                _retype_combine(combine)  # its inputs may have been retyped since it was built
                out.extend(Slot(combine, j, name, v, cast)
                           for j, v in enumerate(combine.operands_source()))
            else:
                out.append(Slot(op, i, name, value, cast))
        return out

    def control_flow_slots(self, op) -> list[Slot]:
        outer = list(op.operands_source()) + list(_pir.get_used_external_value(op))
        slots, seen = [], set()
        for v in outer:
            if v.initialized() and v.id not in seen:
                seen.add(v.id)
                slots.append(Slot(op, len(slots), "Input", v))
        return slots

    def guarding(self):
        """Record the ops built inside (PIR ops keep no name scope)."""
        return recording(self.program)

    def in_guard(self, op) -> bool:
        return op.id() in self._guarded

    def var_names(self, op) -> set:
        return {_name(v) for v in list(op.operands_source()) + list(op.results())} - {None}

    def instance_names(self, op) -> tuple[str, ...]:
        """The names the policy's layer rules match ``op`` by: the parameters it reads
        (``dense2.w_0``: what PIR keeps of a layer's name, as the legacy IR's
        ``instance_names`` also gives), its named results, and its ``struct_name``. PIR
        keeps no other value name and no name scope (PIR_NOTES P12)."""
        params = [_name(v) for v in op.operands_source()
                  if v.initialized() and self.is_param(v)]
        results = [_name(v) for v in op.results()]
        struct = op.attrs().get("struct_name") if op.has_attr("struct_name") else None
        return tuple(n for n in (*results, *params, struct) if isinstance(n, str) and n)

    def is_control_flow(self, op) -> bool:
        return bool(op.num_regions())

    def is_cast(self, op) -> bool:
        return op.name() == "pd_op.cast"

    def is_output(self, op, loss) -> bool:
        results = op.results()
        if loss is not None and any(r.is_same(loss) for r in results):
            return True
        return all(r.use_empty() for r in results) and any(
            value_dtype(r) in FLOAT_DTYPES for r in results)

    def param_uses(self, forced, shape_of, instance_of=lambda op: None
                   ) -> dict[str, list[ParamUse]]:
        top = {op.id() for op in self.block.ops}
        return {param.name: [use for user in param.all_used_ops()
                             for use in self._param_uses(user, param, top, forced, shape_of,
                                                         instance_of)]
                for param in _parameters(self.program)}

    def result_uses(self, op, forced, shape_of, instance_of=lambda op: None
                    ) -> tuple[ParamUse, ...]:
        """The global block's ops are listed once per walk (``prepare``), at its first
        question: the casts the walk puts in never read a result not yet decided (one
        listing per op made O2's walk quadratic)."""
        if self._top is None:
            self._top = frozenset(o.id() for o in self.block.ops)
        top = self._top
        return tuple(use for result in op.results() for reader in result.all_used_ops()
                     if self._forward is None or reader.id() in self._forward
                     for use in self._param_uses(reader, result, top, forced, shape_of,
                                                 instance_of, lone=True))

    def _param_uses(self, user, param, top: frozenset, forced, shape_of,
                    instance_of, lone: bool = False) -> list[ParamUse]:
        """How ``user`` (an op of the global block when its id is in ``top``, else of a
        control-flow block) reads ``param``: one ``ParamUse`` per operand slot it feeds; an
        op that only moves values lists the readers of its results (``ParamUse.then``), and
        with ``lone`` so does the first op that computes on the way (a result's readers:
        ``plan_op`` judges an op between float32 neighbours with them)."""
        if user.num_regions() or user.id() not in top:
            return [ParamUse(opnames.legacy_name(user.name()), force_fp32=CONTROL_FLOW)]
        if opnames.is_plumbing(user.name()) and user.name() != "builtin.combine":
            return [ParamUse(user.name(), force_fp32="program plumbing reads the stored value")]
        if user.name() == "builtin.combine":  # a list operand: the op reading the list
            user = user.result(0).all_used_ops()[0]
        legacy, attrs, why = opnames.legacy_name(user.name()), _attrs(user), forced(user)
        slots = [s.name for s in self.slots(user) if s.value.is_same(param)]
        then = None
        moves = passes_through("paddle", legacy, attrs)
        if why is None and (moves or lone):  # judged by its readers
            then = tuple(use for result in user.results() for reader in result.all_used_ops()
                         if self._forward is None or reader.id() in self._forward
                         for use in self._param_uses(reader, result, top, forced, shape_of,
                                                     instance_of, lone and moves))
        return [ParamUse(legacy, attrs, slot, why, then, shape_of(user), instance_of(user))
                for slot in slots or [None]]

    def end_forward(self) -> None:
        """PIR ops carry no role: the forward pass is the ops there before the backward."""
        self._forward = frozenset(op.id() for op in self.block.ops)

    def graph_casts(self) -> GraphCasts:
        """The ``pd_op.cast`` ops of the forward pass (all of them in a program with no
        backward), emulation's round trips apart, as on the legacy IR. Not the backward's:
        the gradient of each forward cast is a cast back, so a trained program holds about
        twice as many (22 for the emulated MLP whose forward holds 12). With the bytes each
        writes where its shape is known (a batch not yet fed is not); and the backward's
        casts of copies made again (``recompute``)."""
        def entry(op):
            out = op.result(0)
            return (op.operand_source(0).id, out.id, value_dtype(out),
                    cast_bytes(tuple(out.shape), value_dtype(out)))
        return GraphCasts.count(
            (entry(op) for op in self.block.ops if op.name() == "pd_op.cast" and
             (self._forward is None or op.id() in self._forward)),
            (entry(op)[3] for op in self.block.ops if op.id() in self._recasts))
