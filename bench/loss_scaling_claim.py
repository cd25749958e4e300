"""The loss-scaling claim of Micikevicius et al. (ICLR 2018), reproduced on CPU in both frameworks.

The digits MLP trained with the loss divided by K and the learning rate
multiplied by K (the same training in exact arithmetic, gradients K times
smaller), for K in {1, 2**16, 2**24, 2**26}, in fp32 and in fp16 EMULATED at
op boundaries (no fp16 GEMM on this CPU): without loss scaling, with a
static scale of 1024 and with dynamic scaling. Expected: fp32 about the same
everywhere, no scaling collapsing at large K, scaling matching fp32.

    python -m bench.loss_scaling_claim
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from amp_adapters import DynamicLossScale, NoOpLossScale, Policy, StaticLossScale
from amp_demo import digits_data, train

KS = (0, 16, 24, 26)  # log2 K
MODES = {
    "fp32": Policy.preset("O0"),
    "fp16, no scaling": Policy.preset("O1", emulate=True, loss_scale=NoOpLossScale()),
    "fp16, static x1024": Policy.preset("O1", emulate=True, loss_scale=StaticLossScale(1024.0)),
    "fp16, dynamic": Policy.preset("O1", emulate=True,
                                   loss_scale=DynamicLossScale(growth_interval=100)),
}


def flushed_fraction(data, k: float) -> float:
    """Fraction of the nonzero fp32 gradient values of the first batch that become zero when
    the loss is divided by ``k`` and the gradients are stored in fp16 (the reason for scaling)."""
    x, y = data.x_train[data.batches[0]], data.y_train[data.batches[0]]
    h = np.maximum(x @ data.w1 + data.b1, 0)
    logits = h @ data.w2 + data.b2
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    g = p.copy()
    g[np.arange(len(y)), y] -= 1
    g /= len(y)
    gh = (g @ data.w2.T) * (h > 0)
    grads = [h.T @ g, g.sum(0), x.T @ gh, gh.sum(0)]
    flat = np.concatenate([gr.ravel() for gr in grads]) / np.float32(k)
    nonzero = flat != 0
    return float(np.mean(flat[nonzero].astype(np.float16) == 0))


def run(frameworks=("mxnet", "paddle"), steps: int = 600,
        figure: Optional[str] = "bench/figures/loss_scaling_claim.png") -> str:
    """Train every (framework, mode, K) cell; return the markdown section."""
    data = digits_data(steps)
    acc: dict[tuple[str, str, int], float] = {}
    for fw in frameworks:
        for mode, policy in MODES.items():
            for k in KS:
                acc[fw, mode, k] = train(fw, policy, data, k=2.0**k).accuracy
                print(f"  {fw:7s} {mode:20s} K=2**{k:<2d} accuracy {acc[fw, mode, k]:.3f}",
                      flush=True)
    lines = ["## The loss-scaling claim (fp16 EMULATED on CPU)", "",
             f"Digits MLP 64-64-10, {steps} steps, batch 64, SGD lr 0.1; loss / K, lr x K. "
             "Test accuracy per cell.", "",
             "| framework | mode | " + " | ".join(f"K=2**{k}" for k in KS) + " |",
             "| --- | --- | " + " | ".join("---" for _ in KS) + " |"]
    for fw in frameworks:
        for mode in MODES:
            lines.append(f"| {fw} | {mode} | " +
                         " | ".join(f"{acc[fw, mode, k]:.3f}" for k in KS) + " |")
    lines += ["", "Fraction of nonzero fp32 gradient values that flush to zero when stored in "
              "fp16 (first batch, no scaling):", "",
              "| " + " | ".join(f"K=2**{k}" for k in KS) + " |",
              "| " + " | ".join("---" for _ in KS) + " |",
              "| " + " | ".join(f"{flushed_fraction(data, 2.0**k):.1%}" for k in KS) + " |"]
    if figure:
        _plot(acc, frameworks, figure)
        lines += ["", f"![loss-scaling claim]({figure.removeprefix('bench/')})"]
    return "\n".join(lines)


def _plot(acc, frameworks, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(frameworks), figsize=(5.5 * len(frameworks), 4), sharey=True)
    for ax, fw in zip(np.atleast_1d(axes), frameworks):
        for mode in MODES:  # fp32 drawn wide underneath: dynamic scaling lies right on it
            wide = dict(linewidth=6, alpha=0.35) if mode == "fp32" else {}
            ax.plot(KS, [acc[fw, mode, k] for k in KS], marker="o", label=mode, **wide)
        ax.set(title=f"{fw} (fp16 emulated)", xlabel="log2 K (loss / K, lr x K)",
               ylabel="test accuracy", ylim=(0, 1.02))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    print(run())
