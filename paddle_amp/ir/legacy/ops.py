"""``BlockOps``: the core's ``ArrayOps`` vocabulary as legacy-IR ops appended to one block.

With it ``amp_adapters.rules.loss_scale.update`` builds the transition as a straight
line of ops on ``[1]`` vars (float32 scale, int32/int64 counters, bool flags).
Its rounding rule (the double product rounded once to float32) is ``mul``: the
scale cast to float64 times a float64 constant (``fill_constant``'s
``str_value`` is parsed as a double, not rounded to a float32 attribute), cast
back to float32 (round to nearest, inf on overflow). No host sync.
"""
from __future__ import annotations

from typing import Optional

from paddle.base import unique_name

from ...env import VarType

_BOOL, _FP32, _FP64 = VarType.BOOL, VarType.FP32, VarType.FP64


class BlockOps:
    """Appends ops to ``block``; temporaries and constants live in that block."""

    def __init__(self, block, startup_block=None):
        """``startup_block``: where constants are filled once (persistable vars, so no op
        per step); without one, each constant is a ``fill_constant`` op in ``block``."""
        self.block = block
        self.startup_block = startup_block
        self._consts: dict = {}

    # -- plumbing ------------------------------------------------------------------------------

    def tmp(self, dtype, shape: Optional[list] = None):
        return self.block.create_var(name=unique_name.generate("amp_tmp"), dtype=dtype,
                                     shape=shape or [1])

    def op(self, op_type: str, inputs: dict, out_dtype, **attrs):
        out = self.tmp(out_dtype)
        self.block.append_op(type=op_type, inputs=inputs, outputs={"Out": [out]}, attrs=attrs)
        return out

    def unary(self, op_type: str, x, dtype, **attrs):
        out = self.tmp(dtype, list(x.shape))
        self.block.append_op(type=op_type, inputs={"X": [x]}, outputs={"Out": [out]},
                             attrs=attrs)
        return out

    def binary(self, op_type: str, x, y, dtype):
        return self.op(op_type, {"X": [x], "Y": [y]}, dtype)

    def const(self, dtype, value):
        """A ``[1]`` constant of ``dtype`` holding ``value`` exactly (a double for float64),
        built once per block."""
        key = (dtype, repr(value))
        if key not in self._consts:
            text = repr(float(value)) if dtype in (_FP32, _FP64) else str(int(value))
            attrs = dict(shape=[1], dtype=dtype, value=float(value), str_value=text)
            if self.startup_block is None:
                self._consts[key] = self.op("fill_constant", {}, dtype, **attrs)
            else:  # filled once by the startup program, read every step
                name = unique_name.generate("amp_const")
                var = self.block.program.global_block().create_var(
                    name=name, shape=[1], dtype=dtype, persistable=True)
                out = self.startup_block.create_var(name=name, shape=[1], dtype=dtype,
                                                    persistable=True)
                self.startup_block.append_op(type="fill_constant", outputs={"Out": [out]},
                                             attrs=attrs)
                self._consts[key] = var
        return self._consts[key]

    def store(self, new, dst) -> None:
        """Make ``dst`` hold ``new`` (a result of this vocabulary): the op that computed
        ``new`` writes ``dst`` directly when nothing after it reads ``new`` or ``dst``,
        else an ``assign`` at the end."""
        if new is dst:
            return
        ops = self.block.ops
        at = next((i for i in range(len(ops) - 1, -1, -1)
                   if new.name in ops[i].output_arg_names), None)
        later = ops[at + 1:] if at is not None else []
        if at is not None and new.name.startswith("amp_tmp") and len(
                ops[at].output_arg_names) == 1 and not any(
                new.name in op.input_arg_names or dst.name in op.input_arg_names
                or dst.name in op.output_arg_names for op in later):
            ops[at]._rename_output(new.name, dst.name)
            return
        self.assign(new, dst)

    def cast(self, x, dtype):
        return self.unary("cast", x, dtype, in_dtype=x.dtype, out_dtype=dtype)

    def assign(self, src, dst) -> None:
        self.block.append_op(type="assign", inputs={"X": [src]}, outputs={"Out": [dst]})

    # -- the ArrayOps vocabulary ------------------------------------------------------------

    def where(self, cond, x, y):
        return self.op("where", {"Condition": [cond], "X": [x], "Y": [y]}, x.dtype)

    def add(self, x, value):
        return self.binary("elementwise_add", x, self.const(x.dtype, value), x.dtype)

    def zero(self, like):
        return self.const(like.dtype, 0)

    def equal(self, x, value):
        return self.binary("equal", x, self.const(x.dtype, value), _BOOL)

    def mul(self, scale, factor):
        wide = self.binary("elementwise_mul", self.cast(scale, _FP64),
                           self.const(_FP64, factor), _FP64)
        return self.cast(wide, _FP32)

    def minimum(self, x, bound):
        return self.binary("elementwise_min", x, self.const(x.dtype, bound), x.dtype)

    def maximum(self, x, bound):
        return self.binary("elementwise_max", x, self.const(x.dtype, bound), x.dtype)

    def isfinite(self, x):
        return self.unary("isfinite_v2", x, _BOOL)

    def logical_and(self, x, y):
        return self.binary("logical_and", x, y, _BOOL)

    def logical_not(self, x):
        return self.unary("logical_not", x, _BOOL)
