"""Paddle glue shared by the backend: mode checks, dtype names, places.

Paddle 2.6.2 and 3.3.1 both keep the legacy program IR that this backend
rewrites; 3.3.1 builds PIR programs unless ``FLAGS_enable_pir_api=0``. The
checks here fail early, with the way out in the message, instead of deep in
the rewrite.
"""
from __future__ import annotations

from typing import Optional

import paddle
from paddle.base import core, framework

from amp_adapters.dtypes import FLOAT_DTYPES, SHORT_NAMES

VarType = core.VarDesc.VarType

# The core's floating dtype names <-> legacy program-IR var types (VarType.FP16, ...).
DTYPE_OF = {getattr(VarType, SHORT_NAMES[name].upper()): name for name in FLOAT_DTYPES}
VARTYPE_OF = {name: vt for vt, name in DTYPE_OF.items()}


def dtype_name(var) -> Optional[str]:
    """The floating dtype of a dense-tensor ``var`` as a string, or None (ints, bools, others)."""
    if var is None or var.type != VarType.LOD_TENSOR:
        return None
    return DTYPE_OF.get(var.dtype)


def require_legacy_static(what: str) -> None:
    """Raise unless Paddle is in static-graph mode on the legacy program IR."""
    if paddle.in_dynamic_mode():
        raise RuntimeError(
            f"{what} rewrites static programs, but Paddle is in dynamic (dygraph) mode. "
            f"Call paddle.enable_static() before building the program; for dygraph use "
            f"paddle.amp.auto_cast and paddle.amp.GradScaler.")
    if framework.in_pir_mode():
        raise RuntimeError(
            f"{what} works on the legacy program IR only, and PIR is on "
            f"(FLAGS_enable_pir_api=1, the default of Paddle 3). Set FLAGS_enable_pir_api=0 in "
            f"the environment before importing paddle, or build and run the program inside "
            f"`with paddle.pir_utils.OldIrGuard():` (it calls paddle.framework.set_flags("
            f"{{'FLAGS_enable_pir_api': 0}}) and switches the IR; set_flags alone does not "
            f"switch an already imported Paddle 3).")


def current_device() -> str:
    """'GPU' if programs run on a CUDA place (``paddle.set_device``), else 'CPU': the device
    name ``op_supported_infos`` takes."""
    place = framework._current_expected_place()
    gpu = isinstance(place, core.CUDAPlace) or (
        isinstance(place, core.Place) and place.is_gpu_place())
    return "GPU" if gpu else "CPU"
