"""The one form of a config-structure error, and the checks every table of a policy shares.

A wrong value is reported as ``<where>: <key path> = <value>: <what is accepted>``
(``fail``): ``where`` names the source (``policy file 'p.toml'``, or the class for a
constructor), the key path says which key (``layers.mxnet.fp32[1]``). ``policyfile``
(the op lists, the loss scale, the top level) and ``layers`` (the layer lists) both check
with these, so a table, an unknown key and a list of names are refused in the same words
wherever they appear. Pure functions; no policy object.
"""
from __future__ import annotations

from typing import Any, Callable, Iterable, Mapping

from .errors import AmpConfigError, close_matches


def fail(where: str, path: str, value: Any, what: str) -> AmpConfigError:
    """The error for ``value`` at key ``path`` of ``where``: what is accepted there (a bool
    shown as TOML spells it; a long value cut short)."""
    shown = ("true" if value else "false") if isinstance(value, bool) else repr(value)
    if len(shown) > 60:
        shown = shown[:57] + "..."
    return AmpConfigError(f"{where}: {path} = {shown}: {what}")


def did_you_mean(name: Any, known: Any) -> str:
    """``"; did you mean 'x'?"`` for the names of ``known`` close to ``name``, else ``""``."""
    hits = close_matches(str(name), known)
    return f"; did you mean {', '.join(map(repr, hits))}?" if hits else ""


def check_keys(d: Mapping[str, Any], allowed: tuple[str, ...], where: str, path: str) -> None:
    """Every key of ``d`` (the table at ``path``; "" for the top level) is one of
    ``allowed``, else an error naming the key, close matches and what is allowed."""
    for key in d:
        if key not in allowed:
            raise AmpConfigError(
                f"{where}: unknown key {key!r} in {path or 'the top level'}"
                f"{did_you_mean(key, allowed)} (allowed: {', '.join(allowed)})")


def check_table(value: Any, where: str, path: str, example: str) -> dict:
    """``value`` as a dict if it is a table (a mapping), else an error showing ``example``."""
    if not isinstance(value, Mapping):
        raise fail(where, path, value, f"must be a table ({example})")
    return dict(value)


def check_name_list(value: Any, where: str, path: str, noun: str, example: str, item: str,
                    valid: Callable[[str], bool] = bool, means: str = "") -> list[str]:
    """A list of ``noun`` (any collection but a string or a mapping), each a string that
    ``valid`` accepts, in order; else an error naming ``path`` (and the item's index) and
    what is accepted: ``item`` for one entry, ``means`` (what ``noun`` stands for) and
    ``example`` for the list. A lone string is refused with the list it should be."""
    if isinstance(value, str):
        raise fail(where, path, value, f"must be a list of {noun}; write [{value!r}]")
    if isinstance(value, Mapping) or not isinstance(value, Iterable):
        raise fail(where, path, value, f"must be a list of {noun}{means}, e.g. [{example}]")
    out = []
    for i, name in enumerate(value):
        if not isinstance(name, str) or not valid(name):
            raise fail(where, f"{path}[{i}]", name, f"must be {item}")
        out.append(name)
    return out

