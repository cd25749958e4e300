"""The dtype vocabulary: one name per dtype, the low-precision dtypes, aliases, widest-wins.

The core and both backends speak numpy-style names: ``"float16"``,
``"bfloat16"``, ``"float32"``, ``"float64"`` (integer and bool dtypes keep
their numpy names; AMP never casts them). Every other spelling a user or a
framework hands over is turned into that name here, once, by ``dtype_name``:
``'fp16'``, ``'half'``, ``'BF16'``, ``np.float16``, ``np.dtype('float32')``,
MXNet 1.x's structured bfloat16 dtype, or a framework dtype object whose
``str`` ends in a name (``paddle.float16``, ``VarType.FP16``). No framework is
imported.
"""
from __future__ import annotations

import functools
from typing import Optional, Sequence

import numpy as np

from .errors import AmpConfigError, UnknownChoiceError

LOW_DTYPES = ("float16", "bfloat16")                  # what AMP lowers to
POLICY_DTYPES = ("float16", "bfloat16", "float32")    # a Policy's dtype (float32: the O0 baseline)
AMP_DTYPES = frozenset(POLICY_DTYPES)                 # what AMP casts between (never float64)
FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64")

# Widest wins: float16 and bfloat16 share a rank (neither holds the other, see ``widest``).
FLOAT_RANK = {"float16": 1, "bfloat16": 1, "float32": 2, "float64": 3}

SHORT_NAMES = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32", "float64": "fp64"}

# Other spellings of the floating dtypes (compared lower-case). Not "float": numpy reads it
# as float64 and torch as float32, so it is refused rather than guessed.
ALIASES = {
    **{name: name for name in FLOAT_DTYPES},
    **{short: name for name, short in SHORT_NAMES.items()},
    "half": "float16", "f16": "float16", "bf16": "bfloat16", "bfloat": "bfloat16",
    "single": "float32", "f32": "float32", "double": "float64", "f64": "float64",
}


def dtype_name(dtype: object) -> str:
    """The numpy-style name of ``dtype`` in any spelling (see the module docstring).

    Floating dtypes come out as one of ``FLOAT_DTYPES``; other numpy dtypes as
    their numpy name (``'int32'``). Raises ``UnknownChoiceError`` for a value
    that names no dtype. Cached: cheap enough for a per-op call.
    """
    try:
        return _cached_name(dtype)
    except TypeError:  # unhashable: not cached
        return _name(dtype)


@functools.lru_cache(maxsize=512)
def _cached_name(dtype: object) -> str:
    return _name(dtype)


def _name(dtype: object) -> str:
    if dtype is None:  # np.dtype(None) would say float64
        raise UnknownChoiceError("dtype", dtype, FLOAT_DTYPES)
    if isinstance(dtype, np.dtype) and dtype.names == ("bfloat16",):
        return "bfloat16"  # MXNet 1.x: np.dtype([("bfloat16", np.uint16)])
    text = dtype.strip().lower() if isinstance(dtype, str) else None
    if text is None:
        try:
            return np.dtype(dtype).name  # np.float16, np.dtype(...), float
        except Exception:  # numpy's parser raises TypeError, ValueError, SyntaxError...
            text = str(dtype).strip().lower()
    last = text.rsplit(".", 1)[-1]  # 'paddle.float16', VarType.FP16, torch.bfloat16
    if text in ALIASES or last in ALIASES:
        return ALIASES.get(text) or ALIASES[last]
    if last == "float":
        raise AmpConfigError(f"dtype {dtype!r} is ambiguous (numpy reads 'float' as float64, "
                             f"torch as float32): write 'float32' or 'float64'")
    for candidate in (text, last):  # 'int32', 'f2', '<f4'; paddle.int64
        try:
            return np.dtype(candidate).name
        except Exception:  # as above: not a dtype
            pass
    raise UnknownChoiceError("dtype", dtype, FLOAT_DTYPES)


def low_dtype(dtype: object, what: str = "dtype") -> str:
    """``dtype`` as one of ``LOW_DTYPES``, else ``UnknownChoiceError`` naming ``what``."""
    try:
        name = dtype_name(dtype)
    except UnknownChoiceError:
        name = None
    if name not in LOW_DTYPES:
        raise UnknownChoiceError(what, dtype, LOW_DTYPES)
    return name


def short_name(dtype: str) -> str:
    """``'fp16'``, ``'bf16'``, ``'fp32'`` or ``'fp64'`` (for var names and labels)."""
    return SHORT_NAMES[dtype_name(dtype)]


def widest(dtypes: Sequence[Optional[str]]) -> Optional[str]:
    """The widest floating dtype in ``dtypes``, independent of order.

    float16 with bfloat16 gives float32 (neither holds the other); None and
    non-floating dtypes are ignored; no floating dtype gives None.
    """
    floats = {d for d in dtypes if d in FLOAT_RANK}
    if not floats:
        return None
    top = max(FLOAT_RANK[d] for d in floats)
    at_top = {d for d in floats if FLOAT_RANK[d] == top}
    return at_top.pop() if len(at_top) == 1 else "float32"
