"""``PirProgram``: the ``ProgramIR`` protocol on a Paddle 3 PIR program.

PIR names and operand names are given in the legacy vocabulary (``opnames``),
so the core decides the same for both IRs. A cast is a ``pd_op.cast`` inserted
before the op (before the ``builtin.combine`` of a list operand such as
concat's); a low op's results are retyped (its infer-meta is not re-run, so
never a result whose dtype an attribute fixes); operands that were attributes
in the legacy IR (scale factors, axes, shapes: no gradient semantics) are
never cast. Ops are tracked by ``op.id()`` and values by ``value.id``, never by
index or Python identity, and ``==`` is never applied to a value (it builds an
``equal`` op).
"""
from __future__ import annotations

import contextlib
from typing import Iterator, Optional

import paddle
from paddle.base import unique_name
from paddle.nn.initializer import Constant

from amp_adapters import AmpConfigError, ParamUse
from amp_adapters.oplists import passes_through
from amp_adapters.dtypes import FLOAT_DTYPES, dtype_name
from amp_adapters.report import GraphCasts

from ... import opnames
from .guard import guarded_ops
from ..protocol import CONTROL_FLOW, OpAttrs, Slot
from . import doctor as _doctor
from .probe import PROBE
from .ops import PIR_OPS, PirOps

_pir = paddle.base.libpaddle.pir

# Why ``paddle_amp.doctor`` refuses a PIR program whose forward and backward were not marked.
NO_DOCTOR = ("paddle_amp.doctor: this PIR program's forward and backward were not marked by a "
             "paddle_amp-decorated optimizer: build it with that optimizer's minimize() (or "
             "backward() and apply_gradients()), then examine it")


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


def _attrs(op) -> OpAttrs:
    return OpAttrs(lambda: op.attrs().keys(), lambda name: op.attrs()[name])


class PirProgram:
    """A ``paddle.pir.Program``, through the ``ProgramIR`` protocol."""

    name = "pir"

    def __init__(self, program) -> None:
        self.program = program
        self._guarded: frozenset[int] = frozenset()
        self._forward: Optional[frozenset[int]] = None  # op ids, once the backward is built
        self._inserted: set[int] = set()  # the ids of the cast ops the rewrite inserted
        self._namings: dict = {}  # the doctor's: id(program) -> (program, Naming)
        self._grad_names: dict = {}
        self._grads: dict = {}  # grad value id -> parameter name, once the backward is built
        self._inserted_at: set[int] = set()
        self._top: Optional[frozenset[int]] = None  # (``result_uses``)

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
                "use_fp16_guard/use_amp_guard is set, but no op of this PIR program was built "
                "inside paddle_amp.fp16_guard() or paddle.static.amp.fp16_guard(). Under PIR "
                "ops keep no name scope, so a guard is seen only when entered after "
                "paddle_amp was imported: import paddle_amp before building the model, build "
                "the guarded part inside `with paddle_amp.fp16_guard():`, or decorate without "
                "the guard")
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

    def in_guard(self, op) -> bool:
        return op.id() in self._guarded

    def var_names(self, op) -> set:
        return {_name(v) for v in list(op.operands_source()) + list(op.results())} - {None}

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

    def param_uses(self, forced, shape_of) -> dict[str, list[ParamUse]]:
        top = {op.id() for op in self.block.ops}
        return {param.name: [use for user in param.all_used_ops()
                             for use in self._param_uses(user, param, top, forced, shape_of)]
                for param in _parameters(self.program)}

    def result_uses(self, op, forced, shape_of) -> tuple[ParamUse, ...]:
        """The global block's ops are listed once per walk (``prepare``), at its first
        question: the casts the walk puts in never read a result not yet decided (one
        listing per op made O2's walk quadratic)."""
        if self._top is None:
            self._top = frozenset(o.id() for o in self.block.ops)
        top = self._top
        return tuple(use for result in op.results() for reader in result.all_used_ops()
                     if self._forward is None or reader.id() in self._forward
                     for use in self._param_uses(reader, result, top, forced, shape_of))

    def _param_uses(self, user, param, top: frozenset, forced, shape_of) -> list[ParamUse]:
        """How ``user`` (an op of the global block when its id is in ``top``, else of a
        control-flow block) reads ``param``: one ``ParamUse`` per operand slot it feeds; an
        op that only moves values lists the readers of its results (``ParamUse.then``)."""
        if user.num_regions() or user.id() not in top:
            return [ParamUse(opnames.legacy_name(user.name()), force_fp32=CONTROL_FLOW)]
        if opnames.is_plumbing(user.name()) and user.name() != "builtin.combine":
            return [ParamUse(user.name(), force_fp32="program plumbing reads the stored value")]
        if user.name() == "builtin.combine":  # a list operand: the op reading the list
            user = user.result(0).all_used_ops()[0]
        legacy, attrs, why = opnames.legacy_name(user.name()), _attrs(user), forced(user)
        slots = [s.name for s in self.slots(user) if s.value.is_same(param)]
        then = None
        if why is None and passes_through("paddle", legacy, attrs):  # judged by its readers
            then = tuple(use for result in user.results() for reader in result.all_used_ops()
                         if self._forward is None or reader.id() in self._forward
                         for use in self._param_uses(reader, result, top, forced, shape_of))
        return [ParamUse(legacy, attrs, slot, why, then, shape_of(user))
                for slot in slots or [None]]

    def end_forward(self) -> None:
        """PIR ops carry no role: the forward pass is the ops there before the backward."""
        self._forward = frozenset(op.id() for op in self.block.ops)

    def graph_casts(self) -> GraphCasts:
        """The ``pd_op.cast`` ops of the forward pass (all of them in a program with no
        backward), emulation's round trips apart, as on the legacy IR. Not the backward's:
        the gradient of each forward cast is a cast back, so a trained program holds about
        twice as many (22 for the emulated MLP whose forward holds 12)."""
        return GraphCasts.count(
            (op.operand_source(0).id, op.result(0).id, value_dtype(op.result(0)))
            for op in self.block.ops
            if op.name() == "pd_op.cast" and (self._forward is None or op.id() in self._forward))

    # -- the op walk: writing ------------------------------------------------------------------

    def cast(self, before, value, dtype: str, plain: bool = False):
        """(``plain``: every cast is plain under PIR, ``use_onednn_casts``)"""
        paddle.pir.set_insertion_point(before)
        out = paddle.cast(value, dtype)
        self._inserted.add(out.get_defining_op().id())
        return out

    def round(self, before, value, low: str):
        return self.cast(before, self.cast(before, value, low), "float32")

    def set_input(self, slot: Slot, old, new) -> None:
        slot.owner.operand(slot.index).set_source(new)
        if slot.owner.name() == "builtin.combine":
            _retype_combine(slot.owner)

    def current(self, slot: Slot):
        return slot.owner.operand_source(slot.index)

    def rewire_within(self, op, old, new) -> None:
        for user in [op, *_nested_ops(op)]:
            for i, source in enumerate(user.operands_source()):
                if source.initialized() and source.is_same(old):
                    user.operand(i).set_source(new)

    def chain_cast(self, op) -> None:
        """Nothing: a PIR cast's input dtype is its operand's type."""

    def overwritten(self, op) -> set:
        """SSA: only an in-place op (``relu_``) overwrites values, its operands."""
        if not op.name().endswith("_"):
            return set()
        return {v.id for v in op.operands_source() if v.initialized()}

    def float_outputs(self, op, kept) -> list:
        keep = {opnames.snake(s) for s in kept}
        names = op.get_output_names()
        return [r for i, r in enumerate(op.results())
                if (names[i] if i < len(names) else "") not in keep
                and value_dtype(r) == "float32"]

    def retype(self, op, value, dtype: str) -> None:
        if not _fixed_dtype(op):  # its infer-meta is not re-run: only retype results
            value.set_type(_retyped(value, dtype))  # that follow the inputs

    def round_output(self, op, value, low: str):
        paddle.pir.set_insertion_point_after(op)
        mid = paddle.cast(value, low)
        back = paddle.cast(mid, "float32")
        self._inserted.update((mid.get_defining_op().id(), back.get_defining_op().id()))
        value.replace_all_uses_with(back)
        mid.get_defining_op().operand(0).set_source(value)
        return back

    probe = PROBE  # its device probe (``kernels``)

    def use_onednn(self, op) -> None:
        """Nothing to set: the executor picks a bf16 op's oneDNN kernel itself (3.3.1)."""

    def use_onednn_casts(self, plain_readers=frozenset()) -> None:
        """Nothing that can be set: 3.3.1's PIR picks a cast's plain kernel (it has one for
        bf16) whatever attribute the op carries; only the process-wide FLAGS_use_mkldnn,
        which moves every op, sends casts to oneDNN (``kernels.onednn_kernels`` has no
        cast under PIR: ``PirProbe.onednn_casts``)."""

    def require_grad(self, value) -> None:
        value.stop_gradient = False

    def set_param_dtype(self, names, dtype: str) -> None:
        for param in _parameters(self.program):
            if param.name in names and value_dtype(param) == "float32":
                param.set_type(_retyped(param, dtype))

    # -- O2's emulated float32 masters --------------------------------------------------------

    def new_master(self, param, name: str):
        """A ``builtin.parameter`` in main, its init in the startup program (initialised from
        the parameter by ``MasterWeights.init_scope``)."""
        paddle.pir.reset_insertion_point_to_end()
        return paddle.static.create_parameter(
            list(param.shape), "float32", name=name,
            attr=paddle.ParamAttr(name=name, trainable=True,
                                  regularizer=getattr(param, "regularizer", None),
                                  need_clip=getattr(param, "need_clip", True)),
            default_initializer=Constant(0.0))

    def master_grad(self, grad):
        paddle.pir.reset_insertion_point_to_end()
        return paddle.cast(grad, "float32")

    def write_cast(self, src, dst) -> None:
        """The cast writes the parameter's variable itself (``set_persistable_value``, as
        Paddle's own passes write persistables), with no copy after it (``assign_out_``:
        about 0.9 ms per 2048x2048 parameter and step)."""
        paddle.pir.reset_insertion_point_to_end()
        paddle._pir_ops.set_persistable_value(paddle.cast(src, dtype_name(dst.dtype)), dst.name)

    # -- loss scaling ----------------------------------------------------------------------------

    def optimizer_section(self):
        """Nothing to mark: PIR ops carry no op role."""
        return contextlib.nullcontext()

    def state_var(self, dtype: str, shape: list, value, stem: str):
        """An init op in the startup program, a persistable ``pd_op.data`` in main."""
        return paddle.pir.core.create_persistable_value(
            dtype, shape, unique_name.generate(stem), initializer=Constant(value))

    def scale_loss(self, loss, scale):
        return paddle._C_ops.multiply(loss, scale)

    def unscale(self, grads: list, scale):
        by_dtype: dict = {}
        for g in grads:
            by_dtype.setdefault(str(g.dtype), []).append(g)
        found = []
        for group in by_dtype.values():
            _, flag = paddle._C_ops.check_finite_and_unscale_(group, scale)
            found.append(flag)
        for flag in found[1:]:
            found[0] = paddle.logical_or(found[0], flag)
        return found[0]

    def all_reduce_max(self, flag, ring_id: int):
        as_int = paddle.cast(flag, "int32")  # the CPU/gloo kernels have no bool
        paddle._C_ops.all_reduce_(as_int, ring_id, 1)  # 1 = max
        return paddle.cast(as_int, "bool")

    def record_nonfinite(self, found_inf, grads: list, dst) -> None:
        def build():
            flags = [paddle.reshape(paddle.all(paddle.isfinite(g)), [1]) for g in grads]
            paddle.assign(paddle.concat(flags), output=dst)
        paddle.static.nn.cond(paddle.reshape(found_inf, []), build, None)

    def state_ops(self) -> PirOps:
        return PIR_OPS

    def fused_update(self, carrier, found_inf, state: dict, config) -> None:
        c = config
        paddle._C_ops.update_loss_scaling_(
            [carrier], found_inf, state["scale"], state["good_steps"], state["bad_steps"],
            c.growth_interval, c.hysteresis, float(c.growth_factor), float(c.backoff_factor),
            False)

    def clip(self, var, lo: float, hi: float) -> None:
        paddle.assign(paddle.clip(var, lo, hi), output=var)

    def mark(self) -> set[int]:
        return {op.id() for op in self.block.ops}

    def skip(self, optimizer, mark: set[int], found_inf, grads: list, state: dict):
        """The table, as on the legacy IR but without the fold (``sgd_`` goes in the guard:
        the fold's zeroing and learning-rate rewire are not built for PIR yet, issue 22):
        an op reading ``skip_update`` = ``found_inf`` skips itself (``adam_``, ``adamw_``;
        Paddle 3's PIR ``lamb_`` is built with none), any other op writing a parameter or a
        persistable in place moves, with all the optimizer's ops, into ``if not found_inf``.
        """
        built = [op for op in self.block.ops if op.id() not in mark]
        if any(_writes_state(op) and not _skips_on(op, found_inf) for op in built):
            _guard(self.block, built, found_inf)
        return None


    # -- the numerics doctor (values named by position: ``doctor.Naming``) -------------------

    def end_backward(self, params_grads: list) -> None:
        """PIR ops carry no role: the backward is what the parameters' gradients are made by
        (and the ops between), after the forward."""
        self._grads = {g.id: p.name for p, g in params_grads if g is not None}

    def doctor_ops(self) -> tuple:
        """The ops after the last parameter gradient's maker (the loss scaling and the
        optimizer) are erased from the clone; the ops are ``doctor.OpView``s of the clone's."""
        if self._forward is None or not self._grads:
            raise RuntimeError(NO_DOCTOR)
        self._namings = {}  # one doctor's clone and twin at a time
        ops = list(self.block.ops)
        pos = {op.id(): i for i, op in enumerate(ops)}
        last = max(pos[op.id()] for op in ops
                   if any(r.id in self._grads for r in op.results()))
        forward = [i for i, op in enumerate(ops) if op.id() in self._forward
                   and not opnames.is_plumbing(op.name())]
        backward = [i for i, op in enumerate(ops[:last + 1]) if op.id() not in self._forward
                    and not opnames.is_plumbing(op.name())]
        names = _doctor.grad_names(self.program, self._forward, last + 1, self._grads)
        self._grad_names = names
        self._inserted_at = {pos[i] for i in self._inserted if i in pos}
        clone = self.program.clone()
        cops = list(clone.global_block().ops)
        for op in reversed(cops[last + 1:]):  # the loss scaling and the optimizer: dropped
            op.erase()
        naming = self._naming(clone)
        cops = naming.ops
        return (clone, [_doctor.OpView(cops[i], naming, i) for i in forward],
                [_doctor.OpView(cops[i], naming, i) for i in backward])

    def _naming(self, prog):
        found = self._namings.get(id(prog))
        if found is None or found[0] is not prog:
            found = self._namings[id(prog)] = (prog, _doctor.Naming(prog, self._grad_names))
        return found[1]

    def float32_twin(self, clone):
        twin, same = _doctor.float32_twin(clone, value_dtype)
        naming = self._naming(twin)
        for i, src in same.items():  # a bypassed cast's result reads as its trip's source
            naming.values[naming.by_id[naming.ops[i].result(0).id]] = src
        return twin

    def inserted_cast(self, op) -> bool:
        """By the casts the rewrite recorded inserting (``cast``, ``round``, ``round_output``)."""
        return op.type == "cast" and op.pos in self._inserted_at

    def fetchable(self, clone, name: str) -> bool:
        value = self._naming(clone).values.get(name)
        return (value is not None and value_dtype(value) is not None
                and not name.endswith("XShape"))

    def fetch_list(self, clone, names: list) -> list:
        values = self._naming(clone).values
        return [values[n] for n in names]


def _guard(block, built: list, found_inf) -> None:
    """Move the optimizer's ops ``built`` into ``if not found_inf:`` (their persistable
    inputs, ``pd_op.data``, stay outside: reading state writes nothing)."""
    paddle.static.nn.cond(paddle.reshape(paddle.logical_not(found_inf), []), lambda: None, None)
    if_op = block.ops[-1]
    inner = next(iter(if_op.blocks()))
    end = inner.ops[-1] if inner.ops else None  # the branch's cf.yield, if any
    for op in built:
        if op.name() in ("pd_op.data", "builtin.parameter"):
            continue
        if end is None:
            inner.move_op_to_block_end(op)
        else:
            op.move_before(end)


def _writes_state(op) -> bool:
    """True if ``op`` writes a parameter or a persistable value in place."""
    if not op.name().endswith("_"):
        return False
    for value in op.operands_source():
        if value.initialized() and value.is_dense_tensor_type() and (
                value.is_parameter or value.persistable):
            return True
    return False


def _skips_on(op, found_inf) -> bool:
    """True if ``op``'s kernel leaves its outputs unchanged when ``found_inf`` is set."""
    names = op.get_input_names()
    if "skip_update" not in names:
        return False
    source = op.operand_source(names.index("skip_update"))
    return source.initialized() and _same_flag(source, found_inf)


def _same_flag(source, found_inf) -> bool:
    """The optimizer may read ``found_inf`` through a copy (``memcpy``/``assign``)."""
    if source.is_same(found_inf):
        return True
    op = source.get_defining_op()
    return op is not None and op.num_operands() == 1 and op.operand_source(0).is_same(found_inf)


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
