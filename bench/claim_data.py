"""Data and run settings shared by the four-family claim trainers (framework-free).

scikit-learn's bundled digits (8x8 images, 10 classes): flat 64-vectors for
the MLP, 1x8x8 images for the CNN, and the 8 rows of each image as an 8-step
sequence of 8 features for the LSTM and the Transformer encoder. The split
and the batch order come from one seed, so every mode of a family sees the
same batches; each framework initialises its own weights from a fixed seed.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

FAMILIES = ("mlp", "cnn", "lstm", "transformer")
SHAPES = {"mlp": (64,), "cnn": (1, 8, 8), "lstm": (8, 8), "transformer": (8, 16)}
LR = 0.05       # SGD with momentum 0.9; lr x K with the loss / K is the same training
MOMENTUM = 0.9


@dataclass(frozen=True)
class ClaimData:
    x_train: np.ndarray  # (1400, 64) in [0, 1]
    y_train: np.ndarray
    x_test: np.ndarray   # (397, 64)
    y_test: np.ndarray
    batches: np.ndarray  # (steps, batch) indices into the training set

    def shaped(self, family: str, x: np.ndarray) -> np.ndarray:
        """``x`` in the input shape ``family`` takes; the Transformer's tokens carry their
        position as a one-hot in 8 more features (no positional parameter)."""
        if family == "transformer":
            rows = x.reshape(len(x), 8, 8)
            pos = np.broadcast_to(np.eye(8, dtype=x.dtype), (len(x), 8, 8))
            return np.concatenate([rows, pos], axis=2)
        return x.reshape((len(x),) + SHAPES[family])


def reordered(data: ClaimData, seed: int) -> ClaimData:
    """The same split with another batch order (the run-to-run noise of one training)."""
    rng = np.random.default_rng(seed)
    return ClaimData(data.x_train, data.y_train, data.x_test, data.y_test,
                     rng.integers(0, len(data.x_train), data.batches.shape))


def claim_data(steps: int, batch: int = 64, seed: int = 0) -> ClaimData:
    from sklearn.datasets import load_digits

    raw = load_digits()
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(raw.target))
    x = (raw.data[order] / 16.0).astype(np.float32)
    y = raw.target[order].astype(np.int64)
    return ClaimData(x[:1400], y[:1400], x[1400:], y[1400:],
                     rng.integers(0, 1400, (steps, batch)))


@dataclass(frozen=True)
class Outcome:
    """One training run: test accuracy and loss, and what the loss scale did."""

    accuracy: float
    test_loss: float
    skipped_steps: int
    final_scale: float


def test_metrics(logits: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """(accuracy, mean cross-entropy) of float32 ``logits``; NaN logits count as wrong."""
    logits = logits.astype(np.float64)
    z = logits - logits.max(1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(1, keepdims=True))
    loss = float(-logp[np.arange(len(y)), y].mean())
    acc = float((logits.argmax(1) == y).mean()) if np.all(np.isfinite(logits)) else 0.0
    return acc, loss
