"""The legacy IR's loss scaling (``protocol.ScalingIR``): state vars, the scaled loss,
unscale and check, the all-reduce, the culprits, the update and the skip, as ops."""
from __future__ import annotations

import paddle
from paddle.base import framework, unique_name

from ...env import VarType
from .ops import BlockOps
from .skip import cond_block, skip


class Scaling:
    """``LegacyProgram``'s loss scaling."""


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
