"""Which trainer runs the demo for a framework; each backend is imported only when asked for."""
from __future__ import annotations

from typing import Optional

from amp_adapters import Policy, UnknownChoiceError

from .data import DigitsData
from .result import OnStep, TrainResult

FRAMEWORKS = ("mxnet", "paddle", "numpy")


def train(framework: str, policy: Policy, data: DigitsData, *, lr: float = 0.1, k: float = 1.0,
          on_step: Optional[OnStep] = None) -> TrainResult:
    """Train the digits MLP in ``framework`` under ``policy`` (O0 is the fp32 baseline).

    The loss may be divided by ``k`` and the learning rate multiplied by ``k``
    (the same training in exact arithmetic, with gradients ``k`` times smaller),
    as in Micikevicius et al. (ICLR 2018): in fp16 without loss scaling those
    gradients flush to zero.
    """
    if framework == "numpy":
        from .numpy_trainer import train_numpy as run
    elif framework == "mxnet":
        from .mxnet_trainer import train_digits as run
    elif framework == "paddle":
        from .paddle_trainer import train_digits as run
    else:
        raise UnknownChoiceError("framework", framework, FRAMEWORKS)
    return run(policy, data, lr=lr, k=k, on_step=on_step)
