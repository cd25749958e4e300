"""What a backend tells the user about ops that do not run in the low dtype on this device.

An op planned in float16/bfloat16 whose kernel this device lacks runs in
float32 (``OpDecision.fell_back``): the user asked for mixed precision and did
not get it there, so that is a WARNING, once per op (MXNet and native Paddle
warn too). An ``emulated`` op is what ``emulate=True`` asked for: INFO. After a
model or program is built, one summary line says how many ops run in the low
dtype, how many stay float32 and why, and that ``emulate=True`` emulates the
missing kernels. Both backends call ``FallbackNotices``; the wording lives here.
Pure bookkeeping and formatting: no framework, no host sync.
"""
from __future__ import annotations

import logging
from collections import Counter
from typing import Optional, Sequence

from .planner import OpDecision


def op_message(op: str, device: str, d: OpDecision) -> str:
    """The per-op line: ``FullyConnected on cpu(0): <the decision's reason>``."""
    hint = f"; pass emulate=True to emulate {d.low_dtype}" if d.fell_back else ""
    return f"{op} on {device}: {d.reason}{hint}"


def _names(decisions: Sequence[OpDecision]) -> str:
    counts = Counter(d.op for d in decisions)
    return ", ".join(f"{op} x{n}" if n > 1 else op for op, n in sorted(counts.items()))


def summary(what: str, decisions: Sequence[OpDecision], device: str) -> Optional[str]:
    """One line about ``what`` (a model, a program) when some op lacks a low-precision kernel
    on ``device``; None when every op planned low precision got it (nothing to say)."""
    fell = [d for d in decisions if d.fell_back]
    emulated = [d for d in decisions if d.emulated]
    if not fell and not emulated:
        return None
    low = (fell or emulated)[0].low_dtype
    in_low = sum(d.run_dtype == low for d in decisions)
    listed = sum(d.run_dtype == "float32" and d.category == "fp32" for d in decisions)
    parts = [f"{in_low} ops run in {low}"] + ([f"{listed} in float32 by the op lists"]
                                              if listed else [])
    if fell:
        parts.append(f"{len(fell)} in float32 for lack of a {low} kernel on {device} "
                     f"({_names(fell)}): pass emulate=True to emulate {low} on them")
    if emulated:
        parts.append(f"{len(emulated)} EMULATED {low} (no kernel on {device}: float32 "
                     f"arithmetic on values rounded through {low}; {_names(emulated)})")
    return f"{what}: " + ", ".join(parts)


class FallbackNotices:
    """Per-op fallback warnings, each op once, and the per-model summary, on one logger."""

    def __init__(self, logger: str):
        self.logger = logging.getLogger(logger)
        self._seen: set[tuple[str, str]] = set()

    def note(self, op: str, device: str, d: OpDecision) -> None:
        """Log ``op``'s fallback (WARNING) or emulation (INFO), once per (op, device type)."""
        if not (d.fell_back or d.emulated):
            return
        key = (op, device.split("(")[0])
        if key not in self._seen:
            self._seen.add(key)
            self.logger.log(logging.WARNING if d.fell_back else logging.INFO,
                            "%s", op_message(op, device, d))

    def summarize(self, what: str, decisions: Sequence[OpDecision], device: str) -> None:
        """Log ``summary``: WARNING when an op fell back to float32, INFO when emulated."""
        line = summary(what, decisions, device)
        if line:
            level = logging.WARNING if any(d.fell_back for d in decisions) else logging.INFO
            self.logger.log(level, "%s", line)

    def forget(self) -> None:
        """Let every op warn again (after ``reset``)."""
        self._seen.clear()
