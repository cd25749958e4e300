"""The doctor's candidate fixes, narrowest first, and the check that one works.

From a ``DoctorReport`` and the policy it ran under, ``candidates`` builds the
fixes in the order of how much of the model they keep in the low dtype:

    (a) the loss scale alone (a lower ``init_scale``): only where every forward pass
        was finite and the overflow was in the backward pass, at a scale that keeps
        the recorded float32 backward values in range (and the gradients above
        flush, where the report says which scale they need);
    (b) the op instances the findings name, by layer (``Policy.<framework>_layers``);
    (c) an op type, only where most of its low instances need it (``Policy.ops``); before
        it, where the problem is range (an overflow or a flush, not a precision loss) and
        every op the report ran in float16 has a bfloat16 kernel here (``bf16_kernels``,
        the backend's answer), the same model in bfloat16: every op stays low, with
        float32's range and no loss scale. Which fix a model gets then depends on the
        device, as it should: a CPU without those kernels gets the op type.

The last one, every flagged op type, is kept as a fallback for when none of the
others passes. The report they are built from is the derivation steps' only
(``verify``). ``passes`` says whether the steps run under a candidate (its trial, a
``DoctorReport`` the backend made by training under its policy) are clean: no
overflow step and nothing left to change. ``keeps`` says what a fix keeps low ("3 of
4 linear ops stay float16"). Pure functions.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import AbstractSet, Mapping, Optional

from ...rules.dtypes import SHORT_NAMES
from ...rules.layers import LayerLists
from ...rules.oplists import CATEGORIES
from ...rules.policy import OpLists, Policy
from ...rules.scaler import DynamicLossScale, StaticLossScale
from .bf16 import Bf16Speed
from .bf16 import refusal as bf16_refusal
from .report import DoctorReport, Finding
from .stats import limits

# a scale candidate keeps the largest recorded backward value this far below the dtype's max,
# so the next batches' values (and one growth step of the dynamic scaler) have room
SCALE_HEADROOM = 4.0


@dataclass(frozen=True)
class Candidate:
    """One fix: ``kind`` (``loss_scale`` | ``layers`` | ``bf16`` | ``ops`` | ``all_ops``), the
    ``policy``
    with it applied, each change's reason by policy-file table (``reasons``, for the TOML),
    ``what`` it does in one line and the op instances it moves to float32 (``moved``)."""

    kind: str
    policy: Policy
    reasons: Mapping[str, Mapping[str, str]]
    what: str
    moved: tuple[str, ...] = ()


def _with_scale(policy: Policy, scale: float) -> Policy:
    ls = policy.loss_scale
    if isinstance(ls, DynamicLossScale):
        return policy.replace(loss_scale=dataclasses.replace(ls, scale=scale, init_scale=None))
    if isinstance(ls, StaticLossScale):
        return policy.replace(loss_scale=dataclasses.replace(ls, scale=scale))
    return policy


def _moved_ops(lists: OpLists, names: Mapping[str, str]) -> OpLists:
    """``lists`` with ``names`` moved to fp32 (out of any other list and conditional rule)."""
    kw = {c: frozenset(getattr(lists, c)) - set(names) for c in CATEGORIES}
    kw["fp32"] = kw["fp32"] | set(names)
    rules = tuple(r for r in lists.conditional_fp32 if r[0] not in names)
    return OpLists(**kw, conditional_fp32=rules, replace=lists.replace)


def backward_scale(report: DoctorReport) -> Optional[float]:
    """(a)'s scale: the largest power of two below the scale that overflowed at which every
    recorded float32 backward value, times the scale, stays ``SCALE_HEADROOM`` below the
    low dtype's max, and no lower than the gradients need (the report's underflow scale).
    None when the forward pass overflowed, nothing overflowed, or no such scale exists."""
    if report.dtype != "float16" or not report.overflow_steps:
        return None
    if any(s.first_forward for s in report.steps):
        return None
    over = [s for s in report.steps if s.overflow]
    biggest = max(s.backward_max for s in report.steps)
    if biggest <= 0 or not math.isfinite(biggest):
        return None
    top = limits(report.dtype).max / SCALE_HEADROOM
    scale = 2.0 ** math.floor(math.log2(top / biggest))
    scale = min(scale, min(s.scale for s in over) / 2)
    floor = report._needed_scale or 1.0
    return scale if scale >= floor else None


def _at_needed_scale(report: DoctorReport, policy: Policy) -> tuple[Policy, dict]:
    """``policy`` at the initial loss scale the findings ask for (gradient underflow), and
    that change's reason by policy-file table (``Candidate.reasons``); ``policy`` and no
    reason when they ask for none. Every fix starts from it."""
    for f in report.findings():
        if f.action == "loss_scale" and f.value is not None:
            return _with_scale(policy, f.value), {"init_scale": {"init_scale": f.reason}}
    return policy, {}


def _by_op_type(found: list[tuple[Finding, str]]) -> dict[str, list[tuple[Finding, str]]]:
    """The (finding, layer) pairs of ``found`` by op type (canonical, else the framework's),
    in order: what ``_by_type`` moves."""
    flagged: dict[str, list[tuple[Finding, str]]] = {}
    for f, layer in found:
        flagged.setdefault(f.canonical or f.op or "", []).append((f, layer))
    return flagged


def _instance_findings(report: DoctorReport) -> list[tuple[Finding, str]]:
    """(finding, the layer name of its instance) for each finding that moves an instance."""
    out = []
    for f in report.findings():
        if f.action == "fp32":
            out.append((f, report.op_named(f.name).layer_name))
    return out


def _type_counts(report: DoctorReport) -> dict[str, int]:
    """{op type (canonical, else the framework's): how many instances run low}."""
    counts: dict[str, int] = {}
    for r in report.ops:
        if r.lowered:
            key = r.canonical or r.op
            counts[key] = counts.get(key, 0) + 1
    return counts


RANGE_KINDS = ("overflow", "backward_overflow", "underflow")  # bf16's range cures these


def _bf16(report: DoctorReport, policy: Policy, bf16_kernels: Optional[AbstractSet[str]],
          bf16_speed: Optional[Bf16Speed] = None) -> Optional[Candidate]:
    """The model in bfloat16, where range is the problem and bf16 runs every op the report
    ran in float16 (a kernel for each, here) no slower than float32 where speed decides
    (``bf16.refusal``); None otherwise."""
    if report.dtype != "float16" or bf16_kernels is None:
        return None
    kinds = {f.kind for f in report.findings()}
    low = {r.op for r in report.ops if r.lowered}
    if not kinds & set(RANGE_KINDS) or not low or not all(op in bf16_kernels for op in low):
        return None
    if any(bf16_refusal(op, policy, bf16_speed) for op in sorted(low)):
        return None
    why = ("the problem is range, not precision, and every op that ran float16 has a "
           "bfloat16 kernel here: bfloat16 has float32's range, so nothing overflows or "
           "flushes and no loss scale is needed")
    return Candidate("bf16", policy.replace(dtype="bfloat16", loss_scale=None),
                     {"dtype": {"dtype": why}},
                     "run the model in bfloat16 (float32's range; no loss scale)")


def candidates(report: DoctorReport, policy: Policy,
               bf16_kernels: Optional[AbstractSet[str]] = None,
               bf16_speed: Optional[Bf16Speed] = None) -> list[Candidate]:
    """The fixes to try, narrowest first (module docstring). A scale change the findings
    ask for (gradient underflow) is part of every candidate. ``bf16_kernels``: the op
    names with a bfloat16 kernel here, training (None: no bfloat16 candidate);
    ``bf16_speed``: what is known of their speed here (``bf16.Bf16Speed``; None: a CPU
    with native bf16 instructions, nothing measured)."""
    fw = report.framework
    base, base_why = _at_needed_scale(report, policy)
    out: list[Candidate] = []
    scale = backward_scale(report)
    if scale is not None:
        why = (f"the forward pass is finite and the overflow is in the backward pass only: "
               f"at {scale:g} its largest recorded value stays {SCALE_HEADROOM:g}x below "
               f"the {SHORT_NAMES[report.dtype]} maximum")
        out.append(Candidate("loss_scale", _with_scale(policy, scale),
                             {"init_scale": {"init_scale": why}},
                             f"start the loss scale at {scale:g}; no op moves"))
    if base != policy and not out:  # the scale the gradients need, alone
        out.append(Candidate("loss_scale", base, base_why,
                             f"start the loss scale at {base.loss_scale.scale:g}; no op moves"))
    found = _instance_findings(report)
    bf16 = _bf16(report, policy, bf16_kernels, bf16_speed)
    if not found:
        return out + ([bf16] if bf16 else [])
    layers = {}
    for f, layer in found:
        layers.setdefault(layer, f.reason)
    key = f"{fw}_layers"
    lists: LayerLists = policy.framework_layers(fw).with_fp32(layers)
    moved = tuple(f.name for f, _ in found)
    out.append(Candidate("layers", base.replace(**{key: lists}), {key: layers, **base_why},
                         f"keep {', '.join(map(repr, sorted(layers)))} in float32", moved))
    if scale is not None:
        c = out[-1]
        out.append(Candidate("layers", _with_scale(c.policy, scale),
                             {**c.reasons, "init_scale": out[0].reasons["init_scale"]},
                             f"{c.what}{_AT_SCALE}{scale:g}", moved))
    if bf16:
        out.append(bf16)
    counts = _type_counts(report)
    flagged = _by_op_type(found)
    most = {t: fs for t, fs in flagged.items() if len(fs) > counts.get(t, 0) / 2}
    if most and len(most) == len(flagged):
        out.append(_by_type(report, base, base_why, flagged, "ops"))
    elif most:  # the types most of whose instances need it, the others by layer
        c = _by_type(report, base, base_why, most, "ops")
        rest = {layer: f.reason for t, fs in flagged.items() if t not in most for f, layer in fs}
        pol = c.policy.replace(**{key: c.policy.framework_layers(fw).with_fp32(rest)})
        out.append(Candidate("ops", pol, {**c.reasons, key: rest},
                             f"{c.what}; keep {', '.join(map(repr, sorted(rest)))} in float32",
                             moved))
    if not most or len(most) < len(flagged):
        out.append(_by_type(report, base, base_why, flagged, "all_ops"))
    return out


def rescaled(candidate: Candidate, replay: DoctorReport) -> Optional[Candidate]:
    """``candidate`` with a lower initial loss scale, where its replay overflowed in the
    backward pass only (its forward passes finite: the fix held there) at a scale that
    ``backward_scale`` can lower; None otherwise. Tried right after the candidate: moving
    an op to float32 can leave its large values to the backward pass of the next one."""
    if candidate.kind in ("loss_scale", "bf16"):
        return None
    scale = backward_scale(replay)
    if scale is None:
        return None
    what = candidate.what.split(_AT_SCALE)[0]  # a scale it already started at is replaced
    why = (f"with {what.split(';')[0]}, the forward pass is finite and the "
           f"backward pass overflows only: at {scale:g} its largest recorded value stays "
           f"{SCALE_HEADROOM:g}x below the {SHORT_NAMES[replay.dtype]} maximum")
    return Candidate(candidate.kind, _with_scale(candidate.policy, scale),
                     {**candidate.reasons, "init_scale": {"init_scale": why}},
                     f"{what}{_AT_SCALE}{scale:g}", candidate.moved)


_AT_SCALE = ", and start the loss scale at "  # how a fix's ``what`` names its initial scale


def _by_type(report: DoctorReport, base: Policy, base_why: Mapping,
             flagged: Mapping[str, list[tuple[Finding, str]]], kind: str) -> Candidate:
    """``base`` with each op type of ``flagged`` (``_by_op_type``) moved to fp32, for the
    reason of its first finding: canonical types under ``[ops]``, the framework's own
    names under ``[ops.<framework>]``."""
    canonical = {t: fs[0][0].reason for t, fs in flagged.items() if fs[0][0].canonical}
    own = {t: fs[0][0].reason for t, fs in flagged.items() if not fs[0][0].canonical}
    changes: dict = {}
    if canonical:
        changes["ops"] = _moved_ops(base.ops, canonical)
    fw_key = f"{report.framework}_ops"
    if own:
        changes[fw_key] = _moved_ops(base.framework_ops(report.framework), own)
    moved = tuple(f.name for fs in flagged.values() for f, _ in fs)
    return Candidate(kind, base.replace(**changes), {"ops": canonical, fw_key: own, **base_why},
                     f"keep every {', '.join(map(repr, sorted(flagged)))} op in float32", moved)


def passes(replay: DoctorReport) -> tuple[bool, str]:
    """Whether the steps run under a candidate (its trial: ``verify``) are clean, and why
    (not): no step overflows, nothing is left to change."""
    if replay.overflow_steps:
        first = next(s for s in replay.steps if s.overflow)
        where = (f"op {first.first_forward}" if first.first_forward else
                 f"the backward of {first.first_backward}" if first.first_backward else
                 f"the gradients of {', '.join(first.nonfinite_params)}")
        return False, (f"{replay.overflow_steps} of {len(replay.steps)} step(s) under it still "
                       f"overflow (step {first.step}: {where} at scale {first.scale:g})")
    left = [f for f in replay.findings() if f.action in ("fp32", "loss_scale")]
    if left:
        return False, f"the steps under it still find: {left[0].reason}"
    return True, (f"{len(replay.steps)} step(s) under it: no overflow, no op adds a "
                  f"relative error above the report's margin")


def keeps(report: DoctorReport, replay: DoctorReport, candidate: Candidate) -> tuple[str, ...]:
    """What the fix keeps low, per op type it touches ("3 of 4 linear ops stay fp16"); for a
    scale-only fix, that no op moves."""
    short = SHORT_NAMES[report.dtype]
    before = {r.name: r for r in report.ops}
    low_after = {r.index for r in replay.ops if r.lowered}  # by execution order: a backend
    # may name an instance by its position among ops and casts, which a fix changes
    if candidate.kind == "bf16":
        return (f"every op that ran {short} runs bf16 (float32's range)",)
    if not candidate.moved:
        return (f"no op moves: every op that ran {short} still does",)
    types = sorted({before[m].canonical or before[m].op for m in candidate.moved if m in before})
    out = []
    for t in types:
        mine = [r for r in report.ops if (r.canonical or r.op) == t and r.lowered]
        stay = sum(r.index in low_after for r in mine)
        out.append(f"{stay} of {len(mine)} {t} ops stay {short}")
    return tuple(out)
