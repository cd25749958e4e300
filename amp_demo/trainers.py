"""Which trainer runs the demo for a framework; each backend is imported only when asked for."""
from __future__ import annotations

from typing import Optional

from amp_adapters import Policy, UnknownChoiceError

from .data import DigitsData
from .result import OnStep, Steps, TrainResult, run_steps

# paddle: a static program (paddle_amp); paddle-dygraph: eager layers (paddle_amp.dygraph)
FRAMEWORKS = ("mxnet", "paddle", "paddle-dygraph", "numpy")


def train(framework: str, policy: Policy, data: DigitsData, *, lr: float = 0.1, k: float = 1.0,
          on_step: Optional[OnStep] = None) -> TrainResult:
    """Train the digits MLP in ``framework`` under ``policy`` (O0 is the fp32 baseline).

    The loss may be divided by ``k`` and the learning rate multiplied by ``k``
    (the same training in exact arithmetic, with gradients ``k`` times smaller),
    as in Micikevicius et al. (ICLR 2018): in fp16 without loss scaling those
    gradients flush to zero.
    """
    if framework == "numpy":
        from .numpy_trainer import train_numpy
        return train_numpy(policy, data, lr=lr, k=k, on_step=on_step)
    return run_steps(steps_of(framework, policy, data, lr=lr, k=k), on_step)


def steps_of(framework: str, policy: Policy, data: DigitsData, *, lr: float = 0.1,
             k: float = 1.0) -> Steps:
    """The training steps of ``framework``'s trainer (not numpy's: a reference, no
    framework), to run one by one (``next``) or to the end (``run_steps``)."""
    if framework == "mxnet":
        from .mxnet_trainer import digits_steps
    elif framework == "paddle":
        from .paddle_trainer import digits_steps
    elif framework == "paddle-dygraph":
        from .paddle_dygraph_trainer import digits_steps
    else:
        raise UnknownChoiceError("framework", framework, FRAMEWORKS[:-1])
    return digits_steps(policy, data, lr=lr, k=k)


def real_kernel(framework: str, dtype: str) -> bool:
    """True if ``framework``'s digits MLP runs its GEMMs on a real ``dtype`` kernel here (the
    backend's own answer: a bf16 row lights up by itself where the CPU and backend have one)."""
    if framework == "mxnet":
        from .mxnet_trainer import real_kernel as ask
    elif framework == "paddle":
        from .paddle_trainer import real_kernel as ask
    elif framework == "paddle-dygraph":
        from .paddle_dygraph_trainer import real_kernel as ask
    else:
        return False
    return ask(dtype)
