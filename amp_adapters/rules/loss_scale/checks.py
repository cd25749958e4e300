"""Checking the numbers a loss-scale config or state is made of: one rule, one message.

Any real number is accepted (int, float, numpy scalars, ``Fraction``,
``Decimal``); bools, strings and NaN are refused. Scales are float32 values, so a
scale is rounded to float32 here and one that rounds to 0 or overflows to inf is
refused (a scale the device cannot hold is no scale).
"""
from __future__ import annotations

import decimal
import math
import numbers
from typing import Any

import numpy as np

from ..errors import AmpConfigError

F32_TINY = float(np.finfo(np.float32).tiny)  # the smallest normal float32
INT64_MAX = 2**63 - 1


def f32(x: float) -> float:
    """``x`` rounded to float32 (inf if it overflows float32), as a Python float."""
    with np.errstate(over="ignore"):
        return float(np.float32(x))


def _is_real(value: Any) -> bool:
    if isinstance(value, (bool, np.bool_)):
        return False
    return isinstance(value, (numbers.Real, decimal.Decimal))


def real(owner: str, name: str, value: Any, *, allow_inf: bool = False) -> float:
    """``value`` as a float: a real number (not a bool), not NaN, finite unless ``allow_inf``."""
    if not _is_real(value):
        raise AmpConfigError(f"{owner}.{name} must be a real number (int, float, numpy scalar, "
                             f"Fraction or Decimal), got {type(value).__name__} {value!r}")
    try:
        out = float(value)
    except (OverflowError, decimal.InvalidOperation):
        out = math.inf if value > 0 else -math.inf
    if math.isnan(out) or (math.isinf(out) and not allow_inf):
        what = "finite" if not allow_inf else "a number"
        raise AmpConfigError(f"{owner}.{name} must be {what}, got {value!r}")
    return out


def scale_value(owner: str, name: str, value: Any, *, allow_zero: bool = False,
                allow_inf: bool = False) -> float:
    """A scale (or a scale bound) as the float32 value the devices hold.

    Refused: negative values, values that round to 0 in float32 (unless ``allow_zero``:
    a floor of 0 means "no floor") and values that overflow float32 (unless ``allow_inf``:
    a ceiling of inf means "no ceiling")."""
    x = real(owner, name, value, allow_inf=allow_inf)
    if x < 0:
        raise AmpConfigError(f"{owner}.{name} must be >= 0, got {value!r}")
    y = f32(x)
    if y == 0 and not (allow_zero and x == 0):
        raise AmpConfigError(f"{owner}.{name} = {value!r} rounds to 0 in float32; use a value "
                             f">= {F32_TINY:g} (the smallest normal float32)"
                             + (" or exactly 0 for none" if allow_zero else ""))
    if 0 < y < F32_TINY:
        raise AmpConfigError(f"{owner}.{name} = {value!r} is a denormal in float32; use a value "
                             f">= {F32_TINY:g} (the smallest normal float32)")
    if math.isinf(y) and not (allow_inf and math.isinf(x)):
        raise AmpConfigError(f"{owner}.{name} = {value!r} overflows float32 (max "
                             f"{float(np.finfo(np.float32).max):g})"
                             + ("; use inf for no ceiling" if allow_inf else ""))
    return y


def whole(owner: str, name: str, value: Any, minimum: int = 0) -> int:
    """``value`` as an int >= ``minimum`` (<= 2**63-1, what an int64 counter holds).

    Any integral number is accepted (int, numpy integer; a Fraction/Decimal/float only
    if its value is whole); bools are refused."""
    ok = _is_real(value)
    if ok and not isinstance(value, numbers.Integral):
        try:
            ok = float(value).is_integer() and value == int(value)
        except (OverflowError, ValueError, decimal.InvalidOperation):
            ok = False
    if not ok:
        raise AmpConfigError(f"{owner}.{name} must be a whole number (an int >= {minimum}), "
                             f"got {type(value).__name__} {value!r}")
    out = int(value)
    if not minimum <= out <= INT64_MAX:
        raise AmpConfigError(f"{owner}.{name} must be an int in [{minimum}, 2**63-1], "
                             f"got {value!r}")
    return out
