"""The demo's memory column: the peak of one of its training steps, per row, each in a fresh
process (``amp_adapters.services.memory``: warm-up, the high-water mark reset, one step, ``VmHWM``).

A row's process builds the same trainer the demo ran for that row (``digits_steps``: the
digits MLP, batch 64, under the row's policy; data of the digits' shapes) and measures one
step of it. The processes run two at a time after the training (``rows_memory``). The figure is the
whole process's peak resident size during that step (the framework, its pools, the model and
the step), so on this small MLP it says what AMP costs or saves in a process, not in
activations: the bench's memory section (``make bench``) measures models where activations
matter. Nothing here imports a framework; the measuring process does
(``python -m amp_demo.memory``).
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Optional, Sequence

from amp_adapters import Policy
from amp_adapters.services.memory import MemoryMeasureFailed, StepMemory, Workload, main, measure

SERVER = "amp_demo.memory"
RUNS = 1  # one fresh process per row (each is a few seconds: the framework's import)
PARALLEL = 2
WARMUP = 2


def policy_named(spec: str) -> Policy:
    """A row's policy from its name in a measuring process: ``fp32``, ``demo`` (the demo's
    default), ``bf16`` (the bf16 row's), else a preset or policy file as ``--policy``
    takes it."""
    from amp_adapters import resolve_policy

    from .trainers import BF16_POLICY, DEMO_POLICY
    named = {"fp32": Policy.preset("O0"), "demo": DEMO_POLICY, "bf16": BF16_POLICY}
    return named[spec] if spec in named else resolve_policy(spec)


def digits_step(framework: str, spec: str) -> Workload:
    """One training step of the demo's ``framework`` trainer under the policy ``spec``
    (``policy_named``), in this process."""
    from .data import shaped_data
    from .trainers import completed, steps_of
    steps = steps_of(framework, policy_named(spec), shaped_data(WARMUP + 2))
    done = completed(framework)

    def step() -> None:
        next(steps)
        done()
    return Workload(step, warmup=WARMUP)


def batch_step(framework: str, model: str, spec: str, batch: int) -> Workload:
    """One training step of ``model`` (``batch_models.MODELS``) at ``batch`` in
    ``framework`` under the policy ``spec``, in this process (``amp-adapters max-batch``)."""
    from .batch_models import model_named
    from .trainers import batch_workload
    return Workload(batch_workload(framework, model_named(model), policy_named(spec), batch),
                    warmup=WARMUP)


def rows_memory(rows: Sequence[tuple[str, str]]) -> dict[tuple[str, str], Optional[StepMemory]]:
    """{(framework, spec): ``row_memory``} of ``rows``, ``PARALLEL`` measuring processes at a
    time. Run after the training, never beside it: a process beside the training slowed its
    oneDNN steps (Paddle dygraph's bf16 row read 16.75x float32's step time, 1.59x alone),
    while a measuring process's own figure is its peak, which the other does not change."""
    with ThreadPoolExecutor(PARALLEL) as pool:
        return dict(zip(rows, pool.map(lambda row: row_memory(*row), rows)))


def row_memory(framework: str, spec: str, runs: int = RUNS) -> Optional[StepMemory]:
    """The peak of one step of ``framework``'s row under ``spec``, measured in ``runs`` fresh
    processes (median); None if the measuring process failed (the row says ``-``)."""
    try:
        return measure(SERVER, digits_step, framework, spec, runs=runs)
    except MemoryMeasureFailed:
        return None


# the line under the table saying what the memory column is
NOTE = (f"peak memory: the process's peak resident size during one training step (VmHWM, "
        f"after {WARMUP} warm-up steps, in a fresh process per row: the framework "
        f"included), over that framework's fp32 row; * emulated fp16 stores float32 (its "
        f"figure is not fp16's memory). The bench's memory section measures models "
        f"where activations matter (make bench, docs/memory.md)")


if __name__ == "__main__":
    main(digits_step, batch_step)
