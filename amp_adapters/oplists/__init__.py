"""Op lists as data: the canonical vocabulary and each framework's table of op names.

``canonical.toml`` gives every canonical op (matmul, softmax, ...) one default
category per low-precision dtype. ``mxnet.toml`` and ``paddle.toml`` map
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
    return _categories(_read("canonical.toml")[dtype], f"canonical.toml [{dtype}]")


def canonical_ops() -> frozenset[str]:
    """Every canonical op name."""
    return frozenset(canonical_defaults("float16"))


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
