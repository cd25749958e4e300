"""``PirOps``: the core's ``ArrayOps`` vocabulary as PIR ops, so ``update`` builds the program.

Every array is a ``[1]`` value; no host sync. ``mul`` keeps the core's rounding
rule: the double product, rounded once to float32 (inf past float32's range).
"""
from __future__ import annotations

import paddle


def _const(like, value, dtype=None):
    return paddle.full([1], value, dtype if dtype is not None else like.dtype)


class PirOps:
    """``ArrayOps`` over PIR values (float32 scale, int32/int64 counters, bool flags)."""

    def where(self, cond, x, y):
        return paddle.where(cond, x, y)

    def add(self, x, value):
        return paddle.add(x, _const(x, value))

    def zero(self, like):
        return _const(like, 0)

    def equal(self, x, value):
        return paddle.equal(x, _const(x, value))

    def mul(self, scale, factor):
        wide = paddle.multiply(paddle.cast(scale, "float64"), _const(scale, factor, "float64"))
        return paddle.cast(wide, "float32")

    def minimum(self, x, bound):
        return paddle.minimum(x, _const(x, float(bound), "float32"))

    def maximum(self, x, bound):
        return paddle.maximum(x, _const(x, float(bound), "float32"))

    def isfinite(self, x):
        return paddle.isfinite(x)

    def logical_and(self, x, y):
        return paddle.logical_and(x, y)

    def logical_not(self, x):
        return paddle.logical_not(x)

    def store(self, new, dst) -> None:
        if new is not dst:
            paddle.assign(new, output=dst)


PIR_OPS = PirOps()
