"""Side-by-side timing: the one way every measurement here compares two runs.

Two callables, each one complete run that waits for its result (a host sync, so the
time is the work's), are warmed up, then run in interleaved pairs, the order flipped
each pair so neither always runs on a warm cache; the answer is the median of the
per-pair ratios and its spread (half the interquartile range), never a bare time.
A budget bounds the cost: at least ``min_pairs`` pairs, then pairs until the budget
is spent or ``max_pairs`` is reached.
"""
from __future__ import annotations

import statistics
import time
from typing import Callable


def ratio_of(low: Callable[[], object], base: Callable[[], object], *, warmup: int = 2,
             min_pairs: int = 5, max_pairs: int = 41, budget_s: float = 0.5,
             clock: Callable[[], float] = time.perf_counter) -> tuple[float, float]:
    """(median of time(low) / time(base) over interleaved pairs, half the interquartile range
    of those ratios). Exceptions from either callable propagate (the caller decides what a
    failure means)."""
    for _ in range(warmup):
        low()
        base()
    ratios: list[float] = []
    start = clock()
    while len(ratios) < max_pairs and (len(ratios) < min_pairs or clock() - start < budget_s):
        first, second = (low, base) if len(ratios) % 2 == 0 else (base, low)
        t0 = clock()
        first()
        t1 = clock()
        second()
        t2 = clock()
        t_first, t_second = max(t1 - t0, 1e-9), max(t2 - t1, 1e-9)
        ratios.append(t_first / t_second if first is low else t_second / t_first)
    return spread_of(ratios)


def spread_of(ratios: list[float]) -> tuple[float, float]:
    """(median, half the interquartile range) of ``ratios``."""
    if len(ratios) < 2:
        return ratios[0], 0.0
    q = statistics.quantiles(ratios, n=4, method="inclusive")
    return statistics.median(ratios), (q[2] - q[0]) / 2
