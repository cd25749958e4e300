"""Cast decisions: (op, input dtypes, device profile, policy) -> run dtype and casts.

Pure functions, the single place where precision is decided (DESIGN.md, "Cast
decisions"). A backend walks its graph, asks ``plan_op`` for each op and
inserts the casts it returns; it never decides anything itself.

Dtypes are numpy-style strings (``amp_adapters.rules.dtypes``: "float16", "bfloat16", "float32",
"float64");
``None`` stands for an input that is never cast (integers, or a slot the op
table keeps in fp32, such as batch-norm statistics); ``UNKNOWN`` for a floating
value whose dtype is known only when the graph runs (a traced MXNet symbol).

The answer is complete: which inputs to cast (and to what), which slots the
table keeps in fp32, and for emulation which inputs to round through the low
dtype and which outputs to round. A backend only applies it.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence

from .device import DeviceProfile, ShapeClass, speed_refusal
from .dtypes import AMP_DTYPES, widest
from .oplists import (CATEGORIES, canonical_defaults, load_table, native_lists, pass_through_ops,
                      passes_through)
from .policy import Policy

UNKNOWN = "unknown"  # a floating input whose dtype is known only at run time (traced symbol)

# the grounds on which a device profile refuses a kernel it has (``OpDecision.refusal``):
# slower by a rule of the profile, not measured faster, or measured speed without a timing
REFUSALS = ("rule", "measured", "unmeasured")


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
    For an ``UNKNOWN`` input ``casts[i]`` means "cast if needed" (a cast that
    is free at run time when the dtype already matches). ``multicast``: a
    promote op with inputs of unknown dtype; every floating input is cast to
    their widest dtype, decided at run time (``amp_multicast``). ``kept[i]``:
    the op table keeps input ``i`` in fp32 (statistics, affine parameters), so
    it is never cast. ``emulated``: no low-precision kernel here, so the backend
    computes in float32 on inputs with ``round_inputs[i]`` replaced by their
    value rounded through ``low_dtype`` (fp32 -> low -> fp32; this replaces
    ``casts[i]``) and, when ``round_outputs``, rounds every floating output
    except the slots in ``kept_outputs`` the same way. ``kept_outputs``: output
    slots the table keeps fp32 (never declared low, never rounded).
    ``fell_back``: the op would run in ``low_dtype`` but has no kernel here,
    so it runs in float32 (a backend logs that once). ``refusal``: it has one, which the
    device profile refuses, and on what grounds (``REFUSALS``): ``"rule"`` (slower than
    float32 here by a rule of the profile, ``DeviceProfile.refusal``), ``"measured"`` (not
    measured faster, ``device.speed_refusal``) or ``"unmeasured"`` (measured speed, but no
    timing for it); the reason says why in words. A choice made for speed, not a missing
    kernel (``kernel_refused``), so it is logged as INFO. ``layer``: the ``Policy.layers``
    pattern that decided this instance's category (None: its op type's lists did).
    ``speed``: the measured ratio of its low kernel's time to float32's (casts included)
    where measured speed decided (``Policy.speed == "measured"``), else None.
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
    kept: tuple[bool, ...] = ()
    multicast: bool = False
    round_inputs: tuple[bool, ...] = ()
    round_outputs: bool = False
    kept_outputs: tuple[str, ...] = ()
    kernel_checked: bool = False  # the device's kernels were asked (else: no device given)
    refusal: Optional[str] = None  # why the device refused its kernel: one of REFUSALS
    speed: Optional[float] = None
    layer: Optional[str] = None  # the layer pattern (Policy.layers...) that decided it

    @property
    def kernel_refused(self) -> bool:
        """It has a low kernel here, which the device profile refused (``refusal``)."""
        return self.refusal is not None

    @property
    def lacks_kernel(self) -> bool:
        """It fell back to float32 because this device has no low kernel for it (not because
        the backend refused a slow one): what a user is warned about."""
        return self.fell_back and not self.kernel_refused

    @functools.cached_property
    def device_dependent(self) -> bool:
        """True if the device's kernels took part in this decision (the op would run in
        ``low_dtype``): a backend memoizing decisions must key this one on the device too."""
        return self.low_dtype is not None and (
            self.run_dtype == self.low_dtype or self.emulated or self.fell_back)

    @functools.cached_property
    def needs_action(self) -> bool:
        """True if a backend has anything to do for this op (a cast, a rounding)."""
        return self.multicast or self.round_outputs or any(self.round_inputs) or any(
            c is not None for c in self.casts)

    @property
    def num_casts(self) -> int:
        return sum(c is not None for c in self.casts)

    @property
    def execution(self) -> Optional[str]:
        """How an op planned in the low dtype runs: ``"kernel"`` (a real low-precision
        kernel on this device), ``"emulated"``, ``"fell back"`` (float32 for lack of a
        usable kernel: none, or ``kernel_refused``), ``"planned"`` (no device was asked: a
        device-free graph transform); None for an op not planned low."""
        if self.emulated:
            return "emulated"
        if self.fell_back:
            return "fell back"
        if self.low_dtype is None or self.run_dtype != self.low_dtype:
            return None
        return "kernel" if self.kernel_checked else "planned"

    @property
    def precision(self) -> Optional[str]:
        """The dtype whose numerics the op has: ``low_dtype`` when emulated, else ``run_dtype``."""
        return self.low_dtype if self.emulated else self.run_dtype


def categorize(policy: Policy, framework: str, op: str,
               attrs: Optional[Mapping[str, object]] = None) -> Category:
    """The category of ``op`` (a ``framework`` op name) under ``policy``, with the reason.

    Precedence: a conditional-fp32 rule of the policy, the policy's overrides
    of the framework's names, the policy's overrides of canonical names, then
    the defaults: with ``defaults="shared"`` the canonical defaults and the
    native framework-only lists, with ``defaults="native"`` the installed
    native's default lists (and its conditional rules), exactly; an op in no
    list gets ``policy.unlisted`` (else follow, or the native's rule). A default
    list the overrides replace (``OpLists.replace``) is skipped, and a default
    never overrides an op the framework's overrides name: the user's list decides
    it, as it would natively once that list replaced the default one. Level
    OD keeps ``lower`` and turns every other category into fp32.
    """
    canonical = load_table(framework).canonical(op, attrs)
    fw_ops = policy.framework_ops(framework)
    rules = fw_ops.conditional_fp32
    if policy.defaults == "native" and policy.enabled and \
            not fw_ops.replaces("conditional_fp32") and op not in fw_ops.names():
        native = native_lists(framework, policy.dtype, policy.native_version)
        rules = (*rules, *native.conditional_fp32)
    return _categorize(policy, framework, op, canonical, _matched_rule(rules, op, attrs))


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
    cat = _by_lists(policy, framework, op, canonical, matched_rule)
    if policy.level == "OD" and cat.category != "lower":
        return Category(op, canonical, "fp32", f"{cat.reason}; level OD: not lower, so fp32")
    return cat


def _by_lists(policy: Policy, framework: str, op: str, canonical: Optional[str],
              matched_rule: Optional[str]) -> Category:
    fw_ops = policy.framework_ops(framework)
    if matched_rule:
        return Category(op, canonical, "fp32", f"conditional_fp32: {matched_rule}")
    cat = fw_ops.category(op)
    if cat:
        return Category(op, canonical, cat, f"listed in Policy.{framework}_ops.{cat}")
    if canonical is not None:
        cat = policy.ops.category(canonical)
        if cat:
            return Category(op, canonical, cat, f"{canonical!r} listed in Policy.ops.{cat}")
    if policy.defaults == "native":
        if fw_ops.replace is not True:
            native = native_lists(framework, policy.dtype, policy.native_version)
            cat = native.category(op)
            where = f"in no native {framework} list"
            if cat is not None and fw_ops.replaces(cat):  # in no list now
                cat, where = None, (f"its native {framework} default list ({cat}) is replaced "
                                    f"by Policy.{framework}_ops.{cat}, which omits it")
            if policy.level == "O2" and native.o2_fp32 is not None and (
                    cat is None or (cat == "fp32" and op not in native.o2_fp32)):
                if fw_ops.replaces("fp32"):  # (pure bf16's rule: its fp32 list, no other)
                    return Category(op, canonical, "follow", f"O2 keeps in fp32 only "
                                    f"Policy.{framework}_ops.fp32, which replaces the native "
                                    f"fp32 lists, and lowers the rest")
                return Category(op, canonical, "follow", f"native {framework} O2: only "
                                f"{sorted(native.o2_fp32)} stay fp32; O2 lowers the rest")
            if cat:
                return Category(op, canonical, cat, f"native {framework} {native.version} "
                                f"{policy.dtype} default list: {cat}")
            if policy.unlisted is None:
                return Category(op, canonical, native.unlisted,
                                f"{where}: {native.unlisted}, as the native does")
    elif canonical is not None:
        cat = canonical_defaults(policy.dtype)[canonical]
        if not policy.ops.replaces(cat):
            return Category(op, canonical, cat,
                            f"canonical op {canonical!r} is {cat} by default for {policy.dtype}")
    else:
        cat = load_table(framework).native.get(policy.dtype, {}).get(op)
        if cat and not fw_ops.replaces(cat):
            return Category(op, None, cat, f"native {framework} {policy.dtype} list: {cat}")
    if policy.unlisted:
        return Category(op, canonical, policy.unlisted, f"in no list: {policy.unlisted} "
                        f"(Policy.unlisted)")
    return Category(op, canonical, "follow", "in no list: follows its inputs")


def output_fp32(policy: Policy) -> Optional[str]:
    """Why an op whose result a run hands back runs in float32 under ``policy`` (the loss, a
    result no op of the program reads: what a user fetches), or None.

    numpy has no bfloat16: a fetched bfloat16 tensor comes back as its raw bit pattern in
    uint16 (0.1 as 15821.0), a silent wrong value where float32 and float16 fetch as
    floats. Such an op runs in float32 (a backend that can write a float32 copy of the
    result under the name the user holds may cast instead): the one op, at the end of the
    program, costs little."""
    if policy.enabled and policy.dtype == "bfloat16":
        return ("its result is a program output (the loss, or a value no op reads: what a "
                "run fetches), kept float32: a fetched bfloat16 tensor is raw uint16 bits, "
                "numpy has no bfloat16")
    return None


def attrs_read(policy: Policy, framework: str, op: str) -> tuple[str, ...]:
    """The attribute names of ``op`` whose values can change its decision under ``policy``
    (the table's conditional attribute, the policy's conditional-fp32 rules): what a
    backend that memoizes decisions must key on, besides the input dtypes and device."""
    return _attrs_read(policy, framework, op)


@functools.lru_cache(maxsize=4096)
def _attrs_read(policy: Policy, framework: str, op: str) -> tuple[str, ...]:
    names = []
    rule = load_table(framework).conditional.get(op)
    if rule is not None:
        names.append(rule.attr)
    names += [attr for rule_op, attr, _ in policy.framework_ops(framework).conditional_fp32
              if rule_op == op]
    return tuple(dict.fromkeys(names))


@dataclass(frozen=True)
class OpCall:
    """One op as its graph calls it: what the planner reads of it, the same in every runtime
    (a Gluon graph or imperative call, a Paddle static program, a Paddle dygraph call).

    ``op``: the op's name in its framework (``"FullyConnected"``, ``"matmul_v2"``).
    ``input_dtypes``: the dtype of each input, numpy-style (``amp_adapters.rules.dtypes``); None for
    an input that is never cast (an integer), ``UNKNOWN`` for a floating value whose dtype
    is known only when the graph runs (a traced MXNet symbol; it counts as float32). An op
    with a float64 input is left alone: AMP does not touch float64 computations.
    ``shape``: its operands' shape class (``device.ShapeClass``), which a device profile's
    refusal rules and measured costs are keyed on; None: not known.
    ``attrs``: its attributes (any mapping; only those ``attrs_read`` names are looked at).
    ``force_fp32``: a reason to run this one op in fp32 whatever its category (outside
    ``fp16_guard``, a black-listed variable).
    ``input_names``: the slot name of each input; slots the op table keeps in fp32 are never
    cast (``OpDecision.kept``) and count as None.
    ``param_inputs``: which inputs are parameters (weights, biases: stored values read once
    per step), for the promote rule; None treats every input as an activation.
    ``free``: which inputs have no dtype of their own yet (a parameter of a graph being
    converted, whose dtype the framework infers from the op reading it, as MXNet's native
    conversion leaves it).
    ``readers``: under O2, the ops reading its results (``ParamUse``, with ``then`` for those
    that only move values too): an op O2 lowers for being O2 alone (it follows or promotes
    its inputs) whose neighbours stay float32 follows them; None: not listed, so O2 lowers
    it as any other op.
    ``instance``: the name(s) of this op instance (a node name, its block or layer, its
    output variables), which the policy's layer rules (``Policy.layers``) match: a rule
    wins over the op type's lists.
    """

    op: str
    input_dtypes: tuple[Optional[str], ...]
    shape: Optional[ShapeClass] = None
    attrs: Optional[Mapping[str, object]] = None
    force_fp32: Optional[str] = None
    input_names: Optional[Sequence[str]] = None
    param_inputs: Optional[Sequence[bool]] = None
    free: Optional[Sequence[bool]] = None
    readers: Optional[Sequence[Any]] = None
    instance: "str | Sequence[str] | None" = None

    def __post_init__(self):
        if type(self.input_dtypes) is not tuple:
            object.__setattr__(self, "input_dtypes", tuple(self.input_dtypes))


def plan_op(policy: Policy, framework: str, call: OpCall,
            device: Optional[DeviceProfile] = None) -> OpDecision:
    """Decide how the op ``call`` (an ``OpCall`` of a ``framework`` op) runs under ``policy``
    on ``device``.

    ``device``: what the device the op runs on has (``DeviceProfile``: its kernels, the rules
    that refuse some, their measured cost); None means every op has a kernel (a device-free
    graph transform). An op that would run in low precision without a kernel runs in
    float32 (or is emulated when ``policy.emulate``), instead of crashing; so does one whose
    kernel the profile refuses at ``call.shape`` (``DeviceProfile.refusal``) and, under
    ``policy.speed == "measured"``, one whose kernel was not measured faster than float32
    (``device.speed_refusal``). A refused op runs as where there is no kernel, with the
    refusal as its reason (emulated under ``emulate=True``: the policy asked for
    low-precision numerics, and rounding costs less than the slow kernel).

    Six steps, each with one rule: ``_category`` (the lists), ``_free_inputs``
    (what a free input counts as), ``_idle_move`` (an O2 op that only moves values
    between float32 neighbours follows them), ``_target`` (the dtype the category and
    the inputs ask for), ``_on_device`` (the kernels here), ``_input_actions`` (what
    to do to each input to get there).
    """
    if not isinstance(call, OpCall):
        raise TypeError(f"plan_op(policy, framework, call, device): call must be an "
                        f"amp_adapters.OpCall (the op, its input dtypes, ...), not "
                        f"{type(call).__name__}: write plan_op(policy, {framework!r}, "
                        f"OpCall(op, input_dtypes, ...), device=...)")
    op, input_dtypes, shape = call.op, call.input_dtypes, call.shape
    param_inputs, readers = call.param_inputs, call.readers
    kept = _kept(framework, op, call.input_names, len(input_dtypes))
    given = tuple(None if k else d for d, k in zip(input_dtypes, kept))
    params = tuple(param_inputs or ()) + (False,) * (len(given) - len(param_inputs or ()))
    cat, layer = _category(policy, framework, op, call.attrs, call.force_fp32, call.instance)
    typed = _free_inputs(cat, given, tuple(call.free or ()))
    idle = _idle_move(policy, framework, op, cat, typed, readers, device, shape)
    target = _target(policy, cat, typed, params[:len(given)], idle)
    run = _on_device(policy, op, target, device, shape)
    round_inputs, multicast, casts = _input_actions(policy, cat, typed, target, run)
    return OpDecision(op=op, canonical=cat.canonical, category=cat.category, input_dtypes=given,
                      run_dtype=run.dtype, casts=casts, emulated=run.emulated,
                      fell_back=run.fell_back, low_dtype=policy.dtype if policy.enabled else None,
                      reason=run.reason, kept=kept, multicast=multicast,
                      round_inputs=round_inputs, round_outputs=run.emulated,
                      kept_outputs=load_table(framework).keep_fp32_outputs.get(op, ()),
                      kernel_checked=device is not None and device.kernels is not None,
                      refusal=run.refusal, speed=run.speed, layer=layer)


@dataclass(frozen=True)
class _Target:
    """What the category and the inputs ask for, before the device has its say."""

    dtype: Optional[str]
    reason: str
    by_inputs: bool = False  # promote/follow: its inputs decided (not a speed choice)
    leave: bool = False      # O0, or a float64 input: AMP does nothing to this op


@dataclass(frozen=True)
class _Run:
    """The dtype the op runs in on this device, and whether it fell back or is emulated."""

    dtype: Optional[str]
    reason: str
    emulated: bool = False
    fell_back: bool = False
    refusal: Optional[str] = None  # why the device refused the kernel it has (REFUSALS)
    speed: Optional[float] = None  # measured low/float32 ratio, where speed decided


def _category(policy: Policy, framework: str, op: str, attrs: Optional[Mapping[str, object]],
              force_fp32: Optional[str], instance) -> tuple[Category, Optional[str]]:
    """Rule: the caller's force to fp32, else a layer rule naming this instance
    (``Policy.layer_rule``), else the lists (``categorize``). Level OD keeps a layer's
    ``lower`` and its ``fp32``; O0 has no rules. Also returns the deciding layer pattern."""
    cat = categorize(policy, framework, op, attrs)
    if force_fp32 and policy.enabled:
        return Category(op, cat.canonical, "fp32", force_fp32), None
    rule = policy.layer_rule(framework, instance) if policy.enabled else None
    if rule is not None:
        return Category(op, cat.canonical, rule.category, rule.reason), rule.pattern
    return cat, None


def _free_inputs(cat: Category, given: tuple[Optional[str], ...],
                 free: tuple[bool, ...]) -> tuple[Optional[str], ...]:
    """Rule: a follow op decides from the inputs that have a dtype of their own; a free
    input (none yet: the framework infers it from the op reading it, as MXNet's type
    inference does for a converted graph's parameters) then counts as None, so it is
    never cast and takes the op's run dtype. Other categories, and a follow op whose
    every typed input is free, see the inputs as given."""
    free = tuple(free[:len(given)]) + (False,) * (len(given) - len(free))
    if cat.category != "follow" or not any(free) or all(
            d is None for d, f in zip(given, free) if not f):
        return given
    return tuple(None if f else d for d, f in zip(given, free))


def _target(policy: Policy, cat: Category, given: tuple[Optional[str], ...],
            params: tuple[bool, ...], idle: Optional[str] = None) -> _Target:
    """Rule: the category picks the dtype; promote/follow take the widest input, whatever
    the order (fp32 wins a promote), except that a promote op whose float32 inputs are all
    parameters beside activations in the low dtype runs low (``_params_down``). O2 lowers
    every op not in fp32 (a promote op still promotes under ``Policy.use_promote``), but an
    op that follows or promotes float32 inputs none of its readers computes low, with no
    low kernel measured faster (``idle``, from ``_idle_move``), follows its data."""
    dtypes = tuple("float32" if d == UNKNOWN else d for d in given)
    low = policy.dtype
    if not policy.enabled or "float64" in dtypes:
        reason = cat.reason + ("; a float64 input: AMP leaves this op alone"
                               if policy.enabled else "")
        return _Target(widest(dtypes), reason, leave=True)
    if cat.category == "fp32":
        return _Target("float32", cat.reason)
    if cat.category == "lower":
        return _Target(low, cat.reason)
    if _moves_params(cat, dtypes, params):
        return _Target("float32", cat.reason + "; it only moves float32 parameters: they "
                       "stay float32 for the ops that read its result (the O2 parameter "
                       "plan decided that), no cast down and back", by_inputs=True)
    if idle is not None:
        return _Target("float32", cat.reason + f"; {idle}", by_inputs=True)
    if policy.level == "O2" and widest(dtypes) is not None and not (
            policy.use_promote and cat.category == "promote"):
        return _Target(low, cat.reason + f"; O2: every op not in fp32 runs in {low}")
    if cat.category == "promote" and _params_down(low, given, params):
        return _Target(low, cat.reason + f"; its float32 inputs are parameters: cast down to "
                       f"{low} once per step, instead of each {low} activation up (the "
                       f"result carries {low} rounding either way)", by_inputs=True)
    return _Target(widest(dtypes), cat.reason, by_inputs=True)


def _moves_params(cat: Category, dtypes: tuple[Optional[str], ...],
                  params: tuple[bool, ...]) -> bool:
    """True for an op that only moves values (``oplists.pass_through_ops``: reshape,
    transpose, ...) whose floating inputs are all float32 parameters: lowering it gains no
    arithmetic, and its result feeds ops that need float32 (else O2 had stored them low)."""
    floats = [(d, p) for d, p in zip(dtypes, params) if d is not None]
    return (cat.canonical in pass_through_ops() and bool(floats)
            and all(d == "float32" and p for d, p in floats))


def _idle_move(policy: Policy, framework: str, op: str, cat: Category,
               dtypes: tuple[Optional[str], ...], readers: Optional[Sequence[Any]],
               device: Optional[DeviceProfile], shape: Optional[ShapeClass]) -> Optional[str]:
    """Rule: under O2, an op that O2 lowers for being O2 alone (one that follows or promotes
    its inputs, as a shape-only op does: reshape, transpose, an elementwise op such as the
    attention's scale) follows its data where nothing around it computes low: its floating
    inputs are float32 (what wrote them ran in float32), none of its ``readers`` computes
    in the low dtype here (in it or EMULATED), through readers that only move values too,
    and its own low kernel was not measured faster than float32 here (``_measured_faster``).
    Lowering it would cost a cast down and one back up (and their gradients) around one op
    between float32 ops, rounding its values, for a kernel not known to gain anything.
    Returns why, or None (not such an op; or its readers are not listed, or one of them
    runs low: O2 lowers it, so a low reader gets its values low, as natively; where every op
    has a low kernel, as on a GPU or in a device-free plan, a reader not in fp32 always
    does; or its kernel was measured faster: a choice measured speed may make)."""
    if policy.level != "O2" or readers is None or not policy.enabled \
            or cat.category not in ("follow", "promote"):
        return None
    floats = [d for d in dtypes if d is not None]
    if not floats or any(d not in ("float32", UNKNOWN) for d in floats):
        return None
    if any(_computes_low(policy, framework, use, device) for use in readers):
        return None
    if _measured_faster(policy, op, device, shape):
        return None
    what = ("it only moves float32 values" if cat.canonical in pass_through_ops() else
            "its inputs are float32")
    return (f"{what} and none of its readers computes in {policy.dtype} here, nor was its "
            f"{policy.dtype} kernel measured faster: it follows its data (no cast down and "
            f"back)")


def _measured_faster(policy: Policy, op: str, device: Optional[DeviceProfile],
                     shape: Optional[ShapeClass]) -> bool:
    """Whether ``op``'s low kernel, casts included, was measured faster than float32 here at
    ``shape`` beyond noise (``device.speed_refusal``); False without a kernel, without a
    measurement (no ``DeviceProfile.costs``: fixed speed) or for a failed one."""
    if device is None or device.costs is None or not device.has_kernel(op) or \
            device.refusal(op, shape, policy.dtype) is not None:
        return False
    cost = device.cost(op, shape)
    if cost is None or cost.error or not math.isfinite(cost.ratio(device.training)[0]):
        return False
    return speed_refusal(cost, device.training, policy.dtype) is None


def _computes_low(policy: Policy, framework: str, use: Any,
                  device: Optional[DeviceProfile]) -> bool:
    """Whether the reader ``use`` (a ``ParamUse``) computes with ``policy.dtype`` numerics
    on a float32 input here; a reader that only moves values, by its own readers; one that
    lists its readers (``then``) is planned with them (a lone op behind a lone op)."""
    if use.force_fp32 is None and use.then is not None and \
            passes_through(framework, use.op, use.attrs):
        return any(_computes_low(policy, framework, u, device) for u in use.then)
    d = plan_reader(policy, framework, use, device, readers=use.then)
    return not (d.kept and d.kept[0]) and d.precision == policy.dtype


def plan_reader(policy: Policy, framework: str, use: Any,
                device: Optional[DeviceProfile],
                readers: Optional[Sequence[Any]] = None) -> OpDecision:
    """``plan_op`` for the op ``use`` (a ``ParamUse``) reading one float32 value in its slot:
    what O2's parameter plan and the rule of an op between float32 neighbours ask of a
    reader (``readers``: its own, for that rule)."""
    return plan_op(policy, framework, OpCall(
        use.op, ("float32",), shape=use.shape, attrs=use.attrs, force_fp32=use.force_fp32,
        input_names=None if use.slot is None else (use.slot,), instance=use.instance,
        readers=readers), device)


def _params_down(low: str, given: tuple[Optional[str], ...], params: tuple[bool, ...]) -> bool:
    """True when every floating activation input is already ``low`` (a known dtype) and
    every float32 input is a parameter: casting those parameters down is cheaper (a
    weight is cast once per step, an activation on every call, and the low result needs
    no cast back down for the next low-precision op) and as exact as the activation's
    own ``low`` rounding allows (the sum/product of a ``low`` value carries ``low``
    relative error whichever operand is rounded). Two activations: fp32 still wins."""
    acts = [d for d, p in zip(given, params) if not p and d is not None]
    fp32_params = [d for d, p in zip(given, params) if p and d == "float32"]
    return bool(acts) and bool(fp32_params) and all(d == low for d in acts) and all(
        d in (low, "float32", None) for d, p in zip(given, params) if p)


def _on_device(policy: Policy, op: str, t: _Target, device: Optional[DeviceProfile],
               shape: Optional[ShapeClass]) -> _Run:
    """Rule: an op that would run low without a kernel here, or whose kernel the device
    profile refuses (by rule at this shape, or under measured speed as not faster than
    float32), runs in float32 (or is emulated when the policy asks for it).

    Measured speed judges what the lists *choose* to lower; an op that only follows its
    low inputs (``_Target.by_inputs``: relu after a bf16 GEMM) is not a choice: running it
    in float32 would add a cast up and one back down around it, and its low kernel's
    existence is all it needs."""
    low = policy.dtype
    if not (policy.enabled and t.dtype == low and device is not None):
        return _Run(t.dtype, t.reason)
    chosen = policy.speed == "measured" and not t.by_inputs
    cost = device.cost(op, shape) if chosen and device.has_kernel(op) else None
    refused = device.refusal(op, shape, low) if device.has_kernel(op) and not (
        cost is not None and cost.error) else None
    kind = "rule" if refused is not None else None  # OpDecision.refusal: REFUSALS
    speed = None
    if refused is None and cost is not None and not cost.error:
        refused, kind = speed_refusal(cost, device.training, low), "measured"
        speed = cost.ratio(device.training)[0]
        if refused is None:
            return _Run(t.dtype, t.reason + f"; measured faster here ({speed:.2f}x float32, "
                        f"casts included)", speed=speed)
    elif refused is None and cost is None and chosen and device.costs is not None and \
            device.has_kernel(op):
        # measured speed lowers only what was measured faster: never slower than float32
        kind = "unmeasured"
        refused = (f"float32: not measured here (no timing for {op} at "
                   f"{shape.key if shape is not None and shape.operands else 'unknown shapes'})"
                   f", and measured speed lowers only what was measured faster")
    if refused is None and device.has_kernel(op) and not (cost is not None and cost.error):
        return _Run(t.dtype, t.reason)
    why = refused or (f"no {low} kernel for {op} on {device.name}" if cost is None or not
                      cost.error else f"its {low} kernel failed while being timed here "
                      f"({cost.error})")
    if policy.emulate:
        return _Run("float32", t.reason + f"; EMULATED {low}: {why}, so it computes in float32 "
                    f"on values rounded through {low}", emulated=True, refusal=kind,
                    speed=speed)
    return _Run("float32", t.reason + f"; {why}" + ("" if why.startswith("float32:") else
                                                   ": runs in float32"),
                fell_back=True, refusal=kind, speed=speed)


def _input_actions(policy: Policy, cat: Category, given: tuple[Optional[str], ...],
                   t: _Target, run: _Run) -> tuple[tuple[bool, ...], bool,
                                                   tuple[Optional[str], ...]]:
    """Rule: cast each AMP-dtype input that differs from the run dtype; emulation rounds
    instead; a promote op with inputs of unknown dtype casts at run time (multicast)."""
    low, target = policy.dtype, run.dtype
    dtypes = tuple("float32" if d == UNKNOWN else d for d in given)
    unknown = tuple(d == UNKNOWN for d in given)
    # emulation rounds every AMP-dtype input not already in the low dtype (an upcast of a
    # low value is exact, so such an input is only cast)
    round_inputs = tuple(run.emulated and (u or (d in AMP_DTYPES and d != low))
                         for d, u in zip(dtypes, unknown))
    # a promote op with inputs of unknown dtype: their widest is known only at run time
    promote_unknown = t.by_inputs and cat.category == "promote" and any(unknown)
    multicast = (not t.leave and promote_unknown and sum(d in AMP_DTYPES for d in dtypes) > 1)
    casts = tuple(
        None if (t.leave or r or promote_unknown or d not in AMP_DTYPES or (u and t.by_inputs)
                 or (d == target and not u))
        else target
        for d, u, r in zip(dtypes, unknown, round_inputs))
    return round_inputs, multicast, casts


def _kept(framework: str, op: str, input_names: Optional[Sequence[str]],
          n: int) -> tuple[bool, ...]:
    """Which inputs the op table keeps in fp32, by slot name."""
    keep = load_table(framework).keep_fp32_inputs.get(op, ())
    if not keep or input_names is None:
        return (False,) * n
    names = tuple(input_names) + ("",) * (n - len(input_names))
    return tuple(name in keep for name in names[:n])


def effective_lists(policy: Policy, framework: str) -> dict[str, list[str]]:
    """{category: sorted op names} for every op ``framework``'s table knows, under ``policy``."""
    if policy.defaults == "native" and policy.enabled:
        names = native_lists(framework, policy.dtype, policy.native_version).names
    else:
        names = load_table(framework).names
    out: dict[str, list[str]] = {c: [] for c in CATEGORIES}
    for op in sorted(names | policy.framework_ops(framework).names()):
        out[categorize(policy, framework, op).category].append(op)
    return out
