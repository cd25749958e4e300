"""Policy: everything that decides precision, as one immutable value.

A ``Policy`` is the low-precision dtype, the level (O0 fp32 baseline, O1 op
lists, O2 low-precision parameters with fp32 master weights), user overrides
of the op lists, the loss scale to start from, and whether fp16 is emulated.
The same policy (an object, a preset name or a TOML file) drives both
backends, so both make the same decisions.
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import AbstractSet, Any, Callable, Iterable, Mapping, Optional, Union

from .device import SPEEDS, auto_dtype
from .dtypes import POLICY_DTYPES as DTYPES
from .dtypes import dtype_name
from .errors import (AmpConfigError, ConflictingOpError, UnknownChoiceError, UnknownOpError,
                     check_choice, check_flag)
from .layers import LayerLists, LayerRule, layer_rule
from .oplists import CATEGORIES, FRAMEWORKS, canonical_ops, load_table
from .policyfile import (check_names, check_op_lists, check_policy_dict, check_rule,
                         dataclass_fields, framework_name_hint, read_toml)
from .scaler import (LOSS_SCALE_KINDS, DynamicLossScale, LossScale, NoOpLossScale,
                     StaticLossScale, loss_scale_from_config, loss_scale_from_parts)
from .loss_scale import FIELDS, LossScaleConfig, LossScaleState

LEVELS = ("O0", "O1", "O2", "OD")
DEFAULTS = ("shared", "native")  # the shared canonical lists, or each native's own defaults

# A conditional-fp32 rule, as in mxnet.contrib.amp: (op, attribute, values that force fp32).
ConditionalRule = tuple[str, str, tuple[str, ...]]


@dataclass(frozen=True)
class OpLists:
    """User overrides of the op categories, for canonical or for one framework's names.

    With ``replace=False`` (the default) they extend the defaults: a listed op
    moves to its new category. With ``replace=True`` the defaults of this level
    are dropped: for ``Policy.ops``, canonical ops not listed follow their
    inputs (framework-only names keep their native lists); for a framework's
    lists, its framework-only names not listed follow their inputs (names with
    a canonical op keep the canonical decision). ``replace`` may also name the
    default lists dropped (``{"lower"}``, ``{"fp32", "conditional_fp32"}``...),
    the others kept: MXNet's ``target_precision_ops=[...]`` replaces its default
    low list and only that one. Either way an op these lists name takes their
    category: a default list never overrides a listed op.
    """

    lower: frozenset[str] = frozenset()
    fp32: frozenset[str] = frozenset()
    promote: frozenset[str] = frozenset()
    follow: frozenset[str] = frozenset()
    conditional_fp32: tuple[ConditionalRule, ...] = ()
    replace: Union[bool, frozenset[str]] = False

    def __post_init__(self) -> None:
        if isinstance(self.replace, (list, tuple, set, frozenset)):  # the lists it names
            lists = (*CATEGORIES, "conditional_fp32")
            if not set(self.replace) <= set(lists):
                raise AmpConfigError(f"OpLists.replace must be true or false, or the set of "
                                     f"default lists it replaces (of {', '.join(lists)}), "
                                     f"got {self.replace!r}")
            object.__setattr__(self, "replace", frozenset(self.replace) or False)  # {}: none
        else:
            check_flag("OpLists.replace", self.replace,
                       also=f"or the set of default lists it replaces (of "
                            f"{', '.join((*CATEGORIES, 'conditional_fp32'))})")
        for cat in CATEGORIES:
            object.__setattr__(self, cat, frozenset(check_names(getattr(self, cat), "OpLists",
                                                                cat)))
        seen: dict[str, list[str]] = {}
        for cat in CATEGORIES:
            for name in getattr(self, cat):
                seen.setdefault(name, []).append(cat)
        for name, cats in sorted(seen.items()):
            if len(cats) > 1:
                raise ConflictingOpError(name, cats)
        if not isinstance(self.conditional_fp32, (list, tuple)):
            raise AmpConfigError(f"OpLists: conditional_fp32 = {self.conditional_fp32!r}: must "
                                 f"be a list of (op, attribute, [values]) rules")
        rules = [check_rule(r, "OpLists", f"conditional_fp32[{i}]")
                 for i, r in enumerate(self.conditional_fp32)]
        for op, _, _ in rules:
            if op in seen:  # an op in a list and in conditional_fp32: two answers
                raise ConflictingOpError(op, [*seen[op], "conditional_fp32"])
        object.__setattr__(self, "conditional_fp32", tuple(rules))

    def replaces(self, default_list: str) -> bool:
        """True if the defaults of ``default_list`` (a category or ``conditional_fp32``) are
        dropped (``replace``)."""
        return self.replace is True or (not isinstance(self.replace, bool)
                                        and default_list in self.replace)

    def category(self, name: str) -> Optional[str]:
        """The category this override puts ``name`` in, or None."""
        for cat in CATEGORIES:
            if name in getattr(self, cat):
                return cat
        return None

    def names(self) -> set[str]:
        return {n for cat in CATEGORIES for n in getattr(self, cat)} | {
            r[0] for r in self.conditional_fp32}

    def with_custom(self, custom: "OpLists") -> "OpLists":
        """These lists with a user's custom lists on top, as the native ``_update_list`` does
        to its defaults: an op ``custom`` names takes that list's category and leaves every
        other list here (a custom low op leaves the fp32 and promote lists, and the reverse,
        and a conditional-fp32 rule of these); the other entries and ``replace`` stay. The
        one rule, for a policy's overrides (``with_custom_lists``), Paddle's static live
        sets (``paddle_amp.lists``) and ``paddle.amp``'s own lists (the dygraph runtime)."""
        named = custom.names()
        if not named:
            return self
        lists = custom_over({cat: getattr(self, cat) for cat in CATEGORIES}, custom)
        rules = tuple(r for r in self.conditional_fp32 if r[0] not in named)
        return OpLists(**lists, conditional_fp32=rules, replace=self.replace)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str, canonical: bool = False) -> "OpLists":
        """Op lists from one ``[ops]`` / ``[ops.<framework>]`` table (checked first)."""
        return cls(**check_op_lists(d, where, "ops", canonical))


def custom_over(lists: Mapping[str, AbstractSet[str]],
                custom: OpLists) -> dict[str, frozenset[str]]:
    """``lists`` (category -> ops) with ``custom`` on top: each op ``custom`` names is in its
    list's category and in no other. The rule of ``OpLists.with_custom``, for lists that are
    not an ``OpLists`` yet (Paddle's static live sets, which may hold an op twice: their
    precedence decides there)."""
    named = custom.names()
    return {cat: (frozenset(ops) - named) | getattr(custom, cat) for cat, ops in lists.items()}


def with_custom_lists(policy: "Policy", framework: str, custom: OpLists) -> "Policy":
    """``policy`` with a user's custom op lists (a native API's ``custom_white_list`` /
    ``custom_black_list`` beside ``policy=``) on top of its ``framework`` overrides
    (``OpLists.with_custom``: a custom op takes its list's category and leaves the others).
    Paddle's runtimes apply it (static ``decorate``, dynamic-graph ``auto_cast``); MXNet's
    ``init`` refuses custom lists beside ``policy=`` (docs/mxnet.md): put them in the policy.

    ``custom`` is checked as any ``OpLists`` (an op in two custom lists is a
    ``ConflictingOpError``); with no names it returns ``policy`` itself."""
    if not custom.names():
        return policy
    ops = policy.framework_ops(framework)
    return policy.replace(**{f"{framework}_ops": ops.with_custom(custom)})


def default_loss_scale(dtype: str,
                       scaled: Callable[[], LossScale] = DynamicLossScale) -> LossScale:
    """The loss scale ``dtype`` gets when none is given: ``scaled()`` for float16, whose
    exponent range flushes small gradients to zero, and ``NoOpLossScale()`` for bfloat16 and
    float32, which share float32's range. ``scaled`` (default ``DynamicLossScale()``) lets a
    backend supply its native defaults (Paddle's ``init_loss_scaling``...); it is called only
    for float16."""
    return scaled() if dtype == "float16" else NoOpLossScale()


def _at_start(loss_scale: Any, dtype: str) -> LossScale:
    """A policy's loss scale: config only, shown as its value at the start of a run (the
    dtype's default for None). One that is mid-run (moved scale, counters) is refused: a
    run's state goes into the trainer/program (``load_state_dict``, ``load_checkpoint``)."""
    if loss_scale is None:
        return default_loss_scale(dtype)
    if isinstance(loss_scale, LossScaleConfig):  # the core record
        return loss_scale_from_parts(loss_scale)
    if not isinstance(loss_scale, (DynamicLossScale, StaticLossScale, NoOpLossScale)):
        raise AmpConfigError(
            f"Policy.loss_scale must be a DynamicLossScale, StaticLossScale, NoOpLossScale "
            f"or LossScaleConfig (or None for the dtype's default), got {loss_scale!r}")
    start = LossScaleState.initial(loss_scale.config)
    if loss_scale.state != start:
        field = next(f for f in FIELDS if getattr(loss_scale.state, f) != getattr(start, f))
        raise AmpConfigError(
            f"Policy.loss_scale holds the loss-scale config, not a run's state: "
            f"{type(loss_scale).__name__}.{field} = {getattr(loss_scale.state, field)!r} is "
            f"mid-run (a run starts at {getattr(start, field)!r}); pass the run's constants "
            f"(or its .config) and restore its state with load_state_dict/load_checkpoint")
    return loss_scale


@dataclass(frozen=True)
class Policy:
    """What runs in which precision, and how the loss is scaled.

    ``ops`` overrides canonical op names (shared by both frameworks);
    ``mxnet_ops`` / ``paddle_ops`` override that framework's op names and win
    over ``ops``. ``loss_scale`` defaults to dynamic scaling for float16 and
    none for bfloat16/float32; it is config (shown at the start of a run, the constants in
    ``loss_scale_config``): a mid-run loss scale is refused, its state goes to the trainer.
    ``emulate`` rounds through fp16 at op
    boundaries where the device has no fp16 kernel (labelled as emulation).

    ``defaults``: ``"shared"`` (the canonical lists, the same decisions in both
    frameworks) or ``"native"`` (each framework's installed native default
    lists, exactly: the presets ``mxnet-native`` / ``paddle-native``).
    ``unlisted``: the category of an op that no list names (None: follow for the
    shared lists, the native's rule for native ones; Paddle's ``use_promote``
    is ``"promote"``). ``use_promote``: at level O2, an op of category ``promote`` takes
    its widest input's dtype (float32 when a floating input is float32), as at O1, instead
    of O2's "every op not in fp32 runs low" (Paddle dygraph's ``use_promote=True``, its
    default: ``GetAmpDestDtype``). ``native_version`` pins the native version whose lists
    ``defaults="native"`` reads (default: the installed one). Level ``OD``: only
    ``lower`` ops run low precision, every other op runs in fp32 (Paddle's "OD").

    ``speed``: ``"fixed"`` (the lists decide, the same on every machine) or
    ``"measured"`` (an op the lists lower runs low only where its low kernel, casts
    included, was measured faster than float32 on this machine, by a margin beyond its
    timing's spread: ``device.speed_refusal``; an op without a timing recipe is not
    measured and stays float32; the preset ``"auto"``). ``profile``: a saved profile file
    (``amp-adapters profile --save``) whose measurements decide instead of this
    machine's, so the plan is the same on every rerun and every machine.

    ``layers``: op *instances* by name (``LayerLists``: ``fp32`` and ``lower`` name
    patterns; ``amp_adapters.rules.layers``), which win over every op-type list for the ops
    they cover: ``LayerLists(fp32={"dense2"})`` keeps that one layer in float32 and its
    siblings low. ``mxnet_layers`` / ``paddle_layers`` hold one framework's names and win
    over ``layers``.
    """

    dtype: str = "float16"
    level: str = "O1"
    ops: OpLists = field(default_factory=OpLists)
    mxnet_ops: OpLists = field(default_factory=OpLists)
    paddle_ops: OpLists = field(default_factory=OpLists)
    loss_scale: Optional[LossScale] = None
    emulate: bool = False
    defaults: str = "shared"
    unlisted: Optional[str] = None
    use_promote: bool = False
    native_version: Optional[str] = None
    speed: str = "fixed"
    profile: Optional[str] = None
    layers: LayerLists = field(default_factory=LayerLists)
    mxnet_layers: LayerLists = field(default_factory=LayerLists)
    paddle_layers: LayerLists = field(default_factory=LayerLists)

    def __post_init__(self) -> None:
        try:  # any spelling ('fp16', np.float16) becomes the one name
            object.__setattr__(self, "dtype", dtype_name(self.dtype))
        except AmpConfigError:
            pass
        if self.dtype not in DTYPES:
            raise UnknownChoiceError("dtype", self.dtype, DTYPES)
        if self.level not in LEVELS:
            raise UnknownChoiceError("level", self.level, LEVELS)
        if (self.dtype == "float32") != (self.level == "O0"):
            raise AmpConfigError(
                f"level {self.level!r} with dtype {self.dtype!r}: O0 is the float32 baseline "
                f"and needs dtype='float32'; O1/O2 need float16 or bfloat16")
        for name in ("ops", "mxnet_ops", "paddle_ops"):
            if not isinstance(getattr(self, name), OpLists):
                raise AmpConfigError(f"Policy.{name} must be an OpLists, "
                                     f"got {type(getattr(self, name)).__name__}")
        for name in ("layers", "mxnet_layers", "paddle_layers"):
            if not isinstance(getattr(self, name), LayerLists):
                raise AmpConfigError(f"Policy.{name} must be a LayerLists (fp32=..., "
                                     f"lower=... layer names), got "
                                     f"{type(getattr(self, name)).__name__}")
        unknown = sorted(self.ops.names() - canonical_ops())
        if unknown:
            raise UnknownOpError(unknown[0], "the canonical vocabulary (Policy.ops)",
                                 canonical_ops(), framework_name_hint(unknown[0]))
        if self.defaults not in DEFAULTS:
            raise UnknownChoiceError("Policy.defaults", self.defaults, DEFAULTS)
        if self.unlisted is not None and self.unlisted not in CATEGORIES:
            raise UnknownChoiceError("Policy.unlisted", self.unlisted, CATEGORIES)
        check_flag("Policy.emulate", self.emulate)
        check_flag("Policy.use_promote", self.use_promote)
        if self.speed not in SPEEDS:
            raise UnknownChoiceError("Policy.speed", self.speed, SPEEDS)
        if self.profile is not None:
            if not isinstance(self.profile, (str, os.PathLike)) or not os.fspath(self.profile):
                raise AmpConfigError(f"Policy.profile must be the path of a profile file "
                                     f"(amp-adapters profile --save PATH), got "
                                     f"{self.profile!r}")
            if self.speed != "measured":
                raise AmpConfigError(f"Policy.profile = {os.fspath(self.profile)!r} with "
                                     f"speed = {self.speed!r}: a profile holds measured speed; "
                                     f"set speed = \"measured\" (or preset = \"auto\") to "
                                     f"use it")
            object.__setattr__(self, "profile", os.fspath(self.profile))
        object.__setattr__(self, "loss_scale", _at_start(self.loss_scale, self.dtype))

    @property
    def loss_scale_config(self) -> LossScaleConfig:
        """The loss-scale constants this policy holds (``loss_scale`` is them at their start)."""
        return self.loss_scale.config  # type: ignore[union-attr]

    @property
    def enabled(self) -> bool:
        """False for the O0 fp32 baseline: no casts, no scaling."""
        return self.level != "O0"

    def framework_ops(self, framework: str) -> OpLists:
        """The overrides of ``framework``'s own op names."""
        if framework not in FRAMEWORKS:
            raise UnknownChoiceError("framework", framework, FRAMEWORKS)
        return getattr(self, f"{framework}_ops")

    def framework_layers(self, framework: str) -> LayerLists:
        """The layer rules of ``framework``'s own instance names."""
        if framework not in FRAMEWORKS:
            raise UnknownChoiceError("framework", framework, FRAMEWORKS)
        return getattr(self, f"{framework}_layers")

    def layer_patterns(self, framework: str) -> frozenset[str]:
        """Every layer pattern that applies in ``framework`` (its table and the canonical)."""
        return self.framework_layers(framework).names() | self.layers.names()

    def layer_rule(self, framework: str, instance: Any) -> Optional[LayerRule]:
        """The layer rule deciding the op instance named ``instance`` (a name or all its
        names) in ``framework``, or None; ``amp_adapters.rules.layers`` has the matching rule."""
        if not (self.layers or self.framework_layers(framework)):
            return None
        return layer_rule(((f"{framework}_layers", self.framework_layers(framework)),
                           ("layers", self.layers)), instance)

    def validate_for(self, framework: str, registry: Optional[Iterable[str]] = None) -> None:
        """Check ``framework``'s override names against its live op ``registry``.

        Backends call this with the framework's registered op names; without a
        registry the names are checked against the op table.
        """
        table = load_table(framework)
        known = set(registry) if registry is not None else set(table.names)
        for name in sorted(self.framework_ops(framework).names()):
            if name not in known:
                raise UnknownOpError(name, f"{framework} (Policy.{framework}_ops)", known)

    def with_emulation(self, emulate: bool) -> "Policy":
        """This policy with emulation on if ``emulate`` is true: a drop-in's ``emulate=``
        argument adds to the policy's own setting and never turns it off. ``emulate`` must be
        a bool (``FlagError``, a ``TypeError``: ``"false"`` is no way to say False)."""
        check_flag("emulate", emulate)
        return self.replace(emulate=True) if emulate and not self.emulate else self

    def replace(self, **changes: Any) -> "Policy":
        """A copy with ``changes`` applied (validated like a new policy)."""
        return dataclasses.replace(self, **changes)

    @classmethod
    def preset(cls, name: str, *, device_type: Optional[str] = None,
               **changes: Any) -> "Policy":
        """A named policy: O0, O1, O1-bf16, O2, O2-bf16, mxnet-native, paddle-native, auto
        (``changes`` override its fields). ``device_type``: the device ``"auto"`` picks its
        dtype for (``preset_fields``; None: a CPU); an explicit ``dtype=`` wins."""
        return cls(**{**preset_fields(name, device_type), **changes})

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str = "policy",
                  base: "Optional[str | Path]" = None, *,
                  device_type: Optional[str] = None) -> "Policy":
        """A policy from the structure of a policy file (see ``from_file``).

        The whole structure is checked first (``policyfile.check_policy_dict``): a
        wrong type, an unknown key or value is an ``AmpConfigError`` naming
        ``where``, the key path and the value, and nothing is built. A relative
        ``profile`` path is read from the folder of ``base`` (the policy file). ``preset =
        "auto"`` takes its dtype for ``device_type`` (``preset_fields``) unless the file
        says ``dtype``."""
        checked = check_policy_dict(d, where, PRESETS, DTYPES, LEVELS, _LOSS_SCALE_FIELDS)
        kw: dict[str, Any] = (preset_fields(checked.pop("preset"), device_type)
                              if "preset" in checked else {})
        ops = checked.pop("ops", {})
        for fw in FRAMEWORKS:
            if fw in ops:
                kw[f"{fw}_ops"] = OpLists(**ops[fw])
        if "ops" in ops:
            kw["ops"] = OpLists(**ops["ops"])
        layers = checked.pop("layers", {})
        for key, lists in layers.items():
            kw["layers" if key == "layers" else f"{key}_layers"] = LayerLists(**lists)
        if "loss_scale" in checked:
            table = dict(checked.pop("loss_scale"))
            try:
                kw["loss_scale"] = loss_scale_from_config(table)
            except AmpConfigError as e:
                raise AmpConfigError(f"{where}: [loss_scale]: {e}") from None
        if "profile" in checked and base is not None:  # relative to the policy file
            checked["profile"] = str(Path(base).parent / checked["profile"])
        kw.update(checked)
        try:
            return cls(**kw)
        except AmpConfigError as e:
            raise AmpConfigError(f"{where}: {e}") from None

    @classmethod
    def from_file(cls, path: "str | Path", *,
                  device_type: Optional[str] = None) -> "Policy":
        """Load a TOML policy file; one file drives both frameworks.

        ```toml
        preset = "O1"            # optional starting point
        dtype = "float16"        # float16 | bfloat16 | float32
        level = "O1"             # O0 | O1 | O2
        emulate = false
        speed = "fixed"          # fixed | measured (a low kernel must be faster here)
        profile = "cpu.json"     # measured speed replayed from a saved profile
        [ops]                    # canonical names: lower, fp32, promote, follow, replace
        fp32 = ["matmul"]
        [ops.mxnet]              # MXNet op names (same keys, plus conditional_fp32)
        [ops.paddle]             # Paddle op names
        [layers]                 # op instances by name: fp32 = [...], lower = [...]
        fp32 = ["dense2"]        # a prefix covers dense2_fwd, its backward, its casts
        [layers.mxnet]           # one framework's instance names (win over [layers])
        [layers.paddle]
        [loss_scale]             # kind = dynamic | static | none, plus the scaler fields
        init_scale = 65536
        ```

        Every problem (no such file, not UTF-8, not TOML, a duplicate key, a wrong
        type or name) is an ``AmpConfigError`` naming the file and the key.
        ``device_type``: the device ``preset = "auto"`` picks its dtype for (``preset_fields``).
        """
        data, where = read_toml(path)
        return cls.from_dict(data, where=where, base=path, device_type=device_type)


_LOSS_SCALE_FIELDS = {kind: dataclass_fields(c) for kind, c in LOSS_SCALE_KINDS.items()}

PRESETS: dict[str, dict[str, Any]] = {
    "O0": {"dtype": "float32", "level": "O0"},
    "O1": {"dtype": "float16", "level": "O1"},
    "O1-bf16": {"dtype": "bfloat16", "level": "O1"},
    "O2": {"dtype": "float16", "level": "O2"},
    "O2-bf16": {"dtype": "bfloat16", "level": "O2"},
    # the installed native's default lists, exactly, in whichever framework runs the policy:
    # what a drop-in uses without policy= (the two names are one policy value)
    "mxnet-native": {"dtype": "float16", "level": "O1", "defaults": "native"},
    "paddle-native": {"dtype": "float16", "level": "O1", "defaults": "native"},
    # the low dtype this device runs fast (device.auto_dtype: fp16 on a GPU, bf16 on a CPU;
    # preset_fields sets it), O1 lists, and only where it was measured faster here
    "auto": {"level": "O1", "speed": "measured"},
}
AUTO = "auto"  # the preset whose dtype is the device's (preset_fields)


def preset_fields(name: str, device_type: Optional[str] = None) -> dict[str, Any]:
    """The fields of preset ``name`` on a device of ``device_type``: ``PRESETS[name]``, and
    for ``"auto"`` the dtype that device runs fast (``device.auto_dtype``: float16 on a GPU,
    bfloat16 on a CPU). None: the device is not known, taken as a CPU (the core has no
    framework to ask; each backend passes its own answer). The one place the preset
    ``"auto"`` gets its dtype: ``Policy.preset``, a policy file's ``preset = "auto"`` and
    ``resolve_policy`` all come here, and a dtype given beside it wins."""
    check_choice("preset", name, PRESETS)
    fields = dict(PRESETS[name])
    if name == AUTO:
        fields["dtype"] = auto_dtype("cpu" if device_type is None else device_type)
    return fields

PolicyLike = Union[Policy, str, "os.PathLike[str]"]


def resolve_policy(policy: "PolicyLike", *, device_type: Optional[str] = None,
                   **changes: Any) -> Policy:
    """THE front door for ``policy=`` in every backend: a ``Policy``, a preset name
    (``"O1"``, ``"mxnet-native"``...) or a TOML policy file path; ``changes``
    (e.g. ``dtype=...``) are applied on top. ``device_type``: the device the policy runs
    on, as the backend's framework answers it (``"cpu"``, ``"gpu"``, ``"gpu:0"``; None: a
    CPU), which the preset ``"auto"`` (by name, or a file's ``preset``) takes its dtype
    from (``preset_fields``); a ``Policy`` object, a file's ``dtype`` or ``dtype=`` here
    win. Anything else is an error that says what is accepted."""
    if isinstance(policy, Policy):
        resolved = policy
    elif isinstance(policy, (str, os.PathLike)):
        text = os.fspath(policy)
        if text in PRESETS:  # changes before construction: a dtype= gets its own loss scale
            return Policy.preset(text, device_type=device_type, **changes)
        elif text.endswith(".toml") or os.path.sep in text or os.path.exists(text):
            resolved = Policy.from_file(text, device_type=device_type)
        else:
            hint = str(UnknownChoiceError("preset", text, tuple(PRESETS)))
            raise AmpConfigError(f"policy file {text!r} does not exist, and it is no preset "
                                 f"name either: {hint}")
    else:
        raise TypeError(f"policy= must be a Policy, a preset name ({', '.join(PRESETS)}) "
                        f"or a TOML file path, got {type(policy).__name__}")
    return resolved.replace(**changes) if changes else resolved
