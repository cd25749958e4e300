"""The demo's figure: loss curves and the loss scale over steps (matplotlib, Agg)."""
from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from .result import TrainResult


def _power_of_two(value: float, _pos: Any = None) -> str:
    """A loss-scale tick: ``2^16``, read off as the scale's log2 (the scale moves by x2)."""
    if value <= 0:
        return ""
    k = math.log2(value)
    return f"$2^{{{k:.0f}}}$" if abs(k - round(k)) < 1e-9 else ""


def figure(results: Sequence[TrainResult]) -> Any:
    """The figure (matplotlib, Agg): the loss per framework and mode, and the loss scale
    on a log2 axis with every power of two in range labelled."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    fig, (ax_loss, ax_scale) = plt.subplots(1, 2, figsize=(12, 4.5))
    width = {fw: 4.0 - 1.5 * i for i, fw in enumerate(dict.fromkeys(r.framework for r in results))}
    for r in results:
        label = f"{r.framework} {r.mode}"
        smooth = np.convolve(r.losses, np.ones(10) / 10, mode="valid")
        ax_loss.plot(smooth, label=label, linestyle="-" if r.mode == "fp32" else "--")
        if r.mode != "fp32":
            ax_scale.step(range(len(r.scales)), r.scales, where="post", label=label,
                          linewidth=width[r.framework], alpha=0.8)  # equal lines stay visible
    ax_loss.set(title="training loss (10-step mean, log scale)", xlabel="step", ylabel="loss",
                yscale="log")
    # plain numbers (0.1, 0.2, 0.5, 1, 2), not 10^-1
    ax_loss.yaxis.set_major_formatter(FuncFormatter(lambda v, _p: f"{v:g}"))
    ax_loss.yaxis.set_minor_formatter(FuncFormatter(lambda v, _p: f"{v:g}"
                                                    if f"{v:.0e}"[0] in "25" else ""))
    ax_scale.set(title="loss scale (identical trajectories overlap)", xlabel="step",
                 ylabel="loss scale (log2 axis)")
    ax_scale.set_yscale("log", base=2)
    scales = [s for r in results if r.mode != "fp32" for s in r.scales if s > 0]
    if scales:  # one labelled tick per power of two, one step of margin each side
        lo, hi = math.floor(math.log2(min(scales))) - 1, math.ceil(math.log2(max(scales))) + 1
        ax_scale.set_ylim(2.0**lo, 2.0**hi)
        ax_scale.yaxis.set_major_locator(LogLocator(base=2, subs=(1.0,), numticks=hi - lo + 2))
    ax_scale.yaxis.set_major_formatter(FuncFormatter(_power_of_two))
    ax_scale.yaxis.set_minor_formatter(NullFormatter())
    for ax in (ax_loss, ax_scale):
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def plot(results: Sequence[TrainResult], path: str) -> None:
    """Write ``figure(results)`` to ``path`` (.png, .pdf or .svg)."""
    import matplotlib.pyplot as plt

    fig = figure(results)
    fig.savefig(path, dpi=110)
    plt.close(fig)
