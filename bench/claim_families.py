"""The loss-scaling claim on four model families, in both frameworks, under shared policies.

MLP and a small CNN on the digits images, an LSTM and a one-block Transformer
encoder on the digits rows read as 8-step sequences (bench/claim_data.py).
Every framework trains every family in fp32 and under the same policy
objects: O1 fp16 with dynamic scaling, O1 fp16 unscaled, O1 bf16, O2 fp16
with dynamic scaling, O2 bf16. A low-precision op is EMULATED at op boundaries
where the CPU has no kernel for it (fp16 on every CPU build; bf16 where the
backend's probe finds none: the title says which, ``precision_label``), and O2's
master-weight update is a float32 optimizer update on float32 masters with one
cast back. The fp16 modes also run
with the loss divided by K and the learning rate multiplied by K (the same
training in exact arithmetic, gradients K times smaller), K = 2**24 only
(plus K = 1) to keep the section at a few minutes on 2 cores.

    python -m bench --only claim_families
"""
from __future__ import annotations

import importlib
import time
from typing import Optional


from amp_adapters import DynamicLossScale, NoOpLossScale, Policy

from .claim_data import FAMILIES, claim_data, reordered

STEPS = 300
KS = (0, 24)  # log2 K for the fp16 modes
TOLERANCE = 0.005  # accuracy (0.5 points) the scaled modes must stay within of fp32
LOSS_MARGIN = 0.10  # or: test loss within 10% (relative) of fp32's
_DYNAMIC = DynamicLossScale(growth_interval=100)
MODES: dict[str, Policy] = {
    "fp32": Policy.preset("O0"),
    "O1 fp16 dynamic": Policy.preset("O1", emulate=True, loss_scale=_DYNAMIC),
    "O1 fp16 unscaled": Policy.preset("O1", emulate=True, loss_scale=NoOpLossScale()),
    "O1 bf16": Policy.preset("O1-bf16", emulate=True),
    "O2 fp16 dynamic": Policy.preset("O2", emulate=True, loss_scale=_DYNAMIC),
    "O2 bf16": Policy.preset("O2-bf16", emulate=True),
}
NOISE = "fp32, other batch order"  # the spread of one fp32 run: what a difference must beat
MODES[NOISE] = MODES["fp32"]
SWEPT = ("O1 fp16 dynamic", "O1 fp16 unscaled", "O2 fp16 dynamic")
SCALED = ("O1 fp16 dynamic", "O1 bf16", "O2 fp16 dynamic", "O2 bf16")
FRAMEWORKS = ("mxnet", "paddle")


def cells():
    """Every (framework, family, mode, log2 K) this section trains."""
    for fw in FRAMEWORKS:
        for family in FAMILIES:
            for mode in MODES:
                for k in (KS if mode in SWEPT else (0,)):
                    yield fw, family, mode, k


def run(figure: Optional[str] = "bench/figures/claim_families.png") -> str:
    data = claim_data(STEPS)
    other = reordered(data, seed=1)
    out = {}
    t0 = time.perf_counter()
    for fw, family, mode, k in cells():
        trainer = importlib.import_module(f"bench.claim_{fw}")
        out[fw, family, mode, k] = trainer.train(family, MODES[mode],
                                                 other if mode == NOISE else data, k=2.0 ** k)
        o = out[fw, family, mode, k]
        print(f"  {fw:6s} {family:11s} {mode:17s} K=2**{k:<2d} acc {o.accuracy:.3f} "
              f"loss {o.test_loss:.3f} skipped {o.skipped_steps}", flush=True)
    minutes = (time.perf_counter() - t0) / 60
    lines = [f"## The loss-scaling claim on four model families ({precision_label()})", "",
             f"{STEPS} steps, batch 64, SGD lr 0.05 momentum 0.9, one shared policy object per "
             "mode for both frameworks. Test accuracy (test loss) on the 397 held-out digits; "
             "each framework initialises its own weights, so compare within a column pair. "
             f"K: loss / K and lr x K. Section runtime {minutes:.1f} min on this machine.", "",
             "| family | mode | " + " | ".join(f"{fw} K=2**{k}" for fw in FRAMEWORKS
                                                 for k in KS) + " |",
             "| --- | --- | " + " | ".join("---" for _ in FRAMEWORKS for _ in KS) + " |"]
    for family in FAMILIES:
        for mode in MODES:
            row = []
            for fw in FRAMEWORKS:
                for k in KS:
                    o = out.get((fw, family, mode, k))
                    row.append(f"{o.accuracy:.3f} ({o.test_loss:.3f})" if o else "")
            lines.append(f"| {family} | {mode} | " + " | ".join(row) + " |")
    lines += ["", *verdict(out)]
    if figure:
        _plot(out, figure)
        lines += ["", f"![claim on four families]({figure.removeprefix('bench/')})"]
    return "\n".join(lines)


def verdict(out) -> list[str]:
    """The claim, checked cell by cell: scaled modes vs fp32, unscaled fp16 at large K."""
    lines = [f"Claim check (scaled modes within {TOLERANCE * 100:.1f} accuracy points of fp32, "
             f"or test loss within {LOSS_MARGIN:.0%} of fp32's, at every K):", ""]
    misses, worst = [], 0.0
    for fw in FRAMEWORKS:
        for family in FAMILIES:
            base = out[fw, family, "fp32", 0]
            for mode in SCALED:
                for k in (KS if mode in SWEPT else (0,)):
                    o = out[fw, family, mode, k]
                    gap = base.accuracy - o.accuracy
                    worst = max(worst, gap)
                    if gap > TOLERANCE and o.test_loss > base.test_loss * (1 + LOSS_MARGIN):
                        misses.append(f"{fw} {family} {mode} K=2**{k}: accuracy "
                                      f"{o.accuracy:.3f} vs {base.accuracy:.3f}, loss "
                                      f"{o.test_loss:.3f} vs {base.test_loss:.3f}")
    lines.append(f"- largest accuracy drop of a scaled mode below fp32: {worst * 100:.1f} points")
    noise = {(fw, family): abs(out[fw, family, NOISE, 0].accuracy
                               - out[fw, family, "fp32", 0].accuracy)
             for fw in FRAMEWORKS for family in FAMILIES}
    lines.append("- fp32 itself, trained on another batch order, moves by " + ", ".join(
        f"{fw} {family} {gap * 100:.1f}" for (fw, family), gap in noise.items()) +
        " points: one run's noise floor")
    lines.append("- every scaled cell within the margin" if not misses else
                 "- outside the margin: " + "; ".join(misses))
    big = max(KS)
    failed = [(fw, family) for fw in FRAMEWORKS for family in FAMILIES
              if out[fw, family, "O1 fp16 unscaled", big].accuracy
              < out[fw, family, "fp32", 0].accuracy - 0.2]
    lines.append(f"- unscaled fp16 at K=2**{big} fails (over 20 points below fp32) in "
                 f"{len(failed)} of {len(FRAMEWORKS) * len(FAMILIES)} family/framework cells")
    return lines


def _plot(out, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(FAMILIES), figsize=(4.2 * len(FAMILIES), 3.8), sharey=True)
    colors = dict(zip(MODES, plt.rcParams["axes.prop_cycle"].by_key()["color"]))
    for ax, family in zip(axes, FAMILIES):
        for fw, style in zip(FRAMEWORKS, ("-", "--")):
            for mode in MODES:
                # modes not swept are drawn flat at their K=1 value
                acc = [out[fw, family, mode, k if mode in SWEPT else 0].accuracy for k in KS]
                ax.plot(KS, acc, style, marker="o", color=colors[mode],
                        label=f"{fw} {mode}", linewidth=4 if mode == "fp32" else 1.5,
                        alpha=0.4 if mode == "fp32" else 0.9)
        ax.set(title=family, xlabel="log2 K (loss / K, lr x K)", ylim=(0, 1.02))
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("test accuracy")
    axes[-1].legend(fontsize=6, loc="lower left")
    fig.suptitle(f"{precision_label()}; solid: mxnet, dashed: paddle", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def precision_label() -> str:
    """How fp16 and bf16 ran on this CPU, per framework, by the backends' own kernel answers
    (the GEMM of the families), never assumed."""
    import mxnet as mx
    from mxnet_amp.kernels import has_kernel
    from paddle_amp.kernels import lowp_kernels
    real = {"mxnet": {dt: has_kernel("FullyConnected", mx.cpu(), dt, backward=True)
                      for dt in ("float16", "bfloat16")},
            "paddle": {dt: bool({"matmul_v2", "mul"} & lowp_kernels("CPU", dt))
                       for dt in ("float16", "bfloat16")}}
    parts = []
    for dt, short in (("float16", "fp16"), ("bfloat16", "bf16")):
        on = [fw for fw in FRAMEWORKS if real[fw][dt]]
        off = [fw for fw in FRAMEWORKS if not real[fw][dt]]
        if not on:
            parts.append(f"{short} EMULATED")
        elif not off:
            parts.append(f"{short} on real kernels")
        else:
            parts.append(f"{short} on real kernels in {', '.join(on)}, EMULATED in "
                         f"{', '.join(off)}")
    return "; ".join(parts) + " on this CPU"


if __name__ == "__main__":
    print(run())
