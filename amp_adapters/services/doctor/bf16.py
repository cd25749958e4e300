"""Whether the doctor's bfloat16 candidate may lower an op: a kernel is not a kernel that is
faster.

The bfloat16 candidate (``candidates._bf16``) runs every op the report ran in float16 in
bfloat16 instead. Where speed decides (a ``speed = "measured"`` policy, such as ``auto``),
or where the device's truth says oneDNN emulates bfloat16 (``isa.bf16_class``:
``"emulated"``, AVX-512 without bf16 instructions, where a bf16 GEMM is slower than
float32), an op goes into that candidate only if its bfloat16 training step was measured
faster than float32 here (``device.speed_refusal``, the planner's own rule). Without such a
measurement the candidate is not offered: the doctor does not recommend a fix that makes
the model slower than the fixes in float16 it tries instead. On a CPU with native bf16
instructions under a fixed-speed policy, a kernel is enough (as the lists decide there).
Pure; the session gives the device's class and, where it has them, the costs. Today no
backend hands the doctor measured costs (its report keeps no operand shapes, which the
speed book is keyed by), so under measured speed or emulation the bfloat16 candidate is
never offered: over-cautious, never slower.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

from ...rules.device import Cost, speed_refusal
from ...rules.isa import bf16_class
from ...rules.policy import Policy


@dataclass(frozen=True)
class Bf16Speed:
    """What the doctor knows of bfloat16's speed on the device the model runs on:
    ``emulated`` (the device's truth: ``isa.bf16_class(...) == "emulated"``) and ``cost``,
    the measured cost of an op's bfloat16 training step against float32, casts included
    (op name -> ``Cost``; None: not measured)."""

    emulated: bool = False
    cost: Callable[[str], Optional[Cost]] = lambda op: None

    @classmethod
    def of_machine(cls, machine: dict, cost: Callable[[str], Optional[Cost]] = lambda op: None
                   ) -> "Bf16Speed":
        """This CPU's answer (``isa.machine()``), with ``cost`` where measured."""
        return cls(bf16_class(machine) == "emulated", cost)


def refusal(op: str, policy: Policy, speed: Optional[Bf16Speed]) -> Optional[str]:
    """Why the bfloat16 candidate may not lower ``op`` (module docstring), or None."""
    speed = speed or Bf16Speed()
    if policy.speed != "measured" and not speed.emulated:
        return None
    cost = speed.cost(op)
    if cost is None:
        if speed.emulated:
            return (f"oneDNN emulates bfloat16 here (no bf16 instructions): {op} is slower "
                    f"than float32 unless measured otherwise, and it was not measured")
        return f"{op}: its bfloat16 training step was not measured faster here (speed = " \
               f"\"measured\")"
    why = speed_refusal(cost, True, "bfloat16")
    return f"{op}: {why}" if why else None
