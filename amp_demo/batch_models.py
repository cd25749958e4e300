"""The models ``amp-adapters max-batch`` measures, by name, the same in every framework.

Each is a classifier of 10 classes trained by momentum SGD (its state is as large as the
parameters, as a real run's is) on random data; a model is described here once, and each
framework's trainer module builds it (``batch_workload``). Nothing here imports a framework.
"""
from __future__ import annotations

from dataclasses import dataclass

from amp_adapters import UnknownChoiceError

CLASSES = 10
LR, MOMENTUM = 1e-3, 0.9


@dataclass(frozen=True)
class ModelSpec:
    """``kind`` ``mlp``: Linear layers of ``widths`` with ReLU on a vector of ``sample[0]``;
    ``cnn``: 3x3 convolutions (padding 1) of ``widths`` channels with ReLU on a
    ``sample`` (channels, height, width), then the mean over the image; a Linear to
    ``CLASSES`` last. ``batches``: where to measure by default (where a sample's bytes show
    above the process's noise)."""

    kind: str
    sample: tuple[int, ...]
    widths: tuple[int, ...]
    what: str
    batches: tuple[int, ...]


MODELS = {
    "digits": ModelSpec("mlp", (64,), (64,), "the demo's MLP 64-64-10", (2048, 8192, 32768)),
    "mlp": ModelSpec("mlp", (512,), (512,) * 4, "the bench's MLP: 4 layers of 512",
                     (512, 2048, 8192)),
    "cnn": ModelSpec("cnn", (64, 56, 56), (64, 64),
                     "the bench's CNN: two 3x3 convolutions, 64 channels, 56x56", (4, 8, 16)),
}


def model_named(name: str) -> ModelSpec:
    """The ``ModelSpec`` called ``name``; an error naming the models there are."""
    if name not in MODELS:
        raise UnknownChoiceError("model", name, MODELS)
    return MODELS[name]
