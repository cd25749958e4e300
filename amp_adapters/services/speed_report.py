"""``amp-adapters info --measure`` and ``amp-adapters profile``: measured speed, per op.

Each runtime (MXNet, Paddle's programs, Paddle's dygraph) answers through the entry-point
group ``SPEED_GROUP`` with a ``SpeedProbe`` for a low dtype (``probe_of`` builds it from
the runtime's speed source): its speed book (``speedbook.SpeedBook``: this machine's cache,
measuring
what it lacks), its device profiles for training and inference, and a few samples (the
ops its O1 lists lower, at a small and a large GEMM and a convolution). For each sample
the report gives the kernel and its route, the low/float32 ratio forward and for a
training step (casts included), and what ``policy="auto"`` decides for training. The
profile command writes everything the books know to a file a policy can name
(``profile = "path"``). The core imports no backend: a machine with one framework works.
"""
from __future__ import annotations

from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path
from typing import Callable, Mapping, Optional, Sequence

from ..rules.device import Cost, DeviceProfile, ShapeClass
from ..rules.isa import machine
from ..rules.planner import OpCall, plan_op
from ..rules.policy import Policy
from .speed_source import SpeedSource, book
from .speedbook import ProfileFile, SpeedBook, write_profile

SPEED_GROUP = "amp_adapters.speed"


@dataclass(frozen=True)
class Sample:
    """One op at one shape class, and what it stands for (``"GEMM 64x2048x2048"``)."""

    op: str
    shape: ShapeClass
    what: str


@dataclass(frozen=True)
class SpeedProbe:
    """A backend's answer for one low dtype: ``lists`` names its op lists (``"mxnet"``,
    ``"paddle"``), ``framework`` its profile entries (``"paddle-pir"`` for Paddle's PIR)."""

    framework: str
    lists: str
    book: SpeedBook
    training: DeviceProfile
    inference: DeviceProfile
    samples: tuple[Sample, ...]


Provider = Callable[[str], SpeedProbe]  # dtype -> probe

GEMMS = ((64, 256, 256), (64, 2048, 2048))  # (m, k, n): a small and a large GEMM sampled


def gemm_samples(op: str, bias: bool = False) -> tuple[Sample, ...]:
    """``op`` at the sampled GEMMs (x: m x k, weight: k x n, or n x k as MXNet's
    FullyConnected keeps it when ``bias``: the weight and a bias of n)."""
    return tuple(Sample(op, ShapeClass.of([(m, k), (n, k) if bias else (k, n)]
                                          + ([(n,)] if bias else [])), f"GEMM {m}x{k}x{n}")
                 for m, k, n in GEMMS)


def probe_of(source: SpeedSource, lists: str, training: DeviceProfile, inference: DeviceProfile,
             samples: Sequence[Sample]) -> SpeedProbe:
    """The ``SpeedProbe`` of a runtime's speed source (``speed_source.SpeedSource``): the
    book ``policy="auto"`` reads for it (no saved profile), under its framework; its device
    profiles for training and inference; ``lists``: the op lists it plans with."""
    return SpeedProbe(source.framework, lists, book(source), training, inference,
                      tuple(samples))


@dataclass(frozen=True)
class SpeedRow:
    framework: str
    sample: Sample
    route: str
    forward: Optional[Cost]
    train: Optional[Cost]
    decision: str


def rows(probe: SpeedProbe, dtype: str) -> list[SpeedRow]:
    """Measure (or read) each sample of ``probe``, and what ``auto`` decides for training."""
    auto = Policy.preset("auto", dtype=dtype)
    out = []
    for s in probe.samples:
        route = probe.training.route(s.op)
        fwd = probe.book.lookup(s.op, s.shape, False) if route != "none" else None
        train = probe.book.lookup(s.op, s.shape, True) if route != "none" else None
        inputs = ("float32",) * max(1, len(s.shape.operands))
        d = plan_op(auto, probe.lists, OpCall(s.op, inputs, shape=s.shape), device=probe.training)
        decision = dtype if d.run_dtype == dtype else (
            _why(d.reason) if d.fell_back else "float32 (the lists)")
        out.append(SpeedRow(probe.framework, s, route, fwd, train, decision))
    return out


def _why(reason: str) -> str:
    """The last clause of a decision's reason: from its ``float32:`` verdict on (which may
    hold a ``;`` itself), else after the last ``;``."""
    at = reason.rfind("float32: ")
    return reason[at:] if at >= 0 else reason.rsplit("; ", 1)[-1]


def _ratio(cost: Optional[Cost], training: bool) -> str:
    if cost is None:
        return "-"
    if cost.error:
        return "failed"
    r, spread = cost.ratio(training)
    return f"{r:.2f}x+-{spread:.2f}"


def render(found: Sequence[SpeedRow], dtype: str) -> str:
    """The table: per framework and sample, route, forward and training ratios, decision."""
    table = [("framework", "op", "shape", "route", f"{dtype}/fp32 fwd", "train step",
              "auto decides (training)")]
    for r in found:
        table.append((r.framework, r.sample.op, r.sample.what, r.route,
                      _ratio(r.forward, False), _ratio(r.train, True), r.decision))
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in table]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def installed() -> dict[str, Provider]:
    """{framework: provider} of the installed backends whose framework imports."""
    out: dict[str, Provider] = {}
    for ep in entry_points(group=SPEED_GROUP):
        try:
            out[ep.name] = ep.load()
        except ImportError:
            continue
    return out


def measure(providers: Mapping[str, Provider], dtype: str,
            save: "Optional[str | Path]" = None) -> str:
    """The report for every provider (a provider that fails says why in one line); with
    ``save``, every measurement the books know is written there as a profile file. A book
    that refreshes (``amp-adapters profile --refresh``) also measures again the other keys
    of its framework and dtype in this machine's cache (``SpeedBook.remeasure``: a model's
    shapes); every other entry is kept."""
    out, entries = [], {}
    for name, provider in sorted(providers.items()):
        try:
            probe = provider(dtype)
            found = rows(probe, dtype)
            again = probe.book.remeasure()
        except Exception as e:  # a backend's own failure is its line, not ours
            out.append(f"{name}: cannot measure ({type(e).__name__}: {e})")
            continue
        out.append(render(found, dtype))
        if again:
            out.append(f"{probe.framework}: measured again {again} more {dtype} entries of "
                       f"this machine's cache (the shapes of models run here)")
        entries.update(probe.book.entries())
    if save is not None:
        write_profile(save, ProfileFile(machine(), entries))
        out.append(f"profile written to {save} ({len(entries)} measurements): name it in a "
                   f"policy as profile = \"{save}\" (with preset = \"auto\")")
    return "\n\n".join(out)
