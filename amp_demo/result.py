"""What one demo training run returns, whichever framework ran it."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Generator, Optional

from amp_adapters import Policy
from amp_adapters.rules.dtypes import short_name
from amp_adapters.services.memory import StepMemory

OnStep = Callable[[int, float, float], None]  # (step, loss, scale): progress callback


@dataclass(frozen=True)
class TrainResult:
    """One training run: what the side-by-side table and the plot show."""

    framework: str
    mode: str                       # "fp32" or a label such as "fp16 O1 (emulated)"
    accuracy: float                 # on the test split
    losses: tuple[float, ...]       # unscaled training loss (times k) per step
    scales: tuple[float, ...]       # loss scale used at each step
    skipped_steps: int
    casts: int                      # casts the AMP rewrite inserted (0 for fp32)
    step_time: float                # median seconds per step
    zero_grad_fraction: float = float("nan")  # gradient values exactly zero (numpy only)
    memory: Optional[StepMemory] = None  # one step's peak, measured in a fresh process

    @property
    def scale_moves(self) -> int:
        return sum(a != b for a, b in zip(self.scales, self.scales[1:]))


# A trainer's steps: yields (loss, scale) after each training step, returns the TrainResult
# when the batches run out. The demo drives it to the end (``run_steps``); a measuring
# process (``amp_demo.memory``) calls ``next`` on it as a Workload's step.
Steps = Generator[tuple[float, float], None, TrainResult]


def run_steps(steps: Steps, on_step: Optional[OnStep] = None) -> TrainResult:
    """Run a trainer's ``steps`` to the end, calling ``on_step(step, loss, scale)`` after
    each; its TrainResult."""
    step = 0
    while True:
        try:
            loss, scale = next(steps)
        except StopIteration as done:
            return done.value
        if on_step:
            on_step(step, loss, scale)
        step += 1


def mode_label(policy: Policy, emulated: bool, fell_back: bool = False) -> str:
    """``fp32``, or the dtype and level, with ``(emulated)`` when an op computed on values
    rounded through the low dtype for lack of a kernel, ``(fp32 fallback)`` when an op ran in
    float32 for lack of one; no suffix: every low op ran on a real low-precision kernel (or
    kept float32 where the backend found its kernel slower, ``OpDecision.kernel_refused``)."""
    if not policy.enabled:
        return "fp32"
    return f"{short_name(policy.dtype)} {policy.level}" + \
        (" (emulated)" if emulated else " (fp32 fallback)" if fell_back else "")


def gemm_summary(decisions, gemm_ops) -> dict:
    """The speed table's row (``speed``): how many GEMMs ran in bf16, and those measured speed
    kept float32 with their ratio."""
    gemms = [d for d in decisions if d.op in gemm_ops]
    kept = [f"{d.op} {d.speed:.2f}x" for d in gemms if d.kernel_refused and d.speed]
    return {"low": sum(d.run_dtype == "bfloat16" for d in gemms), "gemms": len(gemms),
            "kept": kept}
