"""The doctor's demo models: a planted numerics problem, the same in MXNet and Paddle (weights
and data are numpy, so both frameworks see the same values). The Gluon blocks are
``mxnet_trainer.doctor_model``, the static programs ``paddle_trainer.doctor_program`` (the
trainers are the only demo modules that import a framework); ``amp-adapters doctor`` runs
them, the tests use them too.

- ``overflow``: ``relu(x @ w1) @ w2`` with ``|x @ w1|`` ~ 1e5 > float16's 65504: the first
  matmul's output overflows in fp16.
- ``underflow``: the same net at normal scale, its loss multiplied by 1e-11: the gradients
  flush to zero in fp16 at the default loss scale 2**16.
- ``reduction``: ``x @ w`` with ``w`` a column of ones, a sum over values that cancel
  (1000.1 - 1000.0 ...): the fp16 rounding of its inputs wipes the result out.

The layered models (``LAYERED``) are four linear layers of one type, the third followed
by a layer normalisation (``layered_arrays``: weights, biases, data):

- ``layer_overflow``: the third layer's output reaches ~1e5 > float16's 65504 in the
  forward pass; the normalisation brings it back, so only that layer needs float32.
- ``layer_backward``: every forward value is small, but the loss is large (x 20): at the
  default loss scale 2**16 the backward pass overflows in float16; a lower scale fixes it.
- ``layer_precision``: no overflow; the third layer's weights come in pairs ``1000 + d``,
  ``-1000`` over equal inputs (the second layer's outputs are all one value), so its output
  is ``8 d h``: float16 rounds ``1000 + d`` to 1000 and the output to 0 (precision, not
  range: only that layer needs float32).
"""
import numpy as np

from amp_adapters import Policy

B, D, H = 4, 16, 8
KINDS = ("overflow", "underflow", "reduction")
FACTOR = {"overflow": 1.0, "underflow": 1e-11, "reduction": 1e-4}
PLANTED_CANONICAL = {"overflow": "matmul", "reduction": "matmul"}
LAYERED = ("layer_overflow", "layer_backward", "layer_precision")
LAYERED_FACTOR = {"layer_overflow": 0.01, "layer_backward": 20.0, "layer_precision": 1e-4}
NORM_AFTER = 2  # the normalisation follows the third layer (index 2)


def policy(kind):
    """The policy the planted model runs under (fp16 emulated on a CPU)."""
    return Policy.preset("O1", emulate=True)


def arrays(kind, step=0):
    """(inputs, label, {param: value}) for ``kind``, one batch per ``step``."""
    rng = np.random.RandomState(step)
    if kind == "reduction":
        x = np.tile(np.array([1000.1, -1000.0], np.float32), (B, D // 2))
        x = (x + rng.uniform(-0.01, 0.01, x.shape)).astype(np.float32)
        w = np.ones((D, 1), np.float32)
        label = (x.astype(np.float64).sum(axis=1, keepdims=True)).astype(np.float32)
        return x, label, {"w": w}
    p = np.random.RandomState(42)
    x = rng.uniform(1.0, 2.0, (B, D)).astype(np.float32)
    if kind == "overflow":
        w1 = p.uniform(4000.0, 5000.0, (D, H)).astype(np.float32)
        w2 = p.uniform(-1e-5, 1e-5, (H, 1)).astype(np.float32)
    else:
        w1 = p.uniform(-0.5, 0.5, (D, H)).astype(np.float32)
        w2 = p.uniform(-0.5, 0.5, (H, 1)).astype(np.float32)
    return x, np.zeros((B, 1), np.float32), {"w1": w1, "w2": w2}


def layered_arrays(kind, step=0):
    """(inputs, label, [(weight (in, out), bias)] * 4) for a ``LAYERED`` model, one batch per
    ``step``: four linear layers D -> D, the last D -> 1."""
    rng = np.random.RandomState(step)
    p = np.random.RandomState(7)
    x = rng.uniform(1.0, 2.0, (B, D)).astype(np.float32)
    layers = []
    for i in range(4):
        out = 1 if i == 3 else D
        if kind == "layer_precision" and i == 1:  # every output feature the same value
            w = np.repeat(p.uniform(0.1, 0.2, (D, 1)), out, axis=1)
        elif kind == "layer_precision" and i == 2:  # rows in pairs: 1000 + d, -1000
            w = np.tile([[1000.0], [-1000.0]], (D // 2, out))
            w[0::2] += p.uniform(0.05, 0.15, (1, out))
        elif kind == "layer_overflow" and i == 2:
            w = p.uniform(800.0, 1200.0, (D, out))
        elif kind in ("layer_overflow", "layer_precision") and i < 2:
            w = p.uniform(0.1, 0.2, (D, out))
        else:
            w = p.uniform(-0.3, 0.3, (D, out))
        b = p.uniform(-0.1, 0.1, (out,))
        if kind == "layer_precision" and i == 1:
            b[:] = 0.0  # its outputs stay one value per row, in every precision
        layers.append((w.astype(np.float32), b.astype(np.float32)))
    return x, np.zeros((B, 1), np.float32), layers
