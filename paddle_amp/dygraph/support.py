"""``is_bfloat16_supported`` / ``is_float16_supported`` that tell the truth about this CPU.

The native answers False for every CPU, with or without oneDNN's bf16 kernels. Here a CPU
supports a dtype when ``auto_cast`` really runs an op in it here (``kernels.lowp_kernels``:
the project's device truth gates it, a probe runs it forward and backward). A bf16 class
``"emulated"`` CPU (AVX-512 without bf16 instructions) answers True: the kernels run, about
2-3x slower than float32 (``amp_adapters.rules.isa``). Other devices: the native's answer.
"""
from __future__ import annotations

from typing import Any

from . import kernels


def _is_cpu(device: Any) -> tuple[bool, Any]:
    from paddle.base import core
    from paddle.base.framework import _current_expected_place, _get_paddle_place
    place = _current_expected_place() if device is None else _get_paddle_place(device)
    return isinstance(place, core.CPUPlace), place


def is_bfloat16_supported(device: Any = None) -> bool:
    """Whether ``auto_cast(dtype="bfloat16")`` runs ops in bfloat16 on ``device`` (None: the
    current one); on a CPU, whether its oneDNN bf16 kernels run here."""
    cpu, place = _is_cpu(device)
    if not cpu:
        from paddle.base import core
        return core.is_bfloat16_supported(place)
    return bool(kernels.lowp_kernels("bfloat16"))


def is_float16_supported(device: Any = None) -> bool:
    """Whether ``auto_cast(dtype="float16")`` runs ops in float16 on ``device``; on a CPU, no
    (Paddle's CPU build has no float16 GEMM: ``emulate=True`` rounds through it instead)."""
    cpu, place = _is_cpu(device)
    if not cpu:
        from paddle.base import core
        return core.is_float16_supported(place)
    return bool(kernels.lowp_kernels("float16"))
