"""The doctor's recommendation as data: a policy TOML that ``policy=`` accepts unchanged.

``recommend(report, policy)`` applies the findings to the policy the doctor
ran under (canonical ops move to ``[ops] fp32``, or the framework's own names
to ``[ops.<framework>] fp32`` where an op has no canonical name; the loss scale
starts higher) and writes the result as TOML with each change's reason as a
comment. The text is checked by loading it back with the core's loader: what
``Policy.from_file`` reads is exactly ``Recommendation.policy``.
"""
from __future__ import annotations

import dataclasses
import json
import math
import tomllib
from dataclasses import dataclass
from typing import Mapping, Optional

from ..layers import LAYER_CATEGORIES
from ..oplists import CATEGORIES
from ..policy import PRESETS, OpLists, Policy
from ..policyfile import STATE_FIELDS
from ..scaler import DynamicLossScale, NoOpLossScale, StaticLossScale
from .report import DoctorReport, Finding


@dataclass(frozen=True)
class Recommendation:
    """The doctor's recommendation (``recommendation()``): ``policy``, the policy the doctor
    ran under with the findings applied; ``toml``, that policy as a policy file with each
    change's reason as a comment (``Policy.from_file`` reads back exactly ``policy``); the
    ``findings`` it applied."""

    policy: Policy
    toml: str
    findings: tuple[Finding, ...]

    @property
    def changed(self) -> bool:
        """Whether it changes the policy (an op moved to fp32 or a higher loss scale)."""
        return any(f.action in ("fp32", "loss_scale") for f in self.findings)

    def write(self, path) -> None:
        """Write ``toml`` to ``path``: ``policy=`` accepts the file unchanged."""
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(self.toml)


def _moved(lists: OpLists, names: Mapping[str, str]) -> OpLists:
    """``lists`` with ``names`` moved to fp32 (out of any other list and conditional rule)."""
    kw = {c: frozenset(getattr(lists, c)) - set(names) for c in CATEGORIES}
    kw["fp32"] = kw["fp32"] | set(names)
    rules = tuple(r for r in lists.conditional_fp32 if r[0] not in names)
    return OpLists(**kw, conditional_fp32=rules, replace=lists.replace)


def recommend(report: DoctorReport, policy: Policy) -> Recommendation:
    """The policy ``policy`` with the report's findings applied, and its TOML."""
    findings = tuple(report.findings())
    canonical: dict[str, str] = {}
    own: dict[str, str] = {}
    notes: list[str] = []
    scale: Optional[float] = None
    for f in findings:
        if f.action == "fp32":
            (canonical if f.canonical else own).setdefault(f.canonical or f.op, f.reason)
        elif f.action == "loss_scale":
            scale, scale_reason = f.value, f.reason
        elif f.action == "bfloat16":
            notes.append(f.reason)
    changes: dict = {}
    if canonical:
        changes["ops"] = _moved(policy.ops, canonical)
    if own:
        changes[f"{report.framework}_ops"] = _moved(policy.framework_ops(report.framework), own)
    if scale is not None and isinstance(policy.loss_scale, (DynamicLossScale, StaticLossScale)):
        changes["loss_scale"] = dataclasses.replace(policy.loss_scale, scale=scale,
                                                    init_scale=None) \
            if isinstance(policy.loss_scale, DynamicLossScale) else \
            dataclasses.replace(policy.loss_scale, scale=scale)
    new = policy.replace(**changes) if changes else policy
    reasons = {"ops": canonical, f"{report.framework}_ops": own}
    if scale is not None:
        reasons["init_scale"] = {"init_scale": scale_reason}
    text = policy_toml(new, reasons, header=_header(report), notes=notes)
    loaded = Policy.from_dict(tomllib.loads(text), where="the doctor's recommendation")
    if loaded != new:  # a policy this writer cannot express: say so rather than mislead
        raise ValueError("the doctor's recommendation does not load back as the same policy; "
                         "please report this with the policy you passed")
    return Recommendation(new, text, findings)


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


def policy_toml(policy: Policy, reasons: Mapping[str, Mapping[str, str]] = {},
                header: tuple | list = (), notes: tuple | list = ()) -> str:
    """``policy`` as a policy file; ``reasons[table][name]`` becomes the comment of that line
    (tables: "ops", "mxnet_ops", "paddle_ops", "layers", "mxnet_layers", "paddle_layers",
    "init_scale")."""
    if policy.unlisted is not None or policy.native_version is not None:
        raise ValueError("a policy with unlisted= or native_version= has no policy-file form")
    out = [f"# {h}" for h in header]
    preset = _base_preset(policy)
    if preset:
        out.append(f"preset = {_q(preset)}   # the native default lists")
    out += [f"dtype = {_q(policy.dtype)}", f"level = {_q(policy.level)}",
            f"emulate = {'true' if policy.emulate else 'false'}"
            + ("   # no low-precision kernel here: rounded at op boundaries, labelled EMULATED"
               if policy.emulate else "")]
    for note in notes:
        out.append(f"# suggestion: dtype = \"bfloat16\"   # {note}")
    for table, key in (("ops", "ops"), ("ops.mxnet", "mxnet_ops"), ("ops.paddle", "paddle_ops")):
        lists: OpLists = getattr(policy, key)
        why = reasons.get(key, {})
        body = []
        for cat in CATEGORIES:
            names = sorted(getattr(lists, cat))
            if not names:
                continue
            if not any(n in why for n in names):
                body.append(f"{cat} = [{', '.join(map(_q, names))}]")
                continue
            body.append(f"{cat} = [")
            for n in names:
                body.append(f"  {_q(n)},   # {why[n]}" if n in why else f"  {_q(n)},")
            body.append("]")
        if lists.conditional_fp32:
            rules = ", ".join(f"{{ op = {_q(o)}, attr = {_q(a)}, values = "
                              f"[{', '.join(map(_q, v))}] }}" for o, a, v in
                              lists.conditional_fp32)
            body.append(f"conditional_fp32 = [{rules}]")
        if lists.replace:
            body.append("replace = true")
        if body:
            out += ["", f"[{table}]", *body]
    for table, key in (("layers", "layers"), ("layers.mxnet", "mxnet_layers"),
                       ("layers.paddle", "paddle_layers")):
        layers = getattr(policy, key)
        why = reasons.get(key, {})
        body = []
        for cat in LAYER_CATEGORIES:
            names = sorted(getattr(layers, cat))
            if names and not any(n in why for n in names):
                body.append(f"{cat} = [{', '.join(map(_q, names))}]")
            elif names:
                body += [f"{cat} = [", *(f"  {_q(n)},   # {why[n]}" if n in why else
                                         f"  {_q(n)}," for n in names), "]"]
        if body:
            out += ["", f"[{table}]", *body]
    out += ["", "[loss_scale]", *_loss_scale_lines(policy, reasons.get("init_scale", {}))]
    return "\n".join(out) + "\n"


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
        if value != getattr(default, f.name) and value is not None:
            lines.append(f"{f.name} = {_num(value)}")
    return lines
