"""Which trainer runs the demo for a framework, under which policies, and what it needs
installed; each backend is imported only when asked for."""
from __future__ import annotations

import importlib.util
from typing import Callable, Optional, Sequence

from amp_adapters import AmpConfigError, DynamicLossScale, Policy, UnknownChoiceError

from .data import DigitsData
from .result import OnStep, Steps, TrainResult, run_steps

# paddle: a static program (paddle_amp); paddle-dygraph: eager layers (paddle_amp.dygraph)
FRAMEWORKS = ("mxnet", "paddle", "paddle-dygraph", "numpy")
PACKAGE = {"mxnet": "mxnet", "paddle": "paddle", "paddle-dygraph": "paddle"}  # to require

# O1 fp16, emulated where the device has no fp16 kernel; a short growth interval so the
# dynamic loss scale visibly grows into overflows and backs off within the demo.
DEMO_POLICY = Policy.preset("O1", emulate=True,
                            loss_scale=DynamicLossScale(growth_interval=100))
# bf16 on real kernels, where the backend says the CPU has them: no loss scale needed
BF16_POLICY = Policy.preset("O1-bf16")


def require(modules: Sequence[str], extra: str) -> None:
    """An AmpConfigError naming the missing ``modules`` and the pip extra that brings them."""
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        raise AmpConfigError(f"{', '.join(missing)} not installed: pip install "
                             f"\"amp-adapters[{extra}]\" (from a checkout: pip install "
                             f"\".[{extra}]\")")


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


def batch_workload(framework: str, spec, policy: Policy, batch: int) -> Callable[[], None]:
    """One training step of the ``ModelSpec`` ``spec`` at ``batch`` in ``framework`` under
    ``policy`` (``amp-adapters max-batch``), complete when it returns."""
    if framework == "mxnet":
        from .mxnet_trainer import batch_workload as build
    elif framework == "paddle":
        from .paddle_trainer import batch_workload as build
    elif framework == "paddle-dygraph":
        from .paddle_dygraph_trainer import batch_workload as build
    else:
        raise UnknownChoiceError("framework", framework, FRAMEWORKS[:-1])
    return build(spec, policy, batch)


def completed(framework: str) -> Callable[[], None]:
    """What waits for ``framework``'s asynchronous work (MXNet runs the update after the
    loss is read): a measured step ends when it returns."""
    if framework == "mxnet":
        from .mxnet_trainer import wait_all
        return wait_all
    return lambda: None


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
