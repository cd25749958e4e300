"""The demo's side-by-side table: one row per framework and mode."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from .result import TrainResult


def format_table(results: Sequence[TrainResult]) -> str:
    """One side-by-side table; the step-time ratio is AMP over fp32 within each framework."""
    fp32_time = {r.framework: r.step_time for r in results if r.mode == "fp32"}
    rows = [("framework", "mode", "accuracy", "final loss", "scale moves", "skipped",
             "casts", "final scale", "step time vs fp32")]
    for r in results:
        base = fp32_time.get(r.framework)
        ratio = f"{r.step_time / base:.2f}x" if base else "-"
        rows.append((r.framework, r.mode, f"{r.accuracy:.3f}", f"{np.mean(r.losses[-20:]):.3f}",
                     str(r.scale_moves), str(r.skipped_steps), str(r.casts),
                     f"{r.scales[-1]:g}", ratio))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
