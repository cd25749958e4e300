"""Errors raised by the core: each names the offending value and what to do."""
from __future__ import annotations

import difflib
from typing import Iterable, Optional


def close_matches(name: str, known: Iterable[str], n: int = 3) -> list[str]:
    """Up to ``n`` names from ``known`` that look like ``name`` (case-insensitive)."""
    known = list(known)
    lowered = {k.lower(): k for k in known}
    hits = difflib.get_close_matches(name.lower(), list(lowered), n=n, cutoff=0.6)
    return [lowered[h] for h in hits]


def _hint(name: str, known: Iterable[str]) -> str:
    hits = close_matches(name, known)
    return f" Did you mean {', '.join(repr(h) for h in hits)}?" if hits else ""


class AmpConfigError(ValueError):
    """A policy, list or scaler setting is invalid. Base class of the config errors."""


class UnknownOpError(AmpConfigError):
    """An op name that the framework (or the canonical vocabulary) does not know."""

    def __init__(self, name: str, where: str, known: Iterable[str], hint: str = ""):
        self.name = name
        super().__init__(
            f"unknown op {name!r} for {where}.{_hint(name, known)}{hint} "
            f"Run `amp-adapters lists --framework ...` to see the known names."
        )


class ConflictingOpError(AmpConfigError):
    """One op was put in two categories by the same set of overrides."""

    def __init__(self, name: str, categories: Iterable[str]):
        self.name = name
        cats = sorted(categories)
        super().__init__(
            f"op {name!r} is listed in more than one category ({', '.join(cats)}); "
            f"keep it in exactly one list."
        )


class UnknownChoiceError(AmpConfigError):
    """A dtype, level, preset or other enumerated setting is not one of the allowed values."""

    def __init__(self, what: str, value: object, allowed: Iterable[str]):
        allowed = list(allowed)
        hint = _hint(str(value), allowed)
        super().__init__(
            f"unknown {what} {value!r}; expected one of {', '.join(map(repr, allowed))}.{hint}"
        )


def check_choice(what: str, value: object, allowed: Iterable[str]) -> str:
    """``value`` if it is one of the names ``allowed``, else ``UnknownChoiceError`` (also for
    a value that is no string at all, e.g. an unhashable list: never a bare ``TypeError``)."""
    allowed = list(allowed)
    if not isinstance(value, str) or value not in allowed:
        raise UnknownChoiceError(what, value, allowed)
    return value


class FlagError(AmpConfigError, TypeError):
    """A flag argument that is not a bool (a ``TypeError``, and a config error)."""


def check_flag(name: str, value: object, also: str = "") -> bool:
    """``value`` if it is a bool, else ``FlagError`` (a ``TypeError``) naming the argument: a
    flag is True or False, never a truthy string (``emulate="false"`` would turn emulation
    on) or a number. ``also``: what else the caller accepts (checked by the caller), named
    in the message."""
    if not isinstance(value, bool):
        raise FlagError(f"{name} must be true or false (a bool){', ' + also if also else ''}, "
                        f"got {type(value).__name__} {value!r}")
    return value


class OverflowGuardError(RuntimeError):
    """Raised by a backend when loss scaling cannot go on (see ``loss_scale.guard``).

    After ``max_consecutive_skips`` overflow steps in a row, when the scale has
    collapsed to 0 or a float32 denormal, or when too many steps of a window were
    skipped: skipping forever while the scale collapses hides a real bug (an inf
    in the data, a diverged model); this names the parameters whose gradients
    were non-finite so the user can look at them.
    """

    def __init__(self, skips: int, scale: float, param_names: Iterable[str],
                 reason: Optional[str] = None):
        self.param_names = list(param_names)
        self.skips, self.scale = skips, scale
        names = ", ".join(self.param_names[:10]) or "(none found on the last check)"
        more = f" and {len(self.param_names) - 10} more" if len(self.param_names) > 10 else ""
        what = reason or (f"{skips} overflow steps in a row (loss scale now {scale:g}); the "
                          f"optimizer has not updated since")
        hint = ("raise max_consecutive_skips" if reason is None else
                "see the settings named above")
        super().__init__(
            f"{what}. Non-finite gradients in: {names}{more}. Check the "
            f"data and the loss for inf/nan, or {hint}."
        )


class NotSupportedError(AmpConfigError, NotImplementedError):
    """A native public name that a drop-in cannot support: the message says why and what
    to use instead (a drop-in never answers a native name with AttributeError)."""


def unsupported(native: str, why: str, instead: str):
    """A stand-in for the native callable ``native`` that raises ``NotSupportedError``."""
    def stand_in(*args, **kwargs):
        raise NotSupportedError(f"{native} is not supported: {why}. Use {instead} instead.")
    stand_in.__name__ = stand_in.__qualname__ = native.rsplit(".", 1)[-1]
    stand_in.__doc__ = f"Not supported: {why}. Use {instead} instead."
    return stand_in


class CheckpointError(RuntimeError):
    """A checkpoint is missing, incomplete, corrupt or does not fit the run loading it.

    Raised before any parameter, optimizer state or loss scale is changed."""
