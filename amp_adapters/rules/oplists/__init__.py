"""Op lists as data: the canonical vocabulary and each framework's table of op names.

``canonical.toml`` gives every canonical op (matmul, softmax, ...) one default
category for float16, and for bfloat16 only where it differs from float16. ``mxnet.toml`` and
``paddle.toml`` map
framework op names onto canonical names, keep the native lists' category for
framework-only names, and say which inputs are never cast and which outputs
stay fp32. Loading is cached;
the tables are immutable.
"""
from __future__ import annotations

import functools
import tomllib
from dataclasses import dataclass
from importlib import resources
from types import MappingProxyType
from typing import Mapping, Optional

from ..dtypes import LOW_DTYPES
from ..errors import AmpConfigError, UnknownChoiceError

CATEGORIES = ("lower", "fp32", "promote", "follow")
FRAMEWORKS = ("mxnet", "paddle")


def _read(name: str) -> dict:
    return tomllib.loads(resources.files(__name__).joinpath(name).read_text("utf-8"))


def _categories(table: Mapping[str, list], where: str) -> Mapping[str, str]:
    """{category: [names]} -> {name: category}; a name in two categories is an error."""
    out: dict[str, str] = {}
    for category, names in table.items():
        if category not in CATEGORIES:
            raise UnknownChoiceError(f"category in {where}", category, CATEGORIES)
        for name in names:
            if name in out:
                raise AmpConfigError(f"{where}: {name!r} is in both {out[name]} and {category}")
            out[name] = category
    return MappingProxyType(out)


@functools.lru_cache(maxsize=None)
def canonical_defaults(dtype: str) -> Mapping[str, str]:
    """{canonical op: default category} for ``dtype`` (float16 or bfloat16)."""
    if dtype not in LOW_DTYPES:
        raise UnknownChoiceError("low-precision dtype", dtype, LOW_DTYPES)
    tables = _read("canonical.toml")
    base = _categories(tables["float16"], "canonical.toml [float16]")
    if dtype == "float16":
        return base
    changed = _categories(tables.get(dtype, {}), f"canonical.toml [{dtype}]")
    unknown = sorted(set(changed) - set(base))
    if unknown:
        raise AmpConfigError(f"canonical.toml [{dtype}]: {unknown[0]!r} is no canonical op "
                             f"(every canonical op is declared in [float16])")
    return MappingProxyType({op: changed.get(op, category) for op, category in base.items()})


def canonical_ops() -> frozenset[str]:
    """Every canonical op name."""
    return frozenset(canonical_defaults("float16"))


@functools.lru_cache(maxsize=None)
def pass_through_ops() -> frozenset[str]:
    """The canonical ops that only move values (reshape, transpose, ...): no arithmetic."""
    ops = frozenset(_read("canonical.toml").get("pass_through", {}).get("ops", ()))
    unknown = sorted(ops - canonical_ops())
    if unknown:
        raise AmpConfigError(f"canonical.toml [pass_through]: {unknown[0]!r} is no canonical op")
    return ops


def passes_through(framework: str, op: str, attrs: Optional[Mapping[str, object]] = None) -> bool:
    """Whether ``framework``'s ``op`` only moves values (see ``pass_through_ops``)."""
    return load_table(framework).canonical(op, attrs) in pass_through_ops()


@dataclass(frozen=True)
class Conditional:
    """``op`` is the canonical op ``values[attrs[attr]]`` (e.g. Activation softrelu = softplus)."""

    attr: str
    values: Mapping[str, str]


@dataclass(frozen=True)
class OpTable:
    """One framework's op names, as the core sees them."""

    framework: str
    canonical_of: Mapping[str, str]                # op -> canonical op
    conditional: Mapping[str, Conditional]         # op -> attribute rule
    keep_fp32_inputs: Mapping[str, tuple[str, ...]]
    keep_fp32_outputs: Mapping[str, tuple[str, ...]]
    native: Mapping[str, Mapping[str, str]]        # dtype -> {framework-only op: category}
    unregistered: frozenset[str]                   # listed natively, absent from a CPU registry

    @property
    def names(self) -> frozenset[str]:
        """Every op name this table knows."""
        native = {n for d in self.native.values() for n in d}
        return frozenset(self.canonical_of) | frozenset(self.conditional) | native

    def canonical(self, op: str, attrs: Optional[Mapping[str, object]] = None) -> Optional[str]:
        """The canonical name of ``op`` given its attributes, or None if it has none."""
        rule = self.conditional.get(op)
        if rule is not None and attrs is not None:
            value = attrs.get(rule.attr)
            if value is not None and str(value) in rule.values:
                return rule.values[str(value)]
        return self.canonical_of.get(op)


@functools.lru_cache(maxsize=None)
def load_table(framework: str) -> OpTable:
    """The op table of ``framework`` (``mxnet`` or ``paddle``)."""
    if framework not in FRAMEWORKS:
        raise UnknownChoiceError("framework", framework, FRAMEWORKS)
    raw = _read(f"{framework}.toml")
    known = canonical_ops()
    canonical_of: dict[str, str] = {}
    for canon, names in raw["canonical"].items():
        if canon not in known:
            raise AmpConfigError(f"{framework}.toml maps {names} to unknown canonical op {canon!r}")
        for name in names:
            if name in canonical_of:
                raise AmpConfigError(f"{framework}.toml maps {name!r} twice")
            canonical_of[name] = canon
    conditional = {op: Conditional(rule["attr"], MappingProxyType(dict(rule["values"])))
                   for op, rule in raw.get("conditional", {}).items()}
    for op, rule in conditional.items():
        bad = sorted(set(rule.values.values()) - known)
        if bad:
            raise AmpConfigError(f"{framework}.toml: conditional {op} names unknown ops {bad}")
    return OpTable(
        framework=framework,
        canonical_of=MappingProxyType(canonical_of),
        conditional=MappingProxyType(conditional),
        keep_fp32_inputs=MappingProxyType(
            {op: tuple(slots) for op, slots in raw.get("keep_fp32_inputs", {}).items()}),
        keep_fp32_outputs=MappingProxyType(
            {op: tuple(slots) for op, slots in raw.get("keep_fp32_outputs", {}).items()}),
        native=MappingProxyType({
            dtype: _categories(cats, f"{framework}.toml [native.{dtype}]")
            for dtype, cats in raw["native"].items()}),
        unregistered=frozenset(raw.get("unregistered", {}).get("names", ())),
    )


# The distributions whose installed version picks the native preset's lists (read from
# package metadata: the core never imports a framework).
_DISTRIBUTIONS = {"mxnet": ("mxnet", "mxnet-cu112", "mxnet-cu117"),
                  "paddle": ("paddlepaddle", "paddlepaddle-gpu")}


@dataclass(frozen=True)
class NativeLists:
    """One native's default op lists, exactly (the data of ``mxnet-native``/``paddle-native``).

    ``lower``/``fp32``/``promote``/``follow``: MXNet's FP16 (BF16), FP32,
    WIDEST_TYPE_CASTS and FP16_FP32 lists, or Paddle's white, black and gray
    sets. ``unlisted``: the category of an op in no list (MXNet leaves it to its
    inputs; Paddle's O1 rewrite runs it in fp32). A name in two lists takes the
    first of fp32 > lower > promote > follow (Paddle's precedence).
    """

    framework: str
    version: str
    dtype: str
    lower: frozenset[str]
    fp32: frozenset[str]
    promote: frozenset[str]
    follow: frozenset[str]
    unlisted: str
    conditional_fp32: tuple[tuple[str, str, tuple[str, ...]], ...]
    loss_output: tuple[str, ...]
    fp32_params: Mapping[str, tuple[str, ...]]
    initializers: frozenset[str] = frozenset()
    o2_fp32: Optional[frozenset[str]] = None  # Paddle O2 keeps only these black ops fp32

    @property
    def names(self) -> frozenset[str]:
        return self.lower | self.fp32 | self.promote | self.follow

    def category(self, op: str) -> Optional[str]:
        """The native list ``op`` is in (by precedence), or None."""
        for cat in ("fp32", "lower", "promote", "follow"):
            if op in getattr(self, cat):
                return cat
        return None


def installed_version(framework: str) -> Optional[str]:
    """The installed version of ``framework`` from package metadata (no import), or None."""
    from importlib import metadata
    for dist in _DISTRIBUTIONS[framework]:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


def native_versions(framework: str) -> tuple[str, ...]:
    """The versions of ``framework`` whose native lists the data holds, oldest first."""
    if framework not in FRAMEWORKS:
        raise UnknownChoiceError("framework", framework, FRAMEWORKS)
    return tuple(sorted(_read("native.toml")[framework], key=_version_key))


def _version_key(v: str) -> tuple:
    return tuple(int(p) if p.isdigit() else 0 for p in v.split(".")[:3])


def pick_version(framework: str, version: Optional[str] = None) -> str:
    """The data's version for ``version`` (default: the installed one): the newest known
    version not newer than it, else the oldest; the newest when nothing is installed."""
    known = native_versions(framework)
    version = version or installed_version(framework)
    if version is None:
        return known[-1]
    older = [v for v in known if _version_key(v) <= _version_key(version)]
    return older[-1] if older else known[0]


@functools.lru_cache(maxsize=None)
def native_lists(framework: str, dtype: str, version: Optional[str] = None) -> NativeLists:
    """The native default lists of ``framework`` for ``dtype`` (``bfloat16-lists``: Paddle's
    ``AutoMixedPrecisionListsBF16``), for ``version`` (default: the installed version)."""
    if dtype not in (*LOW_DTYPES, "bfloat16-lists"):
        raise UnknownChoiceError("low-precision dtype", dtype, LOW_DTYPES)
    picked = pick_version(framework, version)
    raw = _read("native.toml")[framework][picked]
    if dtype not in raw:
        raise UnknownChoiceError(f"{framework} {picked} native lists", dtype, tuple(raw))
    d = raw[dtype]
    return NativeLists(
        framework=framework, version=picked, dtype=dtype,
        lower=frozenset(d["lower"]), fp32=frozenset(d["fp32"]),
        promote=frozenset(d["promote"]), follow=frozenset(d["follow"]),
        unlisted=d["unlisted"],
        conditional_fp32=tuple((r["op"], r["attr"], tuple(r["values"]))
                               for r in d["conditional_fp32"]),
        loss_output=tuple(d.get("loss_output", ())),
        fp32_params=MappingProxyType({k: tuple(v) for k, v in d["fp32_params"].items()}),
        initializers=frozenset(d.get("initializers", ())),
        o2_fp32=frozenset(d["o2_fp32"]) if "o2_fp32" in d else None)


@functools.lru_cache(maxsize=None)
def eager_to_program() -> Mapping[str, str]:
    """{Paddle eager op name: its program op name} for the names that differ (``matmul`` ->
    ``matmul_v2``, ``add`` -> ``elementwise_add``): the one table ``paddle_amp.dygraph``
    translates an eager op with before it asks the planner, which speaks program names."""
    table = _read("paddle_dygraph.toml")["eager_to_program"]
    bad = sorted(k for k, v in table.items() if not (isinstance(v, str) and v))
    if bad:
        raise AmpConfigError(f"paddle_dygraph.toml [eager_to_program]: {bad[0]!r} must map to "
                             f"a program op name")
    return MappingProxyType(dict(table))


def dygraph_versions() -> tuple[str, ...]:
    """The Paddle versions whose ``paddle.amp`` (dygraph) lists the data holds, oldest first."""
    return tuple(sorted(_read("paddle_dygraph.toml")["native"], key=_version_key))


@functools.lru_cache(maxsize=None)
def dygraph_native_lists(dtype: str, version: Optional[str] = None) -> NativeLists:
    """``paddle.amp``'s own dygraph lists at O1 for ``dtype`` (``paddle_dygraph.toml``
    [native]), for ``version`` (default: the installed Paddle; the newest known version not
    newer than it), each name in both spellings (an eager name and its program name:
    ``eager_to_program``). An op in no list promotes (``unlisted``)."""
    if dtype not in LOW_DTYPES:
        raise UnknownChoiceError("low-precision dtype", dtype, LOW_DTYPES)
    known = dygraph_versions()
    version = version or installed_version("paddle")
    older = [v for v in known if version is not None and _version_key(v) <= _version_key(version)]
    picked = older[-1] if older else (known[-1] if version is None else known[0])
    raw = _read("paddle_dygraph.toml")["native"][picked][dtype]
    spell = eager_to_program()
    both = lambda names: frozenset(m for n in names for m in (n, spell.get(n, n)))  # noqa: E731
    fp32 = both(raw["fp32"])
    return NativeLists(framework="paddle", version=picked, dtype=dtype,
                       lower=both(raw["lower"]) - fp32, fp32=fp32, promote=frozenset(),
                       follow=frozenset(), unlisted="promote", conditional_fp32=(),
                       loss_output=(), fp32_params=MappingProxyType({}))
