"""The demo's speed table: a GEMM-bound training step, float32 against AMP, side by side.

The digits MLP (64-64-10) costs per op, not per FLOP: no AMP makes it faster. This table
trains a GEMM-bound MLP (1024-1024-1024-10, batch 256, random data) instead, one step of
float32 and one of AMP in turn (``amp_adapters.services.timing.ratio_of``: interleaved pairs,
median ratio and spread), under the native's bf16 decisions (``O1-bf16``) and under
``auto`` (bf16 only where this machine measured it faster). Each (framework, policy) runs
in a child process: MXNet's ``init`` patches the process, and Paddle fixes its IR at
import. The child prints one JSON line; nothing here imports a framework.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from typing import Optional, Sequence

POLICIES = ("O1-bf16", "auto")
MODEL = "MLP 1024-1024-1024-10, batch 256"
WIDTH, BATCH, LAYERS = 1024, 256, 2
BUDGET_S = 4.0  # timing per row, after warm-up
BUDGET_ENV = "AMP_DEMO_SPEED_BUDGET_S"  # overrides BUDGET_S: the demo's tests run every row's
# path end to end, and no assertion reads the figure (at least 5 pairs are timed whatever it is)


@dataclass(frozen=True)
class SpeedRow:
    """One (framework, policy): the AMP step's time over float32's, and what stayed float32."""

    framework: str
    policy: str
    ratio: float = float("nan")
    spread: float = 0.0
    low: int = 0           # GEMMs that ran in bf16
    gemms: int = 0
    kept: tuple[str, ...] = ()  # "FullyConnected 1.31x": the GEMMs speed kept float32
    error: Optional[str] = None


def rows(frameworks: Sequence[str]) -> list[SpeedRow]:
    """One row per framework and policy, each from a child process."""
    out = []
    for fw in frameworks:
        for policy in POLICIES:
            out.append(_child(fw, policy))
    return out


def _child(framework: str, policy: str) -> SpeedRow:
    cmd = [sys.executable, "-m", "amp_demo.speed", framework, policy]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=600,
                              env={**os.environ, "PYTHONWARNINGS": "ignore"})
    except subprocess.TimeoutExpired:
        return SpeedRow(framework, policy, error="timed out")
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    if done.returncode != 0 or not lines:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return SpeedRow(framework, policy, error=f"exit {done.returncode}: {tail[:160]}")
    got = json.loads(lines[-1])
    got["kept"] = tuple(got.get("kept", ()))
    return SpeedRow(**got)


def budget_s(env=os.environ) -> float:
    """The timing budget of one row in seconds: ``BUDGET_S``, or ``$AMP_DEMO_SPEED_BUDGET_S``."""
    raw = env.get(BUDGET_ENV)
    if raw is None:
        return BUDGET_S
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not value >= 0:
        raise ValueError(f"{BUDGET_ENV} must be a number of seconds >= 0, got {raw!r} (unset it "
                         f"for the default {BUDGET_S:g})")
    return value


def format_rows(result: Sequence[SpeedRow]) -> str:
    """The table, then one line per row whose GEMMs speed kept in float32, with the ratio."""
    table = [("framework", "policy", "step time vs fp32", "GEMMs in bf16")]
    notes = []
    for r in result:
        if r.error:
            table.append((r.framework, r.policy, f"cannot run ({r.error})", "-"))
            continue
        table.append((r.framework, r.policy, f"{r.ratio:.2f}x (+-{r.spread:.2f})",
                      f"{r.low} of {r.gemms}"))
        if r.kept:
            notes.append(f"  {r.framework} {r.policy}: kept float32, not measured faster in "
                         f"bf16 here (bf16/fp32, casts included): {', '.join(r.kept)}")
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in table]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines + notes)


def main(argv: Sequence[str]) -> int:
    """``python -m amp_demo.speed FRAMEWORK POLICY``: one row, as a JSON line."""
    from amp_adapters.services.quiet import quiet_frameworks
    quiet_frameworks()
    framework, policy = argv
    if framework not in ("mxnet", "paddle"):
        print(f"amp_demo.speed: unknown framework {framework!r} (mxnet or paddle)",
              file=sys.stderr)
        return 2
    budget = budget_s()  # a bad value fails before a framework is imported
    if framework == "mxnet":
        from .mxnet_trainer import speed_row
    else:
        from .paddle_trainer import speed_row
    got = speed_row(policy, WIDTH, BATCH, LAYERS, budget)
    print(json.dumps({"framework": framework, "policy": policy, **got}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
