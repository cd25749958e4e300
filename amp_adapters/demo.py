"""A framework-free end-to-end run of the core: why fp16 training needs loss scaling.

An MLP (64-64-10) on scikit-learn's bundled digits, written in numpy. Its fp16
mode is EMULATED (values and gradients rounded through float16 at every op
boundary, arithmetic in float32, master weights in float32), exactly the
semantics the backends' ``emulate=True`` gives. The loss is divided by ``K``
and the learning rate multiplied by ``K``: the same training in exact
arithmetic, but with gradients ``K`` times smaller, as in Micikevicius et al.
(ICLR 2018). Without scaling they flush to zero in fp16; with the core's
``DynamicLossScale`` they survive and training matches fp32.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from .scaler import DynamicLossScale, LossScale, NoOpLossScale, StaticLossScale


def _r16(x: np.ndarray) -> np.ndarray:
    """Round through float16 (emulation of an fp16 op boundary); overflow gives inf."""
    with np.errstate(over="ignore"):
        return x.astype(np.float16).astype(np.float32)


def _ident(x: np.ndarray) -> np.ndarray:
    return x


@dataclass(frozen=True)
class RunResult:
    mode: str
    accuracy: float
    final_loss: float
    zero_grad_fraction: float   # gradient values that were exactly zero, averaged over steps
    skipped_steps: int
    scale_moves: int
    final_scale: float


def train(mode: str, k: float = 2.0**24, steps: int = 800, seed: int = 0,
          loss_scale: Optional[LossScale] = None) -> RunResult:
    """Train the MLP; ``mode`` is ``fp32`` or ``fp16-emulated`` (with ``loss_scale``)."""
    from sklearn.datasets import load_digits

    data = load_digits()
    x = (data.data / 16.0).astype(np.float32)
    y = data.target
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(x))
    x, y = x[order], y[order]
    xtr, ytr, xte, yte = x[:1400], y[:1400], x[1400:], y[1400:]
    w1 = (rng.standard_normal((64, 64)) * np.sqrt(2 / 64)).astype(np.float32)
    w2 = (rng.standard_normal((64, 10)) * np.sqrt(2 / 64)).astype(np.float32)
    b1, b2 = np.zeros(64, np.float32), np.zeros(10, np.float32)
    r = _r16 if mode != "fp32" else _ident
    state = loss_scale if loss_scale is not None else NoOpLossScale()
    lr, zero_frac, moves, loss = 0.1 * k, [], 0, float("nan")
    for step in range(steps):
        idx = rng.integers(0, len(xtr), 64)
        xb, yb = xtr[idx], ytr[idx]
        h = np.maximum(r(r(xb) @ r(w1) + b1), 0)
        logits = r(r(h) @ r(w2) + b2)
        p = np.exp(logits - logits.max(1, keepdims=True))   # softmax + loss in fp32
        p /= p.sum(1, keepdims=True)
        loss = float(-np.log(p[np.arange(64), yb] + 1e-12).mean())
        # backward of (loss / k) * scale: gradients rounded through fp16 at op boundaries
        g = p.copy()
        g[np.arange(64), yb] -= 1
        g = r(g * np.float32(state.scale / (64 * k)))
        gw2, gb2 = r(h.T @ g), g.sum(0)
        gh = r(r(g @ w2.T) * (h > 0))
        gw1, gb1 = r(xb.T @ gh), gh.sum(0)
        grads = [gw1, gb1, gw2, gb2]
        found_inf = not all(np.isfinite(gr).all() for gr in grads)
        zero_frac.append(float(np.mean(np.concatenate([gr.ravel() for gr in grads]) == 0)))
        if not (found_inf and state.checks_overflow):
            inv = np.float32(1.0 / state.scale)
            for param, grad in zip((w1, b1, w2, b2), grads):
                param -= np.float32(lr) * grad * inv
        new = state.adjust(found_inf)
        moves += new.scale != state.scale
        state = new
    h = np.maximum(xte @ w1 + b1, 0)
    acc = float(((h @ w2 + b2).argmax(1) == yte).mean())
    return RunResult(mode, acc, loss, float(np.mean(zero_frac)), state.skipped_steps, moves,
                     state.scale)


def run(k: float = 2.0**24, steps: int = 800) -> list[RunResult]:
    """fp32, emulated fp16 without scaling, with a static scale and with dynamic scaling."""
    runs = [
        ("fp32", None),
        ("fp16-emulated, no scaling", None),
        ("fp16-emulated, static x1024", StaticLossScale(1024.0)),
        ("fp16-emulated, dynamic", DynamicLossScale(growth_interval=100)),
    ]
    out = []
    for label, ls in runs:
        res = train("fp32" if label == "fp32" else "fp16", k=k, steps=steps, loss_scale=ls)
        out.append(RunResult(label, *list(res.__dict__.values())[1:]))
    return out


def format_table(results: list[RunResult], k: float) -> str:
    head = f"MLP on digits, loss / K and lr x K with K = 2**{int(np.log2(k))} (fp16 is EMULATED)"
    rows = [("mode", "accuracy", "final loss", "zero grads", "skipped", "scale moves",
             "final scale")]
    for r in results:
        rows.append((r.mode, f"{r.accuracy:.3f}", f"{r.final_loss:.3f}",
                     f"{r.zero_grad_fraction:.1%}", str(r.skipped_steps), str(r.scale_moves),
                     f"{r.final_scale:g}"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows]
    return "\n".join([head, lines[0], "  ".join("-" * w for w in widths), *lines[1:]])
