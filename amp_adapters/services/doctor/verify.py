"""What "verified" means for a doctor's fix: out of sample, with optimizer updates.

The doctor records ``n`` of the user's steps. A fix is derived from the first
``derived_steps(n)`` of them only (the findings, the loss scale a candidate starts at, the
layers it keeps in float32); the later ones are held out. A candidate is then tried by
*training under it*: from the state the first recorded step started from (its parameters
and optimizer state), each recorded batch in order runs forward and backward under the
candidate's graph at the scale its loss scale has reached, and, unless the step overflowed
and the scaler skips it (``after_step``, the core's state machine), the optimizer updates
the parameters. The held-out steps therefore run on batches the fix was not derived from,
with parameters the fix's own training produced.

``verdict``: the trial is clean (no step overflows, from the first one as in a new run,
and nothing is left to change: ``candidates.passes``) and at least one step was held
out. With a single recorded step nothing is held out, and nothing is verified.

A backend only runs the steps (``Session.replay``: the trial's report, each step marked
``updated`` when its update was applied); what counts as verified is decided here.
"""
from __future__ import annotations

from dataclasses import dataclass

from ...rules.scaler import LossScale
from .candidates import passes
from .report import DoctorReport


def derived_steps(recorded: int) -> int:
    """How many of ``recorded`` steps a fix is derived from: the first half, rounded up;
    the rest (at least one, from two steps on) is held out to verify it."""
    return recorded - recorded // 2


def after_step(loss_scale: LossScale, overflow: bool) -> tuple[LossScale, bool]:
    """(the loss scale of the next step, whether this step's optimizer update applies): a
    scale that checks overflow skips an overflow step; one that does not (bfloat16,
    float32) applies every update, as training would."""
    return loss_scale.adjust(overflow), not (overflow and loss_scale.checks_overflow)


@dataclass(frozen=True)
class Verdict:
    """Whether a candidate's trial verifies it (``ok``), why (``why``), and on how many
    steps: ``held_out`` (not derived from), ``derived`` (derived from), ``updates`` (the
    optimizer updates the trial applied)."""

    ok: bool
    why: str
    held_out: int
    derived: int
    updates: int


def verdict(trial: DoctorReport, derived: int) -> Verdict:
    """The verdict on a candidate's ``trial`` (its report, one step per recorded batch),
    the first ``derived`` steps of which the candidate was derived from."""
    n = len(trial.steps)
    held = n - derived
    updates = sum(s.updated for s in trial.steps)
    how = f"{n} step(s) trained under it ({updates} optimizer update(s))"
    if held < 1:
        return Verdict(False, f"no step was held out to verify it on ({n} recorded, all used "
                              f"to derive it): record at least 2 steps", 0, derived, updates)
    clean, why = passes(trial)
    where = f"{held} held out of its derivation"
    if clean:
        return Verdict(True, f"{how}, {where}: no overflow, no op's error above the "
                             f"report's margin", held, derived, updates)
    return Verdict(False, f"{how}, {where}: {why}", held, derived, updates)
