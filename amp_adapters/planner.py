"""Cast decisions: (op, input dtypes, device kernels, policy) -> run dtype and casts.

Pure functions, the single place where precision is decided (DESIGN.md, "Cast
decisions"). A backend walks its graph, asks ``plan_op`` for each op and
inserts the casts it returns; it never decides anything itself.

Dtypes are numpy-style strings (``amp_adapters.dtypes``: "float16", "bfloat16", "float32",
"float64");
``None`` stands for an input that is never cast (integers, or a slot the op
table keeps in fp32, such as batch-norm statistics).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import AbstractSet, Mapping, Optional, Sequence

from .dtypes import AMP_DTYPES, widest
from .oplists import CATEGORIES, canonical_defaults, load_table
from .policy import Policy


@dataclass(frozen=True)
class Category:
    """Which category an op falls in under a policy, and why."""

    op: str
    canonical: Optional[str]
    category: str  # lower | fp32 | promote | follow
    reason: str


@dataclass(frozen=True)
class OpDecision:
    """How one op runs: the row of a cast report.

    ``run_dtype`` is the dtype the kernel computes in (None when the op has no
    floating input); ``casts[i]`` is the dtype input ``i`` is cast to, or None.
    ``emulated``: no low-precision kernel here, so the backend computes in
    float32 and rounds inputs and outputs through ``low_dtype``. ``fell_back``:
    the op would run in ``low_dtype`` but has no kernel here, so it runs in
    float32 (a backend logs that once).
    """

    op: str
    canonical: Optional[str]
    category: str
    input_dtypes: tuple[Optional[str], ...]
    run_dtype: Optional[str]
    casts: tuple[Optional[str], ...]
    emulated: bool
    fell_back: bool
    low_dtype: Optional[str]
    reason: str

    @property
    def num_casts(self) -> int:
        return sum(c is not None for c in self.casts)

    @property
    def precision(self) -> Optional[str]:
        """The dtype whose numerics the op has: ``low_dtype`` when emulated, else ``run_dtype``."""
        return self.low_dtype if self.emulated else self.run_dtype


def categorize(policy: Policy, framework: str, op: str,
               attrs: Optional[Mapping[str, object]] = None) -> Category:
    """The category of ``op`` (a ``framework`` op name) under ``policy``, with the reason.

    Precedence: a conditional-fp32 rule of the policy, the policy's overrides
    of the framework's names, the policy's overrides of canonical names, the
    canonical defaults, the native framework-only lists, else ``follow``.
    """
    canonical = load_table(framework).canonical(op, attrs)
    return _categorize(policy, framework, op, canonical,
                       _matched_rule(policy.framework_ops(framework).conditional_fp32, op, attrs))


def _matched_rule(rules, op: str, attrs: Optional[Mapping[str, object]]) -> Optional[str]:
    """``"attr=value"`` of the first conditional-fp32 rule ``op`` with ``attrs`` matches."""
    for rule_op, attr, values in rules:
        if rule_op == op and attrs and attr in attrs and str(attrs[attr]) in values:
            return f"{attr}={attrs[attr]}"
    return None


@functools.lru_cache(maxsize=4096)
def _categorize(policy: Policy, framework: str, op: str, canonical: Optional[str],
                matched_rule: Optional[str]) -> Category:
    if not policy.enabled:
        return Category(op, canonical, "follow", "O0: mixed precision is off")
    fw_ops = policy.framework_ops(framework)
    if matched_rule:
        return Category(op, canonical, "fp32",
                        f"Policy.{framework}_ops conditional_fp32: {matched_rule}")
    cat = fw_ops.category(op)
    if cat:
        return Category(op, canonical, cat, f"listed in Policy.{framework}_ops.{cat}")
    if canonical is not None:
        cat = policy.ops.category(canonical)
        if cat:
            return Category(op, canonical, cat, f"{canonical!r} listed in Policy.ops.{cat}")
        if not policy.ops.replace:
            cat = canonical_defaults(policy.dtype)[canonical]
            return Category(op, canonical, cat,
                            f"canonical op {canonical!r} is {cat} by default for {policy.dtype}")
    elif not fw_ops.replace:
        cat = load_table(framework).native.get(policy.dtype, {}).get(op)
        if cat:
            return Category(op, None, cat, f"native {framework} {policy.dtype} list: {cat}")
    return Category(op, canonical, "follow", "in no list: follows its inputs")


def plan_op(policy: Policy, framework: str, op: str,
            input_dtypes: Sequence[Optional[str]], *,
            lowp_kernels: Optional[AbstractSet[str]] = None,
            attrs: Optional[Mapping[str, object]] = None,
            force_fp32: Optional[str] = None) -> OpDecision:
    """Decide how ``op`` runs given its ``input_dtypes``.

    ``lowp_kernels``: the framework op names that have a ``policy.dtype``
    kernel on the current device; None means every op has one (a GPU). An op
    that would run in low precision without a kernel runs in float32 (or is
    emulated when ``policy.emulate``), instead of crashing. ``force_fp32``: a
    reason to run this one op in fp32 whatever its category (outside
    ``fp16_guard``, a black-listed variable). An op with a float64 input is
    left alone: AMP does not touch float64 computations.
    """
    dtypes = tuple(input_dtypes)
    cat = categorize(policy, framework, op, attrs)
    if force_fp32 and policy.enabled:
        cat = Category(op, cat.canonical, "fp32", force_fp32)
    reason, low = cat.reason, policy.dtype
    if not policy.enabled or "float64" in dtypes:
        target = widest(dtypes)
        if policy.enabled:
            reason += "; a float64 input: AMP leaves this op alone"
    elif cat.category == "fp32":
        target = "float32"
    elif cat.category == "lower" or (policy.level == "O2" and widest(dtypes) is not None):
        target = low
        if cat.category != "lower":
            reason += f"; O2: every op not in fp32 runs in {low}"
    else:  # promote, follow: the widest input wins, whatever the order
        target = widest(dtypes)
    emulated = fell_back = False
    if policy.enabled and target == low and lowp_kernels is not None and op not in lowp_kernels:
        target = "float32"
        if policy.emulate:
            emulated = True
            reason += (f"; EMULATED {low}: no {low} kernel for {op} on this device, so it "
                       f"computes in float32 on values rounded through {low}")
        else:
            fell_back = True
            reason += f"; no {low} kernel for {op} on this device: runs in float32"
    leave = not policy.enabled or "float64" in dtypes
    casts = tuple(target if not leave and d in AMP_DTYPES and d != target else None
                  for d in dtypes)
    return OpDecision(op=op, canonical=cat.canonical, category=cat.category, input_dtypes=dtypes,
                      run_dtype=target, casts=casts, emulated=emulated, fell_back=fell_back,
                      low_dtype=low if policy.enabled else None, reason=reason)


def effective_lists(policy: Policy, framework: str) -> dict[str, list[str]]:
    """{category: sorted op names} for every op ``framework``'s table knows, under ``policy``."""
    table = load_table(framework)
    out: dict[str, list[str]] = {c: [] for c in CATEGORIES}
    for op in sorted(table.names | policy.framework_ops(framework).names()):
        out[categorize(policy, framework, op).category].append(op)
    return out
