"""The doctor's recommendation as data: a policy TOML that ``policy=`` accepts unchanged.

``recommend(report, policy, replay)`` tries the candidate fixes
(``candidates``: the loss scale alone, the named layers, an op type), derived from
the first recorded steps, narrowest first, training under each (``replay``, the
backend's trial) and judging it on steps held out of its derivation
(``verify.verdict``), and writes the first that passes as TOML with each change's
reason as a comment, what it keeps low, that it was verified and on how many steps. Without a
replay, every flagged op type
moves to fp32 (canonical ops to ``[ops] fp32``, the framework's own names to
``[ops.<framework>] fp32``). The text is checked by loading it back with the core's loader: what
``Policy.from_file`` reads is exactly ``Recommendation.policy``.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import tomllib
from dataclasses import dataclass
from typing import AbstractSet, Callable, Mapping, Optional

from ...rules.layers import LAYER_CATEGORIES, LayerLists
from ...rules.oplists import CATEGORIES
from ...rules.policy import OpLists, Policy
from ...rules.policyfile import STATE_FIELDS
from ...rules.scaler import DynamicLossScale, NoOpLossScale
from .candidates import (Candidate, _at_needed_scale, _by_op_type, _by_type, _instance_findings,
                         candidates, keeps, rescaled)
from .bf16 import Bf16Speed
from .report import DoctorReport, Finding
from .verify import derived_steps, verdict


@dataclass(frozen=True)
class Recommendation:
    """The doctor's recommendation (``recommendation()``): ``policy``, the policy the doctor
    ran under with the fix applied; ``toml``, that policy as a policy file with each
    change's reason as a comment (``Policy.from_file`` reads back exactly ``policy``); the
    ``findings`` it answers. Where the backend trained under the candidate fixes
    (``candidates``, narrowest first; ``verify``): ``fix``, what the chosen one does;
    ``verified``, whether its trial passed (``verify.verdict``), and ``verification`` why
    (or why none passed); ``held_out``, ``derived`` and ``updates``, on how many steps it
    was verified, from how many derived, with how many optimizer updates (the file says
    so too); ``keeps``, what it keeps low ("3 of 4 linear ops stay float16"); ``tried``,
    (fix, passed, why) for every candidate tried."""

    policy: Policy
    toml: str
    findings: tuple[Finding, ...]
    fix: str = ""
    verified: bool = False
    verification: str = ""
    keeps: tuple[str, ...] = ()
    tried: tuple[tuple[str, bool, str], ...] = ()
    held_out: int = 0    # the steps that verified it, held out of its derivation
    derived: int = 0     # the steps it was derived from
    updates: int = 0     # the optimizer updates of its trial

    @property
    def changed(self) -> bool:
        """Whether it changes the policy (an op or a layer moved to fp32, another loss scale)."""
        return bool(self.fix) or any(f.action in ("fp32", "loss_scale") for f in self.findings)

    def format(self) -> str:
        """The recommendation in words: the fix, what it keeps, whether it was verified."""
        if not self.fix:
            return "recommendation: no change" if not self.changed else \
                f"recommendation (not verified: " \
                f"{self.verification or 'this doctor cannot replay its steps'})"
        lines = [f"recommendation: {self.fix}"]
        lines += [f"  keeps: {k}" for k in self.keeps]
        lines.append(f"  {'verified' if self.verified else 'NOT verified'}: "
                     f"{self.verification}")
        for what, ok, why in self.tried:
            if what != self.fix:
                lines.append(f"  tried first: {what}: {'passed' if ok else 'failed'} ({why})")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.format()

    def write(self, path) -> None:
        """Write ``toml`` to ``path``: ``policy=`` accepts the file unchanged."""
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(self.toml)


Replay = Callable[[Policy], DoctorReport]


def recommend(report: DoctorReport, policy: Policy, replay: Optional[Replay] = None,
              bf16_kernels: Optional[AbstractSet[str]] = None,
              bf16_speed: Optional[Bf16Speed] = None) -> Recommendation:
    """The fix for the report's findings, applied to ``policy``, and its TOML.

    With ``replay`` (the backend training under a policy from the recorded state over the
    recorded batches, with optimizer updates: ``verify``), the candidate fixes
    (``candidates``: the loss scale alone, the named layers, bfloat16 where
    ``bf16_kernels`` run every low op no slower (``bf16_speed``), an op type) are derived
    from the first ``verify.derived_steps`` recorded steps only, tried narrowest first,
    and the first whose trial ``verify.verdict`` passes (clean, on steps held out of the
    derivation too) is recommended, with what it keeps low; if none is, the widest,
    marked not verified. A candidate whose trial overflows in the backward pass only is
    tried again at a lower initial scale (``rescaled``, from the trial's derivation steps)
    before the next. With one recorded step nothing is held out: nothing is verified.
    Without ``replay``, every flagged op type moves to fp32 (a backend that cannot replay)."""
    policy = portable(policy)  # the file names the same profile wherever it is saved
    findings = tuple(report.findings())
    if replay is None:
        return _by_findings(report, policy, findings)
    derived = derived_steps(len(report.steps))
    if derived >= len(report.steps):
        return _by_findings(report, policy, findings, verdict(report, derived).why)
    basis = report.window(0, derived)  # what a fix is derived from; the rest is held out
    tried: list[tuple[str, bool, str]] = []
    chosen = None
    for first in candidates(basis, policy, bf16_kernels, bf16_speed):
        c: Optional[Candidate] = first
        while c is not None:
            trial = replay(c.policy)
            v = verdict(trial, derived)
            tried.append((c.what, v.ok, v.why))
            chosen = (c, trial, v)
            c = None if v.ok else rescaled(c, trial.window(0, derived))
        if v.ok:
            break
    if chosen is None:
        text = policy_toml(policy, {}, header=_header(report), notes=_notes(findings))
        return Recommendation(policy, _checked(text, policy), findings)
    c, trial, v = chosen
    why = v.why if v.ok else \
        f"none of the {len(tried)} candidate fixes passed its trial; this one: {v.why}"
    kept = keeps(basis, trial, c)
    head = [*_header(report), f"Fix: {c.what}.",
            *(f"Keeps: {k}." for k in kept),
            f"{'Verified' if v.ok else 'NOT verified'}: {why}.",
            f"{'Verified on' if v.ok else 'Tried on'}: {v.held_out} held-out step(s) "
            f"(derived from {v.derived}; {v.updates} optimizer update(s) in its trial)."]
    text = policy_toml(c.policy, c.reasons, header=head, notes=_notes(findings))
    return Recommendation(c.policy, _checked(text, c.policy), findings, c.what, v.ok, why, kept,
                          tuple(tried), v.held_out, v.derived, v.updates)


def _notes(findings) -> list[str]:
    return [f.reason for f in findings if f.action == "bfloat16"]


def _checked(text: str, policy: Policy) -> str:
    loaded = Policy.from_dict(tomllib.loads(text), where="the doctor's recommendation")
    if loaded != policy:  # a policy this writer cannot express: say so rather than mislead
        raise ValueError("the doctor's recommendation does not load back as the same policy; "
                         "please report this with the policy you passed")
    return text


def _by_findings(report: DoctorReport, policy: Policy, findings: tuple[Finding, ...],
                 unverified: str = "") -> Recommendation:
    """Every finding applied as it says (each flagged op type to fp32, the loss scale it
    asks for), not verified: the recommendation of a backend that cannot replay, or of
    too few steps to hold one out (``unverified``: why). It is the candidates' widest fix
    (every flagged type), taken without a trial."""
    base, base_why = _at_needed_scale(report, policy)
    c = _by_type(report, base, base_why, _by_op_type(_instance_findings(report)), "all_ops")
    head = [*_header(report), *([f"NOT verified: {unverified}."] if unverified else [])]
    text = policy_toml(c.policy, c.reasons, header=head, notes=_notes(findings))
    return Recommendation(c.policy, _checked(text, c.policy), findings,
                          verification=unverified)


def _header(report: DoctorReport) -> list[str]:
    return [f"Recommended by amp-adapters doctor ({report.framework}, {len(report.steps)} "
            f"step(s), {report.mode}; {report.overflow_steps} overflow step(s)).",
            "Pass this file as policy= unchanged (it drives MXNet and Paddle alike)."]


def _q(s: str) -> str:
    return json.dumps(s)  # a TOML basic string is a JSON string for these names


def _num(x: float) -> str:
    if math.isinf(x):
        return '"inf"'
    return str(int(x)) if float(x).is_integer() and abs(x) < 2 ** 53 else repr(float(x))


def _base_preset(policy: Policy) -> Optional[str]:
    if policy.defaults == "native":
        return "mxnet-native"  # one policy value with paddle-native
    return None


def portable(policy: Policy) -> Policy:
    """``policy`` with its ``profile`` path made absolute: a policy file reads a relative
    path from its own folder, so the file a writer gives names the same profile wherever it
    is saved (``policy_toml`` writes this policy)."""
    if policy.profile is None or os.path.isabs(policy.profile):
        return policy
    return policy.replace(profile=os.path.abspath(policy.profile))


def policy_toml(policy: Policy, reasons: Mapping[str, Mapping[str, str]] = {},
                header: tuple | list = (), notes: tuple | list = ()) -> str:
    """``policy`` as a policy file that loads back as ``portable(policy)`` (every field a
    ``Policy`` has: ``speed`` and ``profile`` too, a ``replace`` that names lists,
    ``unlisted``, ``native_version``, a loss scale without a skip limit);
    ``reasons[table][name]`` becomes the comment of that line (tables: "ops", "mxnet_ops",
    "paddle_ops", "layers", "mxnet_layers", "paddle_layers", "init_scale", "dtype")."""
    policy = portable(policy)
    out = [f"# {h}" for h in header]
    preset = _base_preset(policy)
    if preset:
        out.append(f"preset = {_q(preset)}   # the native default lists")
    dtype_why = reasons.get("dtype", {}).get("dtype")
    out += [f"dtype = {_q(policy.dtype)}" + (f"   # {dtype_why}" if dtype_why else ""),
            f"level = {_q(policy.level)}",
            f"emulate = {'true' if policy.emulate else 'false'}"
            + ("   # no low-precision kernel here: rounded at op boundaries, labelled EMULATED"
               if policy.emulate else "")]
    if policy.speed != "fixed":
        out.append(f"speed = {_q(policy.speed)}   # an op runs low only where measured faster")
    if policy.profile is not None:
        out.append(f"profile = {_q(policy.profile)}")
    if policy.unlisted is not None:
        out.append(f"unlisted = {_q(policy.unlisted)}   # the category of an op in no list")
    if policy.use_promote:
        out.append("use_promote = true   # at O2 a promote op still takes its widest input")
    if policy.native_version is not None:
        out.append(f"native_version = {_q(policy.native_version)}")
    for note in notes:
        out.append(f"# suggestion: dtype = \"bfloat16\"   # {note}")
    for table, key in (("ops", "ops"), ("ops.mxnet", "mxnet_ops"), ("ops.paddle", "paddle_ops")):
        lists: OpLists = getattr(policy, key)
        body = _list_lines(lists, CATEGORIES, reasons.get(key, {}))
        if lists.conditional_fp32:
            rules = ", ".join(f"{{ op = {_q(o)}, attr = {_q(a)}, values = "
                              f"[{', '.join(map(_q, v))}] }}" for o, a, v in
                              lists.conditional_fp32)
            body.append(f"conditional_fp32 = [{rules}]")
        if lists.replace is True:
            body.append("replace = true")
        elif lists.replace:  # the default lists it replaces, and only those
            body.append(f"replace = [{', '.join(map(_q, sorted(lists.replace)))}]")
        if body:
            out += ["", f"[{table}]", *body]
    for table, key in (("layers", "layers"), ("layers.mxnet", "mxnet_layers"),
                       ("layers.paddle", "paddle_layers")):
        body = _list_lines(getattr(policy, key), LAYER_CATEGORIES, reasons.get(key, {}))
        if body:
            out += ["", f"[{table}]", *body]
    out += ["", "[loss_scale]", *_loss_scale_lines(policy, reasons.get("init_scale", {}))]
    return "\n".join(out) + "\n"


def _list_lines(lists: "OpLists | LayerLists", categories: tuple[str, ...],
                why: Mapping[str, str]) -> list[str]:
    """``<category> = [...]`` for each non-empty list of ``categories`` (op lists or layer
    lists), names sorted: on one line, or one name a line where ``why`` has a reason for
    one of them (the reason as the line's comment)."""
    body = []
    for cat in categories:
        names = sorted(getattr(lists, cat))
        if names and not any(n in why for n in names):
            body.append(f"{cat} = [{', '.join(map(_q, names))}]")
        elif names:
            body += [f"{cat} = [", *(f"  {_q(n)},   # {why[n]}" if n in why else
                                     f"  {_q(n)}," for n in names), "]"]
    return body


def _loss_scale_lines(policy: Policy, why: Mapping[str, str]) -> list[str]:
    ls = policy.loss_scale
    if isinstance(ls, NoOpLossScale):
        return ['kind = "none"']
    kind = "dynamic" if isinstance(ls, DynamicLossScale) else "static"
    lines = [f"kind = {_q(kind)}"]
    scale = ls.init_scale if getattr(ls, "init_scale", None) is not None else ls.scale
    comment = f"   # {why['init_scale']}" if "init_scale" in why else ""
    lines.append(f"init_scale = {_num(scale)}{comment}")
    default = type(ls)()
    for f in dataclasses.fields(ls):
        if f.name in STATE_FIELDS or f.name == "init_scale":
            continue
        value = getattr(ls, f.name)
        if value == getattr(default, f.name):
            continue
        if value is None:  # a guard turned off (TOML has no null)
            if f.name != "max_consecutive_skips":
                raise ValueError(f"the loss scale's {f.name} = None has no policy-file form")
            lines.append(f"{f.name} = false   # no limit")
        else:
            lines.append(f"{f.name} = {_num(value)}")
    return lines
