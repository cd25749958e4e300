"""Paddle glue, static or not: mode checks, dtype names, places, values converted to and
from a low dtype (``to_low``/``from_low``). Which IR a program is in is ``ir``'s question
(``ir.kind``)."""
from __future__ import annotations

from typing import Optional

import numpy as np
import paddle
from paddle.base import core, framework

from amp_adapters.rules.dtypes import FLOAT_DTYPES, SHORT_NAMES

VarType = core.VarDesc.VarType

# The core's floating dtype names <-> legacy program-IR var types (VarType.FP16, ...).
DTYPE_OF = {getattr(VarType, SHORT_NAMES[name].upper()): name for name in FLOAT_DTYPES}
VARTYPE_OF = {name: vt for vt, name in DTYPE_OF.items()}

def dtype_name(var) -> Optional[str]:
    """The floating dtype of a dense-tensor ``var`` as a string, or None (ints, bools, others)."""
    if var is None or var.type != VarType.LOD_TENSOR:
        return None
    return DTYPE_OF.get(var.dtype)


def require_static(what: str) -> None:
    """Raise unless Paddle is in static-graph mode (either IR)."""
    if paddle.in_dynamic_mode():
        raise RuntimeError(
            f"{what} rewrites static programs, but Paddle is in dynamic (dygraph) mode. "
            f"Call paddle.enable_static() before building the program; for dygraph use "
            f"paddle.amp.auto_cast and paddle.amp.GradScaler.")


def current_device() -> str:
    """'GPU' if programs run on a CUDA place (``paddle.set_device``), else 'CPU': the device
    name ``op_supported_infos`` takes."""
    place = framework._current_expected_place()
    gpu = isinstance(place, core.CUDAPlace) or (
        isinstance(place, core.Place) and place.is_gpu_place())
    return "GPU" if gpu else "CPU"


def expected_place():
    """The place programs run on (Paddle 3 under PIR reports an undefined place through
    ``_current_expected_place``; ``_current_expected_place_`` resolves it)."""
    resolve = getattr(framework, "_current_expected_place_", framework._current_expected_place)
    return resolve()


def to_low(tensor, dtype: str) -> np.ndarray:
    """The fp32 ``tensor`` as a numpy array of ``dtype`` (bf16 as its uint16 bit pattern)."""
    values = np.asarray(tensor, dtype=np.float32)
    if dtype == "float16":
        return values.astype(np.float16)
    bits = values.view(np.uint32)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)  # round to nearest even


def from_low(tensor, dtype: str) -> np.ndarray:
    """A low ``tensor``'s values in float32 (exact: every fp16/bf16 value is a float32)."""
    values = np.array(tensor)
    if dtype == "bfloat16":
        return (values.astype(np.uint32) << 16).view(np.float32)
    return values.astype(np.float32)
