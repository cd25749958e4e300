"""Paddle's own count of its tensor bytes, for ``amp_adapters.services.memory`` (a ``TensorBytes``).

Paddle's host allocator counts the bytes it has handed out (``Allocated``), with a peak:
``paddle.base.core.host_memory_stat_peak_value("Allocated", 0)``. Paddle 3 resets that peak
(``host_memory_stat_reset_peak_value``); Paddle 2.6 cannot, so there the figure is the
peak since the process started (warm-up steps included, which run the same step), and
the name says so. Both IRs and dygraph allocate through it.
"""
from __future__ import annotations

from typing import Optional

from paddle.base import core


class HostAllocatorBytes:
    """The most bytes Paddle's host allocator held at once since ``start`` (Paddle 3) or
    since the process started (Paddle 2.6: no reset)."""

    def __init__(self) -> None:
        self._resets = hasattr(core, "host_memory_stat_reset_peak_value")
        self.name = "Paddle host allocator, Allocated" + (
            "" if self._resets else " (peak since the process started: Paddle 2.6 has no reset)")

    def start(self) -> None:
        if self._resets:
            core.host_memory_stat_reset_peak_value("Allocated", 0)

    def peak(self) -> Optional[int]:
        return int(core.host_memory_stat_peak_value("Allocated", 0))
