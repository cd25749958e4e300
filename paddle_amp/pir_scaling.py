"""Loss scaling as PIR ops: ``scaling.LossScaling`` for Paddle 3 programs in PIR.

Same state, names and guarantees as the legacy ``LossScaling`` (see
scaling.py), which this subclasses: the IR-neutral half (reading and writing
the state through the scope, ``check_guard``, ``resolve_ring_id``) is
inherited, only op building differs.

- state: persistable values (``paddle.pir.core.create_persistable_value``:
  an init op in the startup program, a persistable ``pd_op.data`` in main),
  so ``paddle.static.save``/``load`` checkpoint them with the parameters;
- unscale: ``check_finite_and_unscale_`` per gradient dtype, flags OR-ed,
  then all-reduced (max) over the data-parallel ring when there is one;
- true skip: optimizer ops whose kernel skips itself (``adam_``, ``adamw_``
  take ``skip_update`` = ``found_inf``; checked per op: Paddle 3's PIR
  ``lamb_`` is built with no ``skip_update``) stay where they are; if any
  other optimizer op writes a parameter or a persistable state in place, all
  the optimizer's ops move into a PIR ``if`` on ``not found_inf``
  (``paddle.static.nn.cond``);
- the state transition is the core's ``amp_adapters.loss_scale.update`` run
  with the PIR vocabulary (``pir_ops.PirOps``): the program holds that one
  function, branch-free; as on the legacy IR, Paddle's fused
  ``update_loss_scaling_`` moves the scale where it is exact
  (``LossScaling.native_update``), the counters still the core's.

No host sync in the step.
"""
from __future__ import annotations

import paddle
from paddle.base import unique_name
from paddle.nn.initializer import Constant

from amp_adapters.loss_scale import FIELDS, StateArrays, count_step, update

from .pir_ops import PIR_OPS
from .collective import resolve_ring_id
from .scaling import LossScaling
from .state import COUNTER_DTYPE as _COUNTER_DTYPE


def _persistable(dtype: str, shape: list, value, stem: str):
    return paddle.pir.core.create_persistable_value(
        dtype, shape, unique_name.generate(stem), initializer=Constant(value))


def _op_ids(block) -> set[int]:
    return {op.id() for op in block.ops}


def _scalar(flag):
    return paddle.reshape(flag, [])


class PirLossScaling(LossScaling):
    """The in-program loss scale of one decorated PIR program, starting from ``initial``."""

    def create_vars(self) -> None:
        """The persistable state values (under the caller's program_guard), at ``initial``."""
        state = self.initial.state
        for name in self.fields:
            dtype = "float32" if name == "scale" else _COUNTER_DTYPE[name]
            stem = "loss_scaling" if name == "scale" else f"amp_{name}"
            self.vars[name] = _persistable(dtype, [1], getattr(state, name), stem)

    def scale_loss(self, block, loss):
        """``loss * scale`` (loss itself when nothing is scaled)."""
        if not self.config.checks_overflow:
            return loss
        return paddle._C_ops.multiply(loss, self.vars["scale"])

    def apply(self, program, params_grads, optimizer) -> list:
        """Unscale and check ``params_grads``, apply ``optimizer`` on finite steps only, and
        advance the state by the core's ``update``. Returns the optimizer's ops."""
        if not self.config.checks_overflow:
            ops = optimizer.apply_gradients(params_grads)
            self._update(None)
            return ops
        grads = [g for _, g in params_grads]
        self.param_names = tuple(p.name for p, _ in params_grads)
        self.vars["grad_finite"] = _persistable("bool", [len(grads)], True, "amp_grad_finite")
        found_inf = self._unscale(None, grads)
        self.ring_id = resolve_ring_id(self.found_inf_ring_id)
        if self.ring_id is not None:
            as_int = paddle.cast(found_inf, "int32")
            paddle._C_ops.all_reduce_(as_int, self.ring_id, 1)  # 1 = max
            found_inf = paddle.cast(as_int, "bool")
        paddle.static.nn.cond(_scalar(found_inf), lambda: self._record_culprits(grads), None)
        if hasattr(optimizer, "_set_auxiliary_var"):  # adam_/adamw_/lamb_ then skip themselves
            optimizer._set_auxiliary_var("found_inf", found_inf)
        block = program.global_block()
        before = _op_ids(block)
        ops = optimizer.apply_gradients(params_grads)
        built = [op for op in block.ops if op.id() not in before]
        if any(_writes_state(op) and not _skips_on(op, found_inf) for op in built):
            self._guard(block, built, found_inf)
        self._update(found_inf, grads[0])
        return ops

    def _update(self, found_inf, carrier=None) -> None:
        """The core's transition, built with PIR ops and assigned back into the state values;
        as on the legacy IR, the scale move is Paddle's fused op where that is exact
        (``native_update``: it zeroes its ``x``, just ``carrier``, on overflow, so it comes
        after every reader of the gradients), the counters still the core's."""
        v = self.vars
        state = StateArrays(*(v.get(f) for f in FIELDS))
        if self.native_update:
            c = self.config
            paddle._C_ops.update_loss_scaling_(
                [carrier], found_inf, v["scale"], v["good_steps"], v["bad_steps"],
                c.growth_interval, c.hysteresis, float(c.growth_factor),
                float(c.backoff_factor), False)
            if c.min_scale > 1 or c.max_scale != float("inf"):
                paddle.assign(paddle.clip(v["scale"], c.min_scale, c.max_scale),
                              output=v["scale"])
            new = count_step(self.config, state, found_inf, PIR_OPS)
        else:
            new = update(self.config, state, found_inf, PIR_OPS)
        for field in FIELDS:
            value = getattr(new, field)
            if value is not getattr(state, field):
                paddle.assign(value, output=v[field])

    def _guard(self, block, built: list, found_inf) -> None:
        """Move the optimizer's ops ``built`` into ``if not found_inf:`` (their persistable
        inputs, ``pd_op.data``, stay outside: reading state writes nothing)."""
        paddle.static.nn.cond(_scalar(paddle.logical_not(found_inf)), lambda: None, None)
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

    def _unscale(self, block, grads):
        """``found_inf`` over all ``grads`` (one check per dtype: the kernel takes one)."""
        by_dtype: dict = {}
        for g in grads:
            by_dtype.setdefault(str(g.dtype), []).append(g)
        found = []
        for group in by_dtype.values():
            _, flag = paddle._C_ops.check_finite_and_unscale_(group, self.vars["scale"])
            found.append(flag)
        for flag in found[1:]:
            found[0] = paddle.logical_or(found[0], flag)
        return found[0]

    def _record_culprits(self, grads) -> None:
        """On overflow only: which gradients were not finite (for ``check_guard``)."""
        flags = [paddle.reshape(paddle.all(paddle.isfinite(g)), [1]) for g in grads]
        paddle.assign(paddle.concat(flags), output=self.vars["grad_finite"])


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
