"""The speed source: what a backend supplies for measured speed, declared once.

A runtime (MXNet, Paddle's static programs in each IR, Paddle's dygraph) supplies one
``SpeedSource`` per (its device, low dtype): what to time and how.

- what: ``source.job(op, shape, training)`` -> a ``Job`` (the op, its shape class,
  training or not, the dtype, and ``how``: the backend's own JSON description of the call
  at that shape: operand shapes, attributes, route, place), or None where nothing can be
  timed (no recipe for the op, shapes that fit no such op, no low kernel here). Pure and
  cheap: it is also the test of what is measurable at all;
- how: ``source.timer`` names the module whose ``time_job(job) -> Optional[Cost]`` times a
  job, and ``source.child`` the runtime's measuring child module (``python -m``), which
  loads that timer and serves the core's ``time_job``: a job is timed there, never in the
  process that plans (the core imports no backend, not even by a computed name: the
  child is the backend's, its loop, protocol and the job's decoding are the core's);
- whose: ``framework`` (the profile entries' framework: ``"mxnet"``, ``"paddle"``,
  ``"paddle-pir"``, ``"paddle-dygraph"``: the runtimes time different routes, so their
  timings are not each other's), ``version``, ``dtype``, and ``gpu`` (the machine's GPU
  key, ``speedbook.gpu_key``; None on a CPU).

Everything else is the core's, the same for every runtime: the book (``book``: one
``speedbook.SpeedBook`` per source and saved profile in a process, on this machine's
cache, keyed as ``speedbook`` keys), the measuring (``measure``: the job sent to the
source's child, ``measure_process``, one process per child module), how a timer times a
job (``cost_of``: the forward ratio, then the training ratio, within ``BUDGET_S`` each)
and turns a GEMM's shape class into its transposes (``gemm_transposes``), the lookup a
``DeviceProfile`` carries (``costs``: only under measured speed, only for what the source
can time; ``profile`` adds it to a backend's kernels) and the native-speed line
(``note``). A source is a frozen value: equal sources share a book and a lookup.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping, Optional, Protocol, Sequence, runtime_checkable

from ..rules.device import Cost, CostLookup, DeviceProfile, ShapeClass
from ..rules.isa import machine
from .measure_process import call
from .speedbook import Measure, SpeedBook
from .timing import ratio_of

# Seconds per ratio for every runtime's timer (after ``ratio_of``'s 2 warm-up pairs, which
# also cover an executor's first run building its plan, and at least its 5 pairs), so the
# runtimes' ratios are equally precise. A training key measures two ratios: ~0.3 s plus
# the child's start per key, a few seconds for a model's dozen shape classes on first use
# (then the cache answers). A GEMM worth timing runs 0.1-10 ms: 0.15 s is 7-41 pairs
# (``max_pairs``), enough for a median and spread that hold between runs.
BUDGET_S = 0.15

Run = Callable[[], object]  # one complete run that waits for its result (a host sync)


@dataclass(frozen=True)
class Job:
    """One timing: ``op`` at ``shape`` (as asked; ``how`` holds the concrete call), for a
    training step (forward and backward) or a forward, in ``dtype`` against float32.
    ``how``: the backend's description of the call (JSON values only: it is sent to the
    measuring child)."""

    op: str
    shape: ShapeClass
    training: bool
    dtype: str
    how: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict:
        return {"op": self.op, "operands": [None if s is None else list(s)
                                            for s in self.shape.operands],
                "result_rank": self.shape.result_rank, "training": self.training,
                "dtype": self.dtype, "how": dict(self.how)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "Job":
        shape = ShapeClass(tuple(None if s is None else tuple(s) for s in data["operands"]),
                           data["result_rank"])
        return cls(data["op"], shape, bool(data["training"]), data["dtype"],
                   dict(data["how"]))


@runtime_checkable
class SpeedSource(Protocol):
    """What a runtime supplies for measured speed (see the module docstring)."""

    framework: str
    version: str
    dtype: str
    timer: str  # the module whose ``time_job(Job) -> Optional[Cost]`` times a job
    child: str  # the measuring child's module (``python -m``), which loads ``timer``
    gpu: Optional[str]

    def job(self, op: str, shape: ShapeClass, training: bool) -> Optional[Job]:
        """What to time for ``op`` at ``shape`` (None: nothing can be timed here)."""


def time_job(timer: str, job: Mapping[str, Any]) -> Optional[Cost]:
    """What a measuring child serves: ``job`` (``Job.to_json``) timed by the ``time_job`` of
    the module ``timer``, which the child loaded (a source's own module: loaded wherever
    the source exists; never imported here by name)."""
    module = sys.modules.get(timer)
    if module is None:
        raise RuntimeError(f"the timer module {timer!r} is not loaded in this measuring "
                           f"process: the source's child module must import it")
    return module.time_job(Job.from_json(job))


def measure(source: SpeedSource) -> Measure:
    """The ``SpeedBook``'s ``measure`` for ``source``: its job, timed in the measuring child
    ``source.child`` (``measure_process.call``: timing here would leave this process's
    memory changed for the model); None where ``source`` has no job (no child is
    started)."""
    def timed(op: str, shape: ShapeClass, training: bool) -> Optional[Cost]:
        job = source.job(op, shape, training)
        if job is None:
            return None
        return call(source.child, time_job, source.timer, job.to_json())
    return timed


def cost_of(low: Callable[[bool], Run], base: Callable[[bool], Run], training: bool,
            budget_s: float = BUDGET_S) -> Cost:
    """How every timer times a job: ``low(backward)`` (the op in the low dtype with its
    casts) against ``base(backward)`` (the op in float32), each a complete run; the forward
    ratio (``ratio_of``), and for ``training`` the forward-and-backward ratio too, each
    within ``budget_s``. Exceptions from a run propagate (``SpeedBook``: no kernel)."""
    forward = ratio_of(low(False), base(False), budget_s=budget_s)
    if not training:
        return Cost(forward=forward[0], forward_spread=forward[1])
    train = ratio_of(low(True), base(True), budget_s=budget_s)
    return Cost(forward=forward[0], forward_spread=forward[1], train=train[0],
                train_spread=train[1])


def gemm_transposes(a: Sequence[int], b: Sequence[int]) -> Optional[tuple[bool, bool]]:
    """(transpose a, transpose b) that make ``a @ b`` agree on its inner dimension (of the
    last two dimensions of each; the first pair that does, no transpose first), or None:
    an operand of rank < 2, or leading (batch) dimensions that do not broadcast. A shape
    class keeps only operand shapes, so a GEMM's transposes are read back from them."""
    if len(a) < 2 or len(b) < 2:
        return None
    for x, y in zip(reversed(a[:-2]), reversed(b[:-2])):
        if x != y and 1 not in (x, y):
            return None
    for ta, tb in ((False, False), (False, True), (True, False), (True, True)):
        if (a[-2] if ta else a[-1]) == (b[-1] if tb else b[-2]):
            return ta, tb
    return None


_books: dict[tuple, SpeedBook] = {}
_lookups: dict[tuple, CostLookup] = {}


def book(source: SpeedSource, profile: Optional[str] = None) -> SpeedBook:
    """The one ``SpeedBook`` of this process for ``source`` and the saved ``profile`` (a
    malformed profile file raises ``AmpConfigError`` here, before anything is planned):
    framework, version and dtype from ``source``, keyed by this machine with ``source``'s
    GPU, measuring through ``measure(source)``."""
    key = (source, profile)
    if key not in _books:
        _books[key] = SpeedBook(source.framework, source.version, source.dtype,
                                measure(source), profile=profile,
                                here=machine(gpu=source.gpu))
    return _books[key]


def install(source: SpeedSource, made: SpeedBook, profile: Optional[str] = None) -> None:
    """Use ``made`` for ``source`` (and ``profile``) from now on: a profile given as data (a
    book whose ``measure`` is another timer, or a fixed answer in a test)."""
    _books[(source, profile)] = made
    for k in [k for k in _lookups if k[:2] == (source, profile)]:
        del _lookups[k]


def forget() -> None:
    """Drop this process's books: the next plan reads the profile and the cache again
    (``AMP_ADAPTERS_CACHE`` as it is then); nothing measured is lost, it is on disk."""
    _books.clear()
    _lookups.clear()


def measures(policy: Any) -> bool:
    """Whether ``policy`` plans by measured speed (``Policy.speed == "measured"``)."""
    return bool(policy.enabled) and policy.speed == "measured"


def lookup(source: SpeedSource, made: SpeedBook, training: bool) -> CostLookup:
    """``DeviceProfile.costs`` from ``made`` for ``source``: only what ``source`` can time is
    looked up (a book keeps no "cannot be measured": it would ask again at every lookup,
    and a saved profile would warn of a missing entry)."""
    inner = made.for_training(training)

    def cost(op: str, shape: ShapeClass) -> Optional[Cost]:
        return inner(op, shape) if source.job(op, shape, training) is not None else None
    return cost


def costs(source: SpeedSource, policy: Any, training: bool) -> Optional[CostLookup]:
    """The measured-speed lookup a ``DeviceProfile`` carries for ``policy`` (its saved
    profile, this machine's cache, or timed now by ``source``), or None where ``policy``
    does not measure (nothing is timed). One lookup per (source, profile, training) in a
    process, so profiles built again compare equal."""
    if not measures(policy):
        return None
    key = (source, policy.profile, training)
    if key not in _lookups:
        _lookups[key] = lookup(source, book(source, policy.profile), training)
    return _lookups[key]


def profile(device: DeviceProfile, policy: Any,
            source: Callable[[], SpeedSource]) -> DeviceProfile:
    """``device`` (a backend's kernels, routes and rules, for training or inference as its
    ``training`` says) with the measured-speed lookup where ``policy`` measures
    (``costs`` of the source ``source()`` makes: only then, since a source may ask the
    framework for its device), else as it is: how every runtime's plan gets its costs."""
    if not measures(policy):
        return device
    return replace(device, costs=costs(source(), policy, device.training))


def note(who: str, policy: Any, source: SpeedSource, training: bool) -> bool:
    """``native_speed.note`` for ``source``'s entries: say once per process when the native's
    decisions run an op slower than float32 here."""
    from .native_speed import note as said
    return said(who, policy, source.framework, source.version, training)
