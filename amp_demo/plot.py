"""The demo's figure: loss curves and the loss scale over steps (matplotlib, Agg)."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from .result import TrainResult


def plot(results: Sequence[TrainResult], path: str) -> None:
    """Loss curves per framework and mode, and the loss scale over steps, to ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_loss, ax_scale) = plt.subplots(1, 2, figsize=(12, 4.5))
    width = {fw: 4.0 - 1.5 * i for i, fw in enumerate(dict.fromkeys(r.framework for r in results))}
    for r in results:
        label = f"{r.framework} {r.mode}"
        smooth = np.convolve(r.losses, np.ones(10) / 10, mode="valid")
        ax_loss.plot(smooth, label=label, linestyle="-" if r.mode == "fp32" else "--")
        if r.mode != "fp32":
            ax_scale.step(range(len(r.scales)), r.scales, where="post", label=label,
                          linewidth=width[r.framework], alpha=0.8)  # equal lines stay visible
    ax_loss.set(title="training loss (10-step mean)", xlabel="step", ylabel="loss", yscale="log")
    ax_scale.set(title="loss scale (identical trajectories overlap)", xlabel="step",
                 ylabel="scale", yscale="log")
    for ax in (ax_loss, ax_scale):
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
