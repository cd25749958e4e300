"""Range statistics of a tensor in a target dtype, relative error, gradient flush at a scale.

Pure numpy on float32/float64 arrays (a backend hands over its values as
numpy). "Overflow": a finite value whose magnitude rounds to inf in the target
dtype; "flush": a non-zero value that the target dtype stores as zero or as a
subnormal (fewer significant bits), the two ways small values lose precision.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Optional

import numpy as np

from ...rules.dtypes import dtype_name


@dataclass(frozen=True)
class DtypeLimits:
    """Where a floating dtype's range ends: the largest finite value, the smallest normal and
    the smallest subnormal; a magnitude at or above ``overflow`` rounds to inf."""

    name: str
    max: float
    tiny: float        # the smallest normal
    subnormal: float   # the smallest subnormal

    @property
    def overflow(self) -> float:
        """Magnitudes from here on round to inf (half an ulp above ``max``)."""
        return self.max * (1 + 2.0 ** -(self.mantissa_bits + 1))

    @property
    def mantissa_bits(self) -> int:
        return {"float16": 10, "bfloat16": 7, "float32": 23}[self.name]


DTYPE_LIMITS = {
    "float16": DtypeLimits("float16", 65504.0, 2.0 ** -14, 2.0 ** -24),
    "bfloat16": DtypeLimits("bfloat16", 3.3895313892515355e38, 2.0 ** -126, 2.0 ** -133),
    "float32": DtypeLimits("float32", float(np.finfo(np.float32).max), 2.0 ** -126,
                           2.0 ** -149),
}


def limits(dtype: object) -> DtypeLimits:
    """The limits of ``dtype`` in any spelling (float16, bfloat16, float32)."""
    return DTYPE_LIMITS[dtype_name(dtype)]


@dataclass(frozen=True)
class Range:
    """One tensor's range in one step, seen from ``dtype``."""

    size: int
    max_abs: float        # the largest magnitude: inf if a value is inf, else nan if one is nan
    nonfinite: float      # fraction of values already inf or nan
    overflow: float       # fraction of values inf or nan in dtype: already, or finite ones
                          # that round to inf there
    flush_zero: float     # fraction of values, non-zero here, that dtype stores as 0
    subnormal: float      # fraction of values, non-zero here, that dtype stores as subnormals


def range_stats(x: np.ndarray, dtype: object) -> Range:
    """The range of ``x`` seen from ``dtype`` (fractions are of all ``x.size`` values). A
    value already inf or nan counts as overflowed and shows in ``max_abs``: an op whose
    output is not finite must not look like one whose output is 0."""
    lim = limits(dtype)
    a = np.abs(np.asarray(x, dtype=np.float64)).ravel()
    n = a.size
    if n == 0:
        return Range(0, 0.0, 0.0, 0.0, 0.0, 0.0)
    finite = np.isfinite(a)
    fin = a[finite]
    nonzero = fin[fin > 0]
    return Range(
        size=n,
        max_abs=peak(a),
        nonfinite=float((~finite).sum() / n),
        overflow=float(((fin >= lim.overflow).sum() + (~finite).sum()) / n),
        flush_zero=float((nonzero < lim.subnormal / 2).sum() / n),
        subnormal=float(((nonzero >= lim.subnormal / 2) & (nonzero < lim.tiny)).sum() / n))


def peak(values: Iterable[float]) -> float:
    """The largest magnitude of ``values``: inf if one is inf, else nan if one is nan (a
    nan is not smaller than a number: it hides what the value was); 0.0 for none."""
    a = np.abs(np.asarray(list(values) if not isinstance(values, np.ndarray) else values,
                          dtype=np.float64)).ravel()
    if a.size == 0:
        return 0.0
    if np.isinf(a).any():
        return math.inf
    if np.isnan(a).any():
        return math.nan
    return float(a.max())


def relative_error(x: np.ndarray, reference: np.ndarray) -> float:
    """``||x - reference|| / ||reference||`` over the values finite in both (inf when ``x`` is
    not finite where the reference is; 0 for two zero tensors)."""
    x = np.asarray(x, dtype=np.float64).ravel()
    ref = np.asarray(reference, dtype=np.float64).ravel()
    if x.shape != ref.shape:
        raise ValueError(f"relative_error: shapes differ ({x.shape} vs {ref.shape})")
    ok = np.isfinite(ref)
    if (~np.isfinite(x[ok])).any():
        return math.inf
    num = float(np.linalg.norm(x[ok] - ref[ok]))
    den = float(np.linalg.norm(ref[ok]))
    if den == 0.0:
        return 0.0 if num == 0.0 else math.inf
    return num / den


def flush_fraction(grad: np.ndarray, scale: float, dtype: object) -> float:
    """Of the non-zero values of the (unscaled) gradient ``grad``, the fraction that
    ``dtype`` stores as zero once multiplied by the loss ``scale`` (at most half its
    smallest subnormal: exactly half is a tie, which rounds to the even neighbour, 0)."""
    g = np.abs(np.asarray(grad, dtype=np.float64)).ravel()
    g = g[np.isfinite(g) & (g > 0)]
    if g.size == 0:
        return 0.0
    return float((g * scale <= limits(dtype).subnormal / 2).sum() / g.size)


def significant(x: np.ndarray, dtype: object) -> np.ndarray:
    """The finite values of ``x`` at least ``max|x| * 2**-mantissa_bits`` in magnitude: the
    ones ``dtype`` could tell apart from its largest value (smaller ones are below its
    relative precision there, and their loss does not change a sum or an update)."""
    a = np.abs(np.asarray(x, dtype=np.float64)).ravel()
    a = a[np.isfinite(a) & (a > 0)]
    if a.size == 0:
        return a
    return a[a >= a.max() * 2.0 ** -limits(dtype).mantissa_bits]


def scale_for_gradients(grads: Iterable[np.ndarray], dtype: object, max_scale: float,
                        tolerance: float = 0.01) -> Optional[float]:
    """The smallest power of two (at most ``max_scale``) at which at most ``tolerance`` of
    each gradient's significant values (``significant``) flush to zero in ``dtype``; None if
    none is enough."""
    arrays = [significant(g, dtype) for g in grads]
    exp = 0
    while 2.0 ** exp <= max_scale:
        s = 2.0 ** exp
        if all(flush_fraction(a, s, dtype) <= tolerance for a in arrays):
            return s
        exp += 1
    return None
