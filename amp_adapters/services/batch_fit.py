"""The largest batch that fits in a memory budget, from a few measured peaks.

MXNet's fp16 FAQ frames what mixed precision gives memory as a batch size: ResNet-50 goes
from batch 128 to 256 on the same card. This is how the project answers it for a CPU: the
peak of one training step grows with the batch as ``peak = fixed + per_sample * batch``
(``fixed``: what the process holds whatever the batch: the framework, parameters, optimizer
state, pools; ``per_sample``: activations, their gradients and casts, per sample). Measure
the peak at two or three batch sizes (``amp_adapters.services.memory``, a fresh process each), fit
the
line (``fit_peak``), predict the largest batch under the budget (``PeakFit.largest_batch``),
and check the prediction with one run at that batch (``check``).

Pure functions and frozen records: nothing here measures or imports a framework. Sizes are
bytes; ``parse_size`` reads the ``4GiB`` a user writes.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction
from typing import Sequence

from ..rules.errors import AmpConfigError

# binary units (GiB, MiB, KiB) and their one-letter and decimal spellings: a memory budget
# is what `free -g` or a card's size says, so G, GB and GiB are all 2**30 here
UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1 << 10, "kib": 1 << 10, "m": 1 << 20,
         "mb": 1 << 20, "mib": 1 << 20, "g": 1 << 30, "gb": 1 << 30, "gib": 1 << 30,
         "t": 1 << 40, "tb": 1 << 40, "tib": 1 << 40}
MAX_BATCH = 2**31 - 1  # beyond this, a prediction is extrapolated too far to run
_SIZE = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-zA-Z]*)\s*")


class BatchFitError(AmpConfigError):
    """The measured peaks cannot answer (too few sizes, a peak that does not grow with the
    batch) or the budget is too small for batch 1: what is wrong, and what to do."""


def parse_size(text: str) -> int:
    """Bytes of a size as a user writes it: ``4GiB``, ``4G``, ``4GB`` (all 2**32), ``512MiB``,
    ``2.5g``, ``1073741824``; a size of zero bytes or an unknown unit is an error."""
    found = _SIZE.fullmatch(str(text))
    unit = found.group(2).lower() if found else None
    if not found or unit not in UNITS:
        raise AmpConfigError(f"{text!r} is not a memory size: write a number and a unit, such "
                             f"as 4GiB, 512MiB, 2.5G (binary units: G = GiB = 2**30 bytes), "
                             f"or a number of bytes")
    size = int(float(found.group(1)) * UNITS[unit])
    if size < 1:
        raise AmpConfigError(f"{text!r} is not a memory size: it must be more than 0 bytes")
    return size


def format_size(size: float) -> str:
    """``size`` bytes in the largest binary unit that keeps it at least 1: ``3.98 GiB``."""
    size = float(size)
    for unit, factor in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(size) >= factor:
            return f"{size / factor:.2f} {unit}"
    return f"{size:.0f} B"


@dataclass(frozen=True)
class PeakFit:
    """``peak = fixed + per_sample * batch``, fitted to ``points`` ((batch, peak bytes), by
    least squares, in exact fractions: a prediction at a budget's edge is not off by a float's
    rounding); ``residual``: the largest distance of a point from the line, in bytes."""

    fixed: Fraction
    per_sample: Fraction
    points: tuple[tuple[int, int], ...]
    residual: Fraction

    def peak_at(self, batch: int) -> Fraction:
        """The predicted peak at ``batch``, in bytes."""
        return self.fixed + self.per_sample * batch

    def largest_batch(self, budget: int) -> int:
        """The largest batch whose predicted peak is at most ``budget`` bytes;
        ``BatchFitError`` if not even batch 1 fits."""
        if budget < 1:
            raise BatchFitError(f"the budget must be more than 0 bytes, got {budget}")
        if self.peak_at(1) > budget:
            raise BatchFitError(
                f"{format_size(budget)} is too small for batch 1: its predicted peak is "
                f"{format_size(self.peak_at(1))} ({format_size(self.fixed)} held whatever the "
                f"batch: the framework, the parameters, the optimizer state); give a budget "
                f"above {format_size(self.peak_at(1))}")
        room = (budget - self.fixed) / self.per_sample
        if room > MAX_BATCH:
            raise BatchFitError(
                f"the fit predicts more than {MAX_BATCH} samples in {format_size(budget)} "
                f"({format_size(self.per_sample)} a sample): too far beyond the measured "
                f"batches {sorted({b for b, _ in self.points})} to trust; measure at larger "
                f"batches")
        return max(int(room), 1)  # exact: the floor of a fraction


def fit_peak(points: Sequence[tuple[int, int]]) -> PeakFit:
    """The least-squares line through ``points`` ((batch, peak bytes), at least two distinct
    batches). ``BatchFitError`` when the peak does not grow with the batch: at these sizes the
    per-sample bytes are lost in the process's noise (measure at larger batches)."""
    pts = tuple((int(b), int(p)) for b, p in points)
    for b, p in pts:
        if b < 1 or p < 1:
            raise BatchFitError(f"a measured point must have a batch and a peak of at least 1, "
                                f"got batch {b}, peak {p}")
    batches = sorted({b for b, _ in pts})
    if len(batches) < 2:
        raise BatchFitError(f"the fit needs peaks at two batch sizes or more, got "
                            f"{batches or 'none'}")
    n = len(pts)
    mean_b = Fraction(sum(b for b, _ in pts), n)
    mean_p = Fraction(sum(p for _, p in pts), n)
    sxx = sum((b - mean_b) ** 2 for b, _ in pts)
    sxy = sum((b - mean_b) * (p - mean_p) for b, p in pts)
    slope = sxy / sxx
    if not slope > 0:
        raise BatchFitError(
            f"the peak does not grow with the batch between batches {batches[0]} and "
            f"{batches[-1]} (measured {', '.join(format_size(p) for _, p in sorted(pts))}): "
            f"at these sizes a sample's bytes are lost in the process's noise; measure at "
            f"larger batches")
    fixed = mean_p - slope * mean_b
    residual = max(abs(p - (fixed + slope * b)) for b, p in pts)
    return PeakFit(fixed=fixed, per_sample=slope, points=pts, residual=residual)


@dataclass(frozen=True)
class FitCheck:
    """One run at the predicted ``batch``: its measured ``peak`` against the ``predicted`` one
    and the ``budget``; ``fits``: the measured peak is within the budget."""

    batch: int
    predicted: Fraction
    peak: int
    budget: int

    @property
    def fits(self) -> bool:
        return self.peak <= self.budget

    @property
    def error(self) -> float:
        """(measured - predicted) / predicted: how far the line was off at ``batch``."""
        return float((self.peak - self.predicted) / self.predicted)

    def refit(self, fit: PeakFit) -> PeakFit:
        """``fit`` with this run as one more point (what to predict from when it missed)."""
        return fit_peak(fit.points + ((self.batch, self.peak),))


def check(fit: PeakFit, budget: int, batch: int, peak: int) -> FitCheck:
    """The check of ``fit``'s prediction: ``peak`` measured at ``batch`` against ``budget``."""
    if batch < 1 or peak < 1:
        raise BatchFitError(f"a check needs a batch and a peak of at least 1, got batch {batch}, "
                            f"peak {peak}")
    return FitCheck(batch=batch, predicted=fit.peak_at(batch), peak=peak, budget=budget)


def batch_gain(base: int, other: int) -> float:
    """``other`` over ``base`` (both largest batches): MXNet's FAQ's 128 -> 256 is 2.0."""
    if base < 1:
        raise ValueError(f"base batch must be at least 1, got {base}")
    return other / base
