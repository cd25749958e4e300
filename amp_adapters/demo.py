"""The demo: one MLP on scikit-learn's digits, trained in each framework in fp32 and with AMP.

Framework-free orchestration: the data, the initial weights and the batch
order are made here once, so every framework trains the same model on the
same batches; each backend's ``<framework>_amp.demo.train_digits`` (loaded by
name, so the core imports no framework) runs the steps and returns a
``TrainResult``. ``numpy`` is a reference trainer written here: fp32, or fp16
EMULATED by rounding values and gradients through float16 at op boundaries.

The loss may be divided by ``k`` and the learning rate multiplied by ``k``
(the same training in exact arithmetic, with gradients ``k`` times smaller),
as in Micikevicius et al. (ICLR 2018): in fp16 without loss scaling those
gradients flush to zero.
"""
from __future__ import annotations

import importlib
import math
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import numpy as np

from .errors import UnknownChoiceError
from .policy import Policy

FRAMEWORKS = ("mxnet", "paddle", "numpy")
OnStep = Callable[[int, float, float], None]  # (step, loss, scale)


@dataclass(frozen=True)
class DigitsData:
    """Train/test split, the initial MLP weights and the batch order, shared by every framework."""

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    w1: np.ndarray   # (64, hidden): y = x @ w1 + b1 (MXNet's Dense stores the transpose)
    b1: np.ndarray
    w2: np.ndarray   # (hidden, 10)
    b2: np.ndarray
    batches: np.ndarray  # (steps, batch) indices into the training set


def digits_data(steps: int, batch: int = 64, hidden: int = 64, seed: int = 0) -> DigitsData:
    """The digits split (1400 train / 397 test) and He-initialised weights, from ``seed``."""
    from sklearn.datasets import load_digits

    raw = load_digits()
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(raw.target))
    x = (raw.data[order] / 16.0).astype(np.float32)
    y = raw.target[order].astype(np.int64)
    f32 = np.float32
    return DigitsData(
        x_train=x[:1400], y_train=y[:1400], x_test=x[1400:], y_test=y[1400:],
        w1=(rng.standard_normal((64, hidden)) * math.sqrt(2 / 64)).astype(f32),
        b1=np.zeros(hidden, f32),
        w2=(rng.standard_normal((hidden, 10)) * math.sqrt(2 / hidden)).astype(f32),
        b2=np.zeros(10, f32),
        batches=rng.integers(0, 1400, (steps, batch)),
    )


@dataclass(frozen=True)
class TrainResult:
    """One training run: what the side-by-side table and the plot show."""

    framework: str
    mode: str                       # "fp32" or a label such as "fp16 (emulated)"
    accuracy: float                 # on the test split
    losses: tuple[float, ...]       # unscaled training loss (times k) per step
    scales: tuple[float, ...]       # loss scale used at each step
    skipped_steps: int
    casts: int                      # casts the AMP rewrite inserted (0 for fp32)
    step_time: float                # median seconds per step
    zero_grad_fraction: float = float("nan")  # gradient values exactly zero (numpy only)

    @property
    def scale_moves(self) -> int:
        return sum(a != b for a, b in zip(self.scales, self.scales[1:]))


def evaluate(data: DigitsData, w1: np.ndarray, b1: np.ndarray, w2: np.ndarray,
             b2: np.ndarray) -> float:
    """Test accuracy of trained weights, computed in numpy fp32 the same way for every framework."""
    h = np.maximum(data.x_test @ w1 + b1, 0)
    return float(((h @ w2 + b2).argmax(1) == data.y_test).mean())


def mode_label(policy: Policy, emulated: bool) -> str:
    """``fp32``, or the dtype with ``(emulated)`` when no low-precision kernel ran."""
    if not policy.enabled:
        return "fp32"
    return f"{'fp16' if policy.dtype == 'float16' else 'bf16'} {policy.level}" + \
        (" (emulated)" if emulated else "")


def train(framework: str, policy: Policy, data: DigitsData, *, lr: float = 0.1, k: float = 1.0,
          on_step: Optional[OnStep] = None) -> TrainResult:
    """Train the digits MLP in ``framework`` under ``policy`` (O0 is the fp32 baseline)."""
    if framework not in FRAMEWORKS:
        raise UnknownChoiceError("framework", framework, FRAMEWORKS)
    if framework == "numpy":
        return train_numpy(policy, data, lr=lr, k=k, on_step=on_step)
    backend = importlib.import_module(f"{framework}_amp.demo")
    return backend.train_digits(policy, data, lr=lr, k=k, on_step=on_step)


def _r16(x: np.ndarray) -> np.ndarray:
    """Round through float16 (an emulated fp16 op boundary); overflow gives inf."""
    with np.errstate(over="ignore"):
        return x.astype(np.float16).astype(np.float32)


def train_numpy(policy: Policy, data: DigitsData, *, lr: float = 0.1, k: float = 1.0,
                on_step: Optional[OnStep] = None) -> TrainResult:
    """Reference trainer in numpy: fp32, or fp16 emulated at every op boundary (O1 lists:
    the two GEMMs run "fp16", softmax and the loss fp32), SGD on fp32 master weights."""
    import time

    r = _r16 if policy.enabled else (lambda a: a)
    w1, b1, w2, b2 = (a.copy() for a in (data.w1, data.b1, data.w2, data.b2))
    state = policy.loss_scale
    losses, scales, zero_frac, times = [], [], [], []
    for step, idx in enumerate(data.batches):
        t0 = time.perf_counter()
        xb, yb, n = data.x_train[idx], data.y_train[idx], len(idx)
        h = np.maximum(r(r(xb) @ r(w1) + b1), 0)
        logits = r(r(h) @ r(w2) + b2)
        p = np.exp(logits - logits.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        losses.append(float(-np.log(p[np.arange(n), yb] + 1e-12).mean()))
        g = p.copy()
        g[np.arange(n), yb] -= 1
        g = r(g * np.float32(state.scale / (n * k)))   # backward of (loss / k) * scale
        gw2, gb2 = r(h.T @ g), g.sum(0)
        gh = r(r(g @ w2.T) * (h > 0))
        grads = [r(xb.T @ gh), gh.sum(0), gw2, gb2]
        found_inf = not all(np.isfinite(gr).all() for gr in grads)
        zero_frac.append(float(np.mean(np.concatenate([gr.ravel() for gr in grads]) == 0)))
        scales.append(state.scale)
        if not (found_inf and state.checks_overflow):
            step_size = np.float32(lr * k / state.scale)
            for param, grad in zip((w1, b1, w2, b2), grads):
                param -= step_size * grad
        state = state.adjust(found_inf)
        times.append(time.perf_counter() - t0)
        if on_step:
            on_step(step, losses[-1], scales[-1])
    return TrainResult("numpy", mode_label(policy, policy.enabled),
                       evaluate(data, w1, b1, w2, b2), tuple(losses),
                       tuple(scales), state.skipped_steps, 0, float(np.median(times)),
                       float(np.mean(zero_frac)))


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
