"""The peak memory of one training step, measured in a fresh process per run.

AMP promises less memory as well as speed (DESIGN.md, "Memory"); this is how the project
measures it, the same way for every framework and policy:

- one fresh child process per run, so nothing of an earlier configuration (a pool, a cache,
  an arena) is counted: ``python -m server factory args``, where ``server`` is a module
  whose ``__main__`` hands its workload factories to ``main`` (as a measuring child hands
  its functions to ``measure_process.serve``);
- in it, a workload (``Workload``: a step and, where the framework has one, its own count of
  tensor bytes) built by the factory named, run
  ``warmup`` times; then the resident size before the step (``VmRSS``), the high-water mark
  reset (``5`` written to ``/proc/self/clear_refs``, Linux 4.0+), one step, and the
  high-water mark read (``VmHWM``). Where ``clear_refs`` cannot be written the peak is the
  child's ``ru_maxrss``: the highest since the child started, its imports and warm-up
  included (warm-up runs the same step, so it is an upper bound of the step's peak), and
  the result says so (``peak_source``);
- then, bracketing that figure, one more step between the framework's tensor counter's
  ``start`` and ``peak`` (a separate step, so a profiler's own records are not in the
  process's peak);
- the child's environment fixed (``fixed_env``): one thread per pool (``THREADS``, the
  variables of ``isa.THREAD_ENV``) and glibc's allocator with a fixed mmap threshold
  and one arena (``ALLOCATOR``): with a threshold that moves with the program's own
  frees, repeated runs of one configuration differed by up to 13%;
- a temporary directory of its own (``TMPDIR``), removed after it (MXNet's profiler writes
  its trace there when the process exits);
- ``runs`` (3) such processes, and each figure the median over them (``median``).

Figures are bytes. The transient of a step is its peak minus the resident size just before
it: what the step allocates and frees again (activations, casts, gradients, workspaces).
The framework-specific parts (what a step is, how a framework counts its tensors) live in
the backends and the bench; this module imports neither framework.
"""
from __future__ import annotations

import gc
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Mapping, Optional, Protocol, Sequence

from .measure_process import child_env
from ..rules.isa import THREAD_ENV

CLEAR_REFS = "/proc/self/clear_refs"
STATUS = "/proc/self/status"
# glibc: blocks of 128 KiB and more are mapped and unmapped on their own (the threshold
# glibc starts with, but fixed: by default it grows with the largest block freed); one arena
ALLOCATOR = {"MALLOC_MMAP_THRESHOLD_": "131072", "MALLOC_ARENA_MAX": "1",
             "MALLOC_TRIM_THRESHOLD_": "131072"}
THREADS = 1  # every pool of THREAD_ENV (but the engine type) and OpenBLAS's
RUNS = 3
RUN_TIMEOUT_S = 1800.0
_PEAK_SOURCES = ("VmHWM", "ru_maxrss")


class MemoryMeasureFailed(RuntimeError):
    """A measuring process failed (its factory or step raised, it died, or it did not answer):
    no figure, and why."""


class TensorBytes(Protocol):
    """A framework's own count of its tensor bytes (Paddle's host allocator statistics,
    MXNet's storage profiler): what a backend supplies to bracket the process's figure."""

    name: str  # what is counted, for the report ("Paddle host allocator, Allocated")

    def start(self) -> None:
        """Start counting (reset the peak) before a step."""

    def peak(self) -> Optional[int]:
        """The most bytes in tensors at once since ``start``; None if it cannot say."""


@dataclass(frozen=True)
class Workload:
    """What a measuring process runs: ``step()`` is one training step, complete when it
    returns (a framework's asynchronous work waited for); ``tensors`` the framework's count,
    if it has one; ``warmup`` steps first (kernels chosen, pools and caches filled);
    ``facts``: figures the workload knows of itself, in bytes, carried into the result
    beside the measured ones (the parameter bytes O2 plans, from its parameter plan)."""

    step: Callable[[], Any]
    tensors: Optional[TensorBytes] = None
    warmup: int = 3
    facts: Mapping[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not callable(self.step):
            raise TypeError(f"Workload.step must be callable, got {type(self.step).__name__}")
        if self.warmup < 1:
            raise ValueError(f"Workload.warmup must be at least 1 (the measured step must "
                             f"not be the first), got {self.warmup}")


@dataclass(frozen=True)
class StepMemory:
    """One step's memory, in bytes: ``peak`` (the process's highest resident size during the
    step, from ``peak_source``: ``VmHWM`` after a reset, or ``ru_maxrss`` since the process
    started), ``before`` (resident just before it), ``transient`` (``peak - before``: what
    the step itself allocated at most) and the framework's ``tensor_peak`` (None: no
    counter, or it could not say) with ``tensor_source``; ``runs``: processes it is the
    median of; ``facts``: the workload's own figures (``Workload.facts``), not measured."""

    peak: int
    before: int
    transient: int
    peak_source: str
    tensor_peak: Optional[int] = None
    tensor_source: str = ""
    runs: int = 1
    facts: Mapping[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.peak_source not in _PEAK_SOURCES:
            raise ValueError(f"peak_source must be one of {_PEAK_SOURCES}, got "
                             f"{self.peak_source!r}")

    def to_dict(self) -> dict:
        return asdict(self)


def fixed_env(extra: Optional[Mapping[str, str]] = None, threads: int = THREADS) -> dict:
    """The environment of a measuring process: this one, with this process's ``sys.path``
    and the simulated CPU class's oneDNN limits (``measure_process.child_env``), ``extra``
    over it (``DNNL_MAX_CPU_ISA``...), then every thread pool set to ``threads`` and the
    allocator to ``ALLOCATOR``."""
    if threads < 1:
        raise ValueError(f"threads must be at least 1, got {threads}")
    counts = {k: str(threads) for k in THREAD_ENV if k != "MXNET_ENGINE_TYPE"}
    return {**child_env(), **(extra or {}), **counts, "OPENBLAS_NUM_THREADS": str(threads),
            **ALLOCATOR}


def stated(env: Mapping[str, str]) -> str:
    """The settings ``fixed_env`` fixes, as one line a result can print."""
    keys = [k for k in (*THREAD_ENV, "OPENBLAS_NUM_THREADS", *ALLOCATOR) if k in env]
    return ", ".join(f"{k}={env[k]}" for k in keys)


def _status_kib(field: str, status: str = STATUS) -> int:
    with open(status) as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise MemoryMeasureFailed(f"{status} has no {field} line (not Linux?)")


def reset_peak(clear_refs: str = CLEAR_REFS) -> bool:
    """Reset this process's high-water mark (``VmHWM``) to its resident size; False if the
    kernel does not let it be (no such file, or not writable)."""
    try:
        with open(clear_refs, "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def measure_here(workload: Workload, clear_refs: str = CLEAR_REFS) -> StepMemory:
    """Measure one step of ``workload`` in this process (what a measuring process runs; a
    test may run it here): warm-up, resident size, reset, one step, peak; then one step
    between the tensor counter's ``start`` and ``peak``."""
    for _ in range(workload.warmup):
        workload.step()
    gc.collect()
    before = _status_kib("VmRSS") * 1024
    reset = reset_peak(clear_refs)
    workload.step()
    if reset:
        peak, source = _status_kib("VmHWM") * 1024, "VmHWM"
    else:  # Linux: kilobytes
        peak, source = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "ru_maxrss"
    tensor_peak, tensor_source = None, ""
    if workload.tensors is not None:
        tensor_source = workload.tensors.name
        workload.tensors.start()
        workload.step()
        tensor_peak = workload.tensors.peak()
    return StepMemory(peak=peak, before=before, transient=max(peak - before, 0),
                      peak_source=source, tensor_peak=tensor_peak,
                      tensor_source=tensor_source, facts=dict(workload.facts))


def median(results: Sequence[StepMemory]) -> StepMemory:
    """Each figure the median of ``results`` (one per process; at least one), taken figure by
    figure (the transient too: the median of the runs' transients); a source that differs
    between runs is named as the weaker one (``ru_maxrss``)."""
    if not results:
        raise ValueError("median of no measurement: give at least one StepMemory")

    def mid(values: list[int]) -> int:
        return int(statistics.median_low(values))

    tensors = [r.tensor_peak for r in results if r.tensor_peak is not None]
    sources = {r.peak_source for r in results}
    return StepMemory(
        peak=mid([r.peak for r in results]), before=mid([r.before for r in results]),
        transient=mid([r.transient for r in results]),
        peak_source="VmHWM" if sources == {"VmHWM"} else "ru_maxrss",
        tensor_peak=mid(tensors) if len(tensors) == len(results) else None,
        tensor_source=results[0].tensor_source, runs=sum(r.runs for r in results),
        facts=dict(results[0].facts))


def measure_once(server: str, factory: Callable[..., Workload], *args: Any,
                 env: Optional[Mapping[str, str]] = None,
                 python: Optional[str] = None) -> StepMemory:
    """One fresh process (``python -m server``, in ``fixed_env(env)``: ``env`` is added to
    this environment) that builds
    ``factory(*args)`` (a ``Workload``; arguments are JSON values; ``server`` hands
    ``factory`` to ``main``) and measures a step of it; ``MemoryMeasureFailed`` if it does
    not answer. ``python``: the interpreter (default this one's)."""
    name = getattr(factory, "__name__", str(factory))
    try:
        # a temporary directory of its own (TMPDIR), removed after it: what a framework
        # leaves there at exit (MXNet's profiler writes its trace) goes with it
        with tempfile.TemporaryDirectory(prefix="amp-adapters-memory-") as scratch:
            r = subprocess.run([python or sys.executable, "-m", server, name,
                                json.dumps(list(args))],
                               env=fixed_env({**(env or {}), "TMPDIR": scratch}),
                               capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise MemoryMeasureFailed(f"{name}{tuple(args)}: no answer in {RUN_TIMEOUT_S:g} s") \
            from None
    lines = r.stdout.strip().splitlines()
    if r.returncode != 0 or not lines or not lines[-1].startswith("{"):
        said = [ln for ln in r.stderr.strip().splitlines() if ln.strip()] or ["no output"]
        how = f"exit code {r.returncode}" if r.returncode >= 0 else f"signal {-r.returncode}"
        raise MemoryMeasureFailed(f"{name}{tuple(args)}: the measuring process ended "
                                  f"({how}): {said[-1].strip()[:200]}")
    return StepMemory(**json.loads(lines[-1]))


def measure(server: str, factory: Callable[..., Workload], *args: Any, runs: int = RUNS,
            env: Optional[Mapping[str, str]] = None,
            python: Optional[str] = None) -> StepMemory:
    """The median of ``runs`` fresh processes' ``measure_once(server, factory, *args)``."""
    if runs < 1:
        raise ValueError(f"runs must be at least 1, got {runs}")
    return median([measure_once(server, factory, *args, env=env, python=python)
                   for _ in range(runs)])


def ratio(value: Optional[int], base: Optional[int]) -> str:
    """``value / base`` as ``1.02x``, or ``-`` when either is missing or the base is 0."""
    if value is None or not base:
        return "-"
    return f"{value / base:.2f}x"


def main(*factories: Callable[..., Workload]) -> None:
    """A measuring process's ``__main__``: build the workload named by ``sys.argv[1]`` (one
    of ``factories``, by name) with the JSON arguments of ``sys.argv[2]``, measure one step
    (``measure_here``) and print the result as one JSON line on the original stdout, which
    nothing else writes to (what a framework prints goes to stderr)."""
    served = {f.__name__: f for f in factories}
    name, args = sys.argv[1], json.loads(sys.argv[2]) if len(sys.argv) > 2 else []
    if name not in served:
        raise SystemExit(f"no workload factory {name!r} here (served: {sorted(served)})")
    answers = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    workload = served[name](*args)
    if not isinstance(workload, Workload):
        raise TypeError(f"{name} returned {type(workload).__name__}, not a Workload")
    answers.write(json.dumps(measure_here(workload).to_dict()) + "\n")
    answers.flush()
