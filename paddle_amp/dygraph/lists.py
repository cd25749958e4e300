"""The native dynamic-graph AMP lists, read from the installed ``paddle.amp.amp_lists``.

``paddle.amp`` does not use ``paddle.static.amp``'s lists: per dtype and level it has a white
list (run low), a black list (float32) and, for every other op, promotion (float32 if any
floating input is float32, else the low dtype: ``GetPromoteType`` in Paddle's eager AMP).
Its defaults, and a user's custom lists on top of them (``_update_list``: a custom white name
leaves the black list and the reverse), are what ``auto_cast`` without ``policy=`` decides.
"""
from __future__ import annotations

from typing import Iterable, Optional

from amp_adapters import ConflictingOpError, OpLists

from .names import both_spellings


def native_sets(dtype: str, level: str) -> tuple[frozenset[str], frozenset[str]]:
    """(white, black) of the installed ``paddle.amp`` for ``dtype`` at ``level`` (O1, O2, OD)."""
    from paddle.amp import amp_lists
    return (frozenset(amp_lists.white_list()[dtype][level]),
            frozenset(amp_lists.black_list()[dtype][level]))


def native_oplists(dtype: str, level: str, custom_white: Optional[Iterable[str]] = None,
                   custom_black: Optional[Iterable[str]] = None) -> OpLists:
    """The Paddle op overrides (``Policy.paddle_ops``) that reproduce ``paddle.amp``'s lists with
    the custom lists applied as ``_update_list`` does, each name in both spellings
    (``names.both_spellings``); they replace the static defaults (``replace=True``)."""
    cw, cb = _spelled(custom_white, custom_black)
    white, black = native_sets(dtype, level)
    white, black = both_spellings(white), both_spellings(black)
    return OpLists(lower=white - black, fp32=black, replace=True).with_custom(
        OpLists(lower=cw, fp32=cb))


def custom_oplists(custom_white: Optional[Iterable[str]] = None,
                   custom_black: Optional[Iterable[str]] = None) -> OpLists:
    """Custom lists as overrides on top of a given policy (``policy=``), each name in both
    spellings: the core puts them over the policy
    (``amp_adapters.rules.policy.with_custom_lists``)."""
    cw, cb = _spelled(custom_white, custom_black)
    return OpLists(lower=cw, fp32=cb)


def _spelled(custom_white: Optional[Iterable[str]],
             custom_black: Optional[Iterable[str]]) -> tuple[frozenset[str], frozenset[str]]:
    """Both custom lists in both spellings; an op in both is refused, as natively."""
    cw, cb = both_spellings(custom_white or ()), both_spellings(custom_black or ())
    if cw & cb:
        raise ConflictingOpError(sorted(cw & cb)[0], ["custom_white_list", "custom_black_list"])
    return cw, cb
