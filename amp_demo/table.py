"""The demo's side-by-side table: one row per framework and mode."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from .result import TrainResult

MIB = 1 << 20
HEADER = ("framework", "mode", "accuracy", "final loss", "scale moves", "skipped", "casts",
          "final scale", "step time vs fp32", "peak MiB", "peak vs fp32")


def format_table(results: Sequence[TrainResult]) -> str:
    """One side-by-side table; the step-time and peak-memory ratios are AMP over fp32 within
    each framework (``-``: not measured, or no fp32 row to divide by). A peak ratio of an
    emulated row is marked ``*``: emulation stores float32."""
    fp32 = {r.framework: r for r in results if r.mode == "fp32"}
    rows = [HEADER]
    for r in results:
        base = fp32.get(r.framework)
        ratio = f"{r.step_time / base.step_time:.2f}x" if base else "-"
        rows.append((r.framework, r.mode, f"{r.accuracy:.3f}", f"{np.mean(r.losses[-20:]):.3f}",
                     str(r.scale_moves), str(r.skipped_steps), str(r.casts),
                     f"{r.scales[-1]:g}", ratio, *_memory(r, base)))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _memory(r: TrainResult, base) -> tuple[str, str]:
    """(peak MiB, peak over the fp32 row's) of ``r``; ``-`` where not measured."""
    if r.memory is None:
        return "-", "-"
    mark = "*" if "emulated" in r.mode else ""
    if base is None or base.memory is None or not base.memory.peak:
        return f"{r.memory.peak / MIB:.0f}", "-"
    return f"{r.memory.peak / MIB:.0f}", f"{r.memory.peak / base.memory.peak:.2f}x{mark}"
