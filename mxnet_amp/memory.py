"""MXNet's own count of its tensor bytes, for ``amp_adapters.services.memory`` (a ``TensorBytes``).

MXNet 1.9 has no query of CPU memory; its profiler, run with ``profile_memory=True``,
keeps a counter of the bytes its storage holds ("Memory: cpu/0" in the aggregate
statistics, in kB: the bytes over 1000). Started just before a step, the counter's maximum
is the most bytes the step's own allocations held at once (arrays allocated before it,
such as the parameters, are not in it). The profiler is stopped and its records dropped
after the step; it is never on while the process's peak is measured.
"""
from __future__ import annotations

import os
import re
import tempfile
from typing import Optional

import mxnet as mx

_COUNTER = re.compile(r"^\s*Memory: cpu/0\s+\d+\s+[-\d.]+\s+([-\d.]+)\s+[-\d.]+\s*$", re.M)


class ProfilerBytes:
    """The most CPU storage bytes MXNet's allocations held at once between ``start`` and
    ``peak`` (its storage profiler's counter); None when the profiler reports no counter."""

    name = "MXNet storage profiler, Memory: cpu/0 (allocated during the step)"

    def __init__(self, filename: Optional[str] = None) -> None:
        # MXNet writes its trace to this file when the process exits, whatever is set later
        # (never name a device such as os.devnull: MXNet replaces the file): by default in
        # the temporary directory, which a measuring process has to itself
        # (``amp_adapters.services.memory.measure_once``)
        self.filename = filename or os.path.join(tempfile.gettempdir(),
                                                 f"amp-adapters-mx-{os.getpid()}.json")

    def start(self) -> None:
        mx.nd.waitall()
        mx.profiler.set_config(profile_memory=True, aggregate_stats=True,
                               filename=self.filename)
        mx.profiler.dumps(reset=True)  # no earlier record in the aggregate
        mx.profiler.set_state("run")

    def peak(self) -> Optional[int]:
        mx.nd.waitall()
        mx.profiler.set_state("stop")
        return peak_from_stats(mx.profiler.dumps(reset=True))


def peak_from_stats(stats: str) -> Optional[int]:
    """The counter's maximum in bytes from the profiler's aggregate statistics; None if
    absent."""
    found = _COUNTER.search(stats)
    return None if found is None else round(float(found.group(1)) * 1000)
