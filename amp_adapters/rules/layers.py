"""Per-layer precision: op instances a policy keeps in float32 (or runs low) by name.

``Policy.layers`` (canonical: one name for both frameworks) and
``Policy.mxnet_layers`` / ``Policy.paddle_layers`` (where a layer has a different
name in each) hold name patterns in two lists, ``fp32`` and ``lower``. An op
instance has one or more names, which its backend gives ``plan_op`` as
``instance=``. The name to write is the layer's **path**: the child names from the
model's root block or layer to it, joined by ``.`` (``2`` for a Sequential's third
child, ``encoder.layers.3.ffn``; ``layer_paths``), the same in every build and
every process. The frameworks' own names, which come from process-wide counters,
keep matching too: in MXNet a symbol node name (``dense2_fwd``) or the names of the
Gluon blocks being called (``dense2``); in Paddle the output variables
(``linear_2.tmp_0``), the parameters (``linear_2.w_0``) and the name scope.

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
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Optional, Sequence, Union

from .configcheck import check_keys, check_name_list, check_table, fail
from .errors import AmpConfigError, close_matches

LAYER_CATEGORIES = ("fp32", "lower")
SEPARATORS = "_./-:"
_GLOB = "*?["

# what a backend hands plan_op: one name, or every name the instance has
Instance = Union[str, Sequence[str], None]


def check_layer_names(value: Any, where: str, path: str) -> frozenset[str]:
    """A list of layer name patterns (any collection but a string or mapping), each a
    non-empty string without spaces."""
    return frozenset(_layer_names(value, where, path))


def _layer_names(value: Any, where: str, path: str) -> list[str]:
    return check_name_list(
        value, where, path, "layer names", "'dense2'",
        "a layer name (a non-empty string without spaces: a layer's path from the model's "
        "root, e.g. '2' or 'encoder.layers.3.ffn', or an op instance's name or a prefix of "
        "it, e.g. 'dense2')", valid=lambda n: bool(n) and n == n.strip() and " " not in n,
        means=" (layer paths, op instance names or their prefixes)")


def _one_precision(fp32: Iterable[str], lower: Iterable[str], where: str,
                   path: Optional[str]) -> None:
    """The rule between the two lists: a layer runs in one precision, so no pattern is in
    both (the first such, alphabetically, is named). ``path``: the table's key path in a
    policy file, where ``lower`` is the file's list (the error names the entry's key and
    position); None for ``LayerLists``' own fields."""
    both = sorted(frozenset(fp32) & frozenset(lower))
    if not both:
        return
    if path is None:
        raise AmpConfigError(f"{where}: layer {both[0]!r} is listed in both fp32 and lower; "
                             f"keep it in one list")
    raise fail(where, f"{path}.lower[{list(lower).index(both[0])}]", both[0],
               f"already listed in {path}.fp32; a layer runs in one precision: keep it in "
               f"one list")


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
        _one_precision(self.fp32, self.lower, "LayerLists", None)

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
    d = check_table(value, where, path, f"[{path}] with fp32 = [...], lower = [...]")
    check_keys(d, LAYER_CATEGORIES, where, path)
    given = {cat: _layer_names(d[cat], where, f"{path}.{cat}")
             for cat in LAYER_CATEGORIES if cat in d}
    _one_precision(given.get("fp32", ()), given.get("lower", ()), where, path)
    return {cat: frozenset(names) for cat, names in given.items()}


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


def layer_paths(root: Any, children: Callable[[Any], Iterable[tuple[str, Any]]]
                ) -> dict[int, str]:
    """{id(layer): its path} for ``root`` and every layer under it: the names ``children``
    gives (``(child name, child)`` pairs, in order) from ``root`` down, joined by ``.``;
    ``root`` itself is ``""``. A layer reached twice (shared) keeps its first path in
    depth-first order, as Paddle's ``Layer.named_sublayers`` gives it. Why a path: a
    framework's layer names come from a counter (Gluon's ``dense6`` in a second build of
    the same model, Paddle's ``linear_6.w_0``); a path is the model's own structure."""
    out: dict[int, str] = {id(root): ""}
    stack = [("", iter(children(root)))]  # depth first, each layer's children in order
    while stack:
        path, kids = stack[-1]
        for name, child in kids:
            if child is not None and id(child) not in out:
                out[id(child)] = f"{path}.{name}" if path else str(name)
                stack.append((out[id(child)], iter(children(child))))
                break
        else:
            stack.pop()
    return out


def unmatched(patterns: Iterable[str], names: Iterable[str],
              n: int = 3) -> list[tuple[str, list[str]]]:
    """[(pattern, the closest names the model has)] for each pattern covering none of
    ``names`` (the model's op instance names and layer paths): what ``check_matched``
    reports."""
    names = sorted(set(names) - {""})
    stems = sorted({st for nm in names for st in stems_of(nm)})
    out = []
    for pattern in sorted(set(patterns)):
        if any(matches(pattern, name) for name in names):
            continue
        out.append((pattern, close_matches(pattern, stems, n)
                        or _closest_paths(pattern, stems, n)))
    return out


def stems_of(name: str) -> list[str]:
    """The layer names a pattern could use for ``name``: the name and each part of it up to a
    separator (``dense2.w_0`` -> ``dense2``, ``dense2.w``, ``dense2.w_0``; ``encoder.layers.3``
    -> ``encoder``, ``encoder.layers``, ``encoder.layers.3``)."""
    return [name[:i] for i in range(1, len(name)) if name[i] in SEPARATORS] + [name]


def _closest_paths(pattern: str, stems: list[str], n: int) -> list[str]:
    """Where difflib finds nothing alike (a short path such as ``7``): the names of the same
    depth in ``.``, then the first names."""
    depth = pattern.count(".")
    same = [s for s in stems if s.count(".") == depth and not any(c in s for c in "_/-:")]
    return (same or stems)[:n]


def check_matched(patterns: Iterable[str], names: Iterable[str], where: str) -> None:
    """Raise ``AmpConfigError`` naming every pattern of ``patterns`` that covers none of
    ``names`` (the instance names and layer paths of the model ``where`` describes), each
    with the closest names it has. An error, not a warning: a layer rule that matches
    nothing is a fix that does not apply, and training then runs as if it were not there
    (a doctor's fix written for a model built again under other counter names trained on
    NaN losses, every step skipped)."""
    missing = unmatched(patterns, names)
    if not missing:
        return
    lines = []
    for pattern, close in missing:
        hint = (f"the closest layers it has: {', '.join(map(repr, close))}" if close
                else "it has no named layers")
        lines.append(f"layer {pattern!r} matches no layer of {where}; {hint}")
    raise AmpConfigError(
        "; ".join(lines) + ". Name a layer by its path from the model's root (the child "
        "names joined by '.', e.g. '2' or 'encoder.layers.3.ffn'; what the doctor writes) "
        "or by a name it has (a rule covers names equal to it or starting with it and a "
        "separator: _ . / - :)")


class UnmatchedLayerWarning(UserWarning):
    """Kept for code that filters it: a layer rule matching nothing is now an
    ``AmpConfigError`` (``check_matched``); nothing emits this warning."""
