"""``NumpyOps``: the core's array vocabulary for ``update``, on numpy scalars (no device).

Lean on purpose: MXNet runs it once per training step on the host. No ``np.errstate``
(it costs more than the whole transition): ``mul`` rounds by hand at float32's top.
"""
from __future__ import annotations

import math

import numpy as np

# The smallest double that rounds to inf in float32 (round to nearest even): 2**128 - 2**103.
_F32_OVERFLOW = 2.0**128 - 2.0**103
_F32_INF = np.float32(math.inf)


class NumpyOps:
    """``ArrayOps`` over numpy scalars: float32 scale, int64 counters, ``np.bool_`` flags."""

    def where(self, cond, x, y):
        return x if cond else y  # scalars: picking is where(); both sides were computed

    def add(self, x, value):
        return np.int64(x + value)

    def zero(self, like):
        return type(like)(0)

    def equal(self, x, value):
        return np.bool_(x == value)

    def mul(self, scale, factor):
        """The rounding rule: the double product, rounded once to float32 (inf above)."""
        product = float(scale) * float(factor)
        return _F32_INF if abs(product) >= _F32_OVERFLOW else np.float32(product)

    def minimum(self, x, bound):
        return x if x <= bound else np.float32(bound)

    def maximum(self, x, bound):
        return x if x >= bound else np.float32(bound)

    def isfinite(self, x):
        return np.bool_(math.isfinite(x))

    def logical_and(self, x, y):
        return np.bool_(x and y)

    def logical_not(self, x):
        return np.bool_(not x)


NUMPY_OPS = NumpyOps()
