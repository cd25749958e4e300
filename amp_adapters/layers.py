"""Per-layer precision: op instances a policy keeps in float32 (or runs low) by name.

``Policy.layers`` (canonical: one name for both frameworks) and
``Policy.mxnet_layers`` / ``Policy.paddle_layers`` (where a layer has a different
name in each) hold name patterns in two lists, ``fp32`` and ``lower``. An op
instance has one or more names, which its backend gives ``plan_op`` as
``instance=``: in MXNet its symbol node name (``dense2_fwd``) or, for an
imperative call, the names of the Gluon blocks being called (``dense2``); in
Paddle its output variables (``linear_2.tmp_0``), its parameters
(``linear_2.w_0``) and its name scope.

A pattern matches a name that equals it or that starts with it followed by a
separator (``_ . / - :``), or (ending in a separator itself) any name it starts:
``dense2`` covers ``dense2_fwd``, its backward and the casts around it, but not
``dense20_fwd``. A pattern with ``*``, ``?`` or ``[`` is a shell glob over the
whole name. Among the patterns that match, the framework's table wins over the
canonical one, and within a table the longest (most specific) pattern decides.

Pure functions and a frozen dataclass; no framework.
"""
from __future__ import annotations

import fnmatch
import warnings
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Optional, Sequence, Union

from .errors import AmpConfigError, close_matches

LAYER_CATEGORIES = ("fp32", "lower")
SEPARATORS = "_./-:"
_GLOB = "*?["

# what a backend hands plan_op: one name, or every name the instance has
Instance = Union[str, Sequence[str], None]


def _fail(where: str, path: str, value: Any, what: str) -> AmpConfigError:
    shown = repr(value)
    if len(shown) > 60:
        shown = shown[:57] + "..."
    return AmpConfigError(f"{where}: {path} = {shown}: {what}")


def check_layer_names(value: Any, where: str, path: str) -> frozenset[str]:
    """A list of layer name patterns (any collection but a string or mapping), each a
    non-empty string without spaces."""
    if isinstance(value, str):
        raise _fail(where, path, value, f"must be a list of layer names; write [{value!r}]")
    if isinstance(value, Mapping) or not isinstance(value, Iterable):
        raise _fail(where, path, value, "must be a list of layer names (op instance names "
                    "or their prefixes), e.g. ['dense2']")
    out = []
    for i, name in enumerate(value):
        if not isinstance(name, str) or not name or name != name.strip() or " " in name:
            raise _fail(where, f"{path}[{i}]", name, "must be a layer name (a non-empty "
                        "string without spaces: an op instance's name or a prefix of it, "
                        "e.g. 'dense2')")
        out.append(name)
    return frozenset(out)


@dataclass(frozen=True)
class LayerLists:
    """Op instances by name pattern: ``fp32`` (kept in float32 whatever their op type's
    list says) and ``lower`` (run in the low dtype). A pattern in both is an error."""

    fp32: frozenset[str] = frozenset()
    lower: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        for cat in LAYER_CATEGORIES:
            object.__setattr__(self, cat, check_layer_names(getattr(self, cat), "LayerLists",
                                                            cat))
        both = sorted(self.fp32 & self.lower)
        if both:
            raise AmpConfigError(f"LayerLists: layer {both[0]!r} is listed in both fp32 and "
                                 f"lower; keep it in one list")

    def __bool__(self) -> bool:
        return bool(self.fp32 or self.lower)

    def names(self) -> frozenset[str]:
        return self.fp32 | self.lower

    def with_fp32(self, names: Iterable[str]) -> "LayerLists":
        """These lists with ``names`` added to fp32 (and taken out of lower)."""
        names = frozenset(names)
        return LayerLists(fp32=self.fp32 | names, lower=self.lower - names)


def check_layer_lists(value: Any, where: str, path: str) -> dict[str, frozenset[str]]:
    """One ``[layers]`` / ``[layers.<framework>]`` table as ``LayerLists`` keyword arguments:
    only ``fp32`` and ``lower``, lists of names, no name in both."""
    if not isinstance(value, Mapping):
        raise _fail(where, path, value, f"must be a table ([{path}] with fp32 = [...], "
                    f"lower = [...])")
    for key in value:
        if key not in LAYER_CATEGORIES:
            hits = close_matches(str(key), LAYER_CATEGORIES)
            hint = f"; did you mean {', '.join(map(repr, hits))}?" if hits else ""
            raise AmpConfigError(f"{where}: unknown key {key!r} in {path}{hint} (allowed: "
                                 f"{', '.join(LAYER_CATEGORIES)})")
    out = {cat: check_layer_names(value[cat], where, f"{path}.{cat}")
           for cat in LAYER_CATEGORIES if cat in value}
    both = sorted(out.get("fp32", frozenset()) & out.get("lower", frozenset()))
    if both:
        i = list(value["lower"]).index(both[0])
        raise _fail(where, f"{path}.lower[{i}]", both[0], f"already listed in {path}.fp32; "
                    f"a layer runs in one precision: keep it in one list")
    return out


def matches(pattern: str, name: str) -> bool:
    """True if layer ``pattern`` covers the op instance name ``name`` (module docstring)."""
    if any(c in pattern for c in _GLOB):
        return fnmatch.fnmatchcase(name, pattern)
    if not name.startswith(pattern):
        return False
    return (len(name) == len(pattern) or pattern[-1] in SEPARATORS
            or name[len(pattern)] in SEPARATORS)


def _names(instance: Instance) -> tuple[str, ...]:
    if instance is None:
        return ()
    if isinstance(instance, str):
        return (instance,)
    return tuple(n for n in instance if isinstance(n, str) and n)


@dataclass(frozen=True)
class LayerRule:
    """The layer rule that decides an op instance: its ``category`` (fp32 | lower), the
    ``pattern`` and the ``table`` (``layers``, ``mxnet_layers``...) it is listed in, the
    instance ``name`` it matched."""

    category: str
    pattern: str
    table: str
    name: str

    @property
    def reason(self) -> str:
        via = "" if self.name == self.pattern else f" (matches {self.name!r})"
        return f"layer {self.pattern!r} listed in Policy.{self.table}.{self.category}{via}"


def layer_rule(tables: Sequence[tuple[str, LayerLists]],
               instance: Instance) -> Optional[LayerRule]:
    """The rule of the first table (``(name, lists)``, most specific table first) with a
    pattern covering one of ``instance``'s names: its longest such pattern. None: no rule."""
    names = _names(instance)
    if not names:
        return None
    for table, lists in tables:
        if not lists:
            continue
        hits = [LayerRule(cat, pattern, table, name) for cat in LAYER_CATEGORIES
                for pattern in getattr(lists, cat) for name in names if matches(pattern, name)]
        if hits:  # the longest pattern; a tie goes to the first in alphabetical order
            return min(hits, key=lambda r: (-len(r.pattern), r.pattern))
    return None


def unmatched(patterns: Iterable[str], names: Iterable[str],
              n: int = 3) -> list[tuple[str, list[str]]]:
    """[(pattern, the closest names the model has)] for each pattern covering none of
    ``names`` (the model's op instance names): what ``warn_unmatched`` reports."""
    names = sorted(set(names))
    stems = sorted({st for nm in names for st in _stems(nm)})
    out = []
    for pattern in sorted(set(patterns)):
        if any(matches(pattern, name) for name in names):
            continue
        out.append((pattern, close_matches(pattern, stems, n) or stems[:n]))
    return out


def _stems(name: str) -> list[str]:
    """The layer names a pattern could use for ``name``: the name and each part of it up to a
    separator (``dense2.w_0`` -> ``dense2``, ``dense2.w``, ``dense2.w_0``)."""
    return [name[:i] for i in range(1, len(name)) if name[i] in SEPARATORS] + [name]


class UnmatchedLayerWarning(UserWarning):
    """A policy's layer rule names no op instance of the model it ran on."""


def warn_unmatched(patterns: Iterable[str], names: Iterable[str], where: str,
                   stacklevel: int = 3) -> list[tuple[str, list[str]]]:
    """Warn once per pattern of ``patterns`` that covers none of ``names`` (the op instance
    names of the graph ``where`` describes), naming the closest names it has. A warning,
    not an error: a policy file is written before the graph exists, and may serve
    several models. Returns what it warned about."""
    missing = unmatched(patterns, names)
    for pattern, close in missing:
        hint = (f"; the closest names it has: {', '.join(map(repr, close))}" if close
                else "; it has no named ops")
        warnings.warn(f"layer {pattern!r} of the policy matches no op of {where}{hint} "
                      f"(a layer rule covers names equal to it or starting with it and a "
                      f"separator: _ . / - :)", UnmatchedLayerWarning, stacklevel=stacklevel)
    return missing
