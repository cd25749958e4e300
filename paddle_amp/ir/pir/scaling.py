"""PIR's loss scaling (``protocol.ScalingIR``): state values, the scaled loss, unscale and
check, the all-reduce, the culprits, the update and the skip, as ops."""
from __future__ import annotations

import contextlib

import paddle
from paddle.base import unique_name
from paddle.nn.initializer import Constant

from .ops import PIR_OPS, PirOps


class Scaling:
    """``PirProgram``'s loss scaling."""


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
