"""Side-by-side timing: variants interleaved step by step in one process, median and spread.

Timings on a shared 2-core machine drift; running the variants round-robin
(A B C A B C ...) exposes them to the same drift, so their ratio is stable
even when the absolute times are not. Only ratios are reported.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Mapping

import numpy as np


@dataclass(frozen=True)
class Stats:
    """Per-step seconds of one variant: median and the 10th/90th percentiles."""

    median: float
    p10: float
    p90: float
    n: int


def interleaved(variants: Mapping[str, Callable[[], None]], steps: int = 200,
                warmup: int = 20) -> dict[str, Stats]:
    """Run each variant ``warmup`` times, then ``steps`` times round-robin; time each call.

    Each callable must finish its work before returning (a host sync), or the
    time measured is only the time to enqueue it.
    """
    def timed(fn: Callable[[], None]) -> Callable[[], float]:
        def run() -> float:
            t0 = time.perf_counter()
            fn()
            return time.perf_counter() - t0
        return run
    return interleaved_self_timed({name: timed(fn) for name, fn in variants.items()},
                                  steps, warmup)


def ratio(stats: Mapping[str, Stats], name: str, baseline: str) -> str:
    """``1.04x (p10-p90 0.98-1.11)``: the median ratio, and the spread of ``name`` over the
    baseline's median."""
    b = stats[baseline].median
    s = stats[name]
    return f"{s.median / b:.2f}x ({s.p10 / b:.2f}-{s.p90 / b:.2f})"


def interleaved_self_timed(variants: Mapping[str, Callable[[], float]], steps: int = 200,
                           warmup: int = 20) -> dict[str, Stats]:
    """``interleaved`` for variants that time themselves (each call returns the seconds of
    its own timed part: what a variant must set up untimed, such as entering a region, stays
    out of its figure)."""
    for fn in variants.values():
        for _ in range(warmup):
            fn()
    times: dict[str, list[float]] = {name: [] for name in variants}
    names = list(variants)
    for i in range(steps):
        for name in names[i % len(names):] + names[:i % len(names)]:  # rotate the order too
            times[name].append(variants[name]())
    return {name: Stats(float(np.median(t)), float(np.percentile(t, 10)),
                        float(np.percentile(t, 90)), len(t)) for name, t in times.items()}
