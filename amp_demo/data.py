"""The demo's data: scikit-learn's digits, the MLP's initial weights and the batch order.

Made once, here, so that every framework trains the same model on the same
batches; ``evaluate`` scores trained weights in numpy fp32, the same way for
every framework. No framework is imported.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


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


def shaped_data(steps: int, batch: int = 64, hidden: int = 64, seed: int = 0) -> DigitsData:
    """``digits_data``'s shapes and dtypes with random values, without scikit-learn: what a
    measuring process trains on (a step's memory depends on the shapes, not on the values,
    and importing scikit-learn costs a second or two per process)."""
    rng = np.random.default_rng(seed)
    f32 = np.float32
    return DigitsData(
        x_train=rng.random((1400, 64), f32), y_train=rng.integers(0, 10, 1400),
        x_test=rng.random((397, 64), f32), y_test=rng.integers(0, 10, 397),
        w1=(rng.standard_normal((64, hidden)) * math.sqrt(2 / 64)).astype(f32),
        b1=np.zeros(hidden, f32),
        w2=(rng.standard_normal((hidden, 10)) * math.sqrt(2 / hidden)).astype(f32),
        b2=np.zeros(10, f32),
        batches=rng.integers(0, 1400, (steps, batch)),
    )


def evaluate(data: DigitsData, w1: np.ndarray, b1: np.ndarray, w2: np.ndarray,
             b2: np.ndarray) -> float:
    """Test accuracy of trained weights, computed in numpy fp32 the same way for every framework."""
    h = np.maximum(data.x_test @ w1 + b1, 0)
    return float(((h @ w2 + b2).argmax(1) == data.y_test).mean())
