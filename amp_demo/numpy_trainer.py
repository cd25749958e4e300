"""The demo's reference trainer in numpy: fp32, or fp16 EMULATED at op boundaries.

The same MLP, batches and SGD as the framework trainers, written out by hand
so the numerics are visible: values and gradients are rounded through
float16 where an fp16 kernel would store them, arithmetic stays float32, and
the loss scale follows the core's state machine (``policy.loss_scale``).
"""
from __future__ import annotations

import time
from typing import Optional

import numpy as np

from amp_adapters import Policy

from .data import DigitsData, evaluate
from .result import OnStep, TrainResult, mode_label


def _r16(x: np.ndarray) -> np.ndarray:
    """Round through float16 (an emulated fp16 op boundary); overflow gives inf."""
    with np.errstate(over="ignore"):
        return x.astype(np.float16).astype(np.float32)


def train_numpy(policy: Policy, data: DigitsData, *, lr: float = 0.1, k: float = 1.0,
                on_step: Optional[OnStep] = None) -> TrainResult:
    """Reference trainer in numpy: fp32, or fp16 emulated at every op boundary (O1 lists:
    the two GEMMs run "fp16", softmax and the loss fp32), SGD on fp32 master weights."""
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
