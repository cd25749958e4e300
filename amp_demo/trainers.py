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


def real_kernel(framework: str, dtype: str) -> bool:
    """True if ``framework``'s digits MLP runs its GEMMs on a real ``dtype`` kernel here (the
    backend's own answer: a bf16 row lights up by itself where the CPU and backend have one)."""
    if framework == "mxnet":
        from .mxnet_trainer import real_kernel as ask
    elif framework == "paddle":
        from .paddle_trainer import real_kernel as ask
    else:
        return False
    return ask(dtype)
