"""``NumpyOps``: the core's array vocabulary for ``update``, on numpy scalars (no device)."""
from __future__ import annotations

import numpy as np


class NumpyOps:
    """``ArrayOps`` over numpy scalars: float32 scale, int64 counters, ``np.bool_`` flags."""

    def where(self, cond, x, y):
        return x if cond else y  # scalars: picking is where(); both sides are computed

    def add(self, x, value):
        return np.int64(x) + np.int64(value)

    def zero(self, like):
        return np.asarray(like).dtype.type(0)

    def equal(self, x, value):
        return np.bool_(x == value)

    def mul(self, scale, factor):
        """The rounding rule: the double product, rounded once to float32."""
        with np.errstate(over="ignore"):
            return np.float32(np.float64(scale) * np.float64(factor))

    def minimum(self, x, bound):
        return np.minimum(x, np.float32(bound))

    def maximum(self, x, bound):
        return np.maximum(x, np.float32(bound))

    def isfinite(self, x):
        return np.isfinite(x)

    def logical_and(self, x, y):
        return np.logical_and(x, y)

    def logical_not(self, x):
        return np.logical_not(x)


NUMPY_OPS = NumpyOps()
