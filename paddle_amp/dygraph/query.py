"""``is_autocast_enabled`` / ``get_autocast_dtype`` (Paddle 3's names, and the cpu/gpu
variants): what the active ``auto_cast`` region does, as ``paddle.amp``'s answer the
tracer's state. ``device_type`` is accepted and ignored, as the native ignores it."""
from __future__ import annotations

from typing import Any

from . import frames


def is_autocast_enabled(device_type: Any = None) -> bool:
    """True inside a region that runs mixed precision (not O0, not ``enable=False``)."""
    frame = frames.current()
    return frame is not None and frame.policy.enabled


def get_autocast_dtype(device_type: Any = None) -> str:
    """The active region's low dtype, else ``"float16"`` (the native's default answer)."""
    frame = frames.current()
    return frame.policy.dtype if is_autocast_enabled() and frame is not None else "float16"


def get_autocast_cpu_dtype(device_type: Any = None) -> str:
    return get_autocast_dtype(device_type)


def get_autocast_gpu_dtype(device_type: Any = None) -> str:
    return get_autocast_dtype(device_type)
