"""``auto_cast``'s native arguments (and ``policy=``, ``emulate=``) -> one checked ``Policy``.

Everything is checked here, before ``auto_cast`` switches anything on: the native sets its
global AMP state first and raises after (a bad ``level`` leaves ``paddle.amp``'s state
changed). Without ``policy=`` the policy reproduces ``paddle.amp``'s own dygraph lists
(``lists``), and so does ``policy="paddle-native"`` (in this runtime the native is
``paddle.amp``); with another policy, it decides and the custom lists extend it.
"""
from __future__ import annotations

import functools
from typing import Any

from amp_adapters import (AmpConfigError, Policy, UnknownChoiceError, UnknownOpError,
                          resolve_policy, with_custom_lists)
from amp_adapters.rules.errors import check_flag

from .lists import custom_oplists, native_oplists, native_sets
from .names import program_name

LEVELS = ("O0", "OD", "O1", "O2")
DTYPES = ("float16", "bfloat16")
NATIVE_DTYPE, NATIVE_LEVEL = "float16", "O1"  # paddle.amp.auto_cast's defaults


def _text(what: str, value: Any, allowed: tuple[str, ...], fold) -> str:
    if not isinstance(value, str):
        raise AmpConfigError(f"auto_cast: {what} must be a string, one of "
                             f"{', '.join(map(repr, allowed))}; got {value!r}")
    if fold(value) not in allowed:
        raise UnknownChoiceError(f"auto_cast {what}", value, allowed)
    return fold(value)


def _names(what: str, value: Any) -> tuple[str, ...]:
    """A custom list: a set, list or tuple of op names (a string would be read letter by
    letter), each an op Paddle knows in eager or program spelling."""
    if value is None:
        return ()
    if not isinstance(value, (set, frozenset, list, tuple)) or \
            not all(isinstance(n, str) and n for n in value):
        raise AmpConfigError(f"auto_cast: {what} must be a set, list or tuple of op names "
                             f"(e.g. {{'matmul', 'elementwise_add'}}), got {value!r}")
    known = known_ops()
    for name in value:
        if name not in known and program_name(name) not in known:
            raise UnknownOpError(name, f"Paddle ({what})", known)
    return tuple(value)


@functools.lru_cache(maxsize=None)
def known_ops() -> frozenset[str]:
    """Every op name Paddle knows: eager (``paddle._C_ops``), program (its op registry),
    and the native AMP lists' names."""
    import paddle
    from paddle.base.framework import OpProtoHolder
    names = set(OpProtoHolder.instance().op_proto_map) | {
        n for n in dir(paddle._C_ops) if not n.startswith("_")}
    for dtype in DTYPES:
        for level in ("O1", "O2", "OD"):
            white, black = native_sets(dtype, level)
            names |= white | black
    return frozenset(names)


def policy_of(enable: Any = True, custom_white_list: Any = None, custom_black_list: Any = None,
              level: Any = None, dtype: Any = None, use_promote: Any = True,
              policy: Any = None, emulate: Any = False) -> Policy:
    """The policy ``auto_cast(...)`` runs under; every argument checked (an
    ``AmpConfigError`` naming it). ``level``/``dtype`` None: the native's default (``O1``,
    ``float16``) without ``policy=``, the policy's own with it. ``enable=False`` or level
    ``O0``: the float32 policy ``O0``. Kept per distinct arguments: a training loop enters
    a region every step, and building a checked ``Policy`` costs about 0.1 ms (so a policy
    file named by ``policy=`` is read once per process)."""
    try:
        # each flag with its type: 1 == True and hashes alike, but only True is a flag
        key = ((type(enable), enable), _frozen(custom_white_list),
               _frozen(custom_black_list), level, dtype, (type(use_promote), use_promote),
               policy, (type(emulate), emulate))
        hash(key)
    except TypeError:  # an argument that cannot be a key: checked (and refused) below
        return _policy_of(enable, custom_white_list, custom_black_list, level, dtype,
                          use_promote, policy, emulate)
    return _cached(key)


def _frozen(names: Any) -> Any:
    """A custom list as a key: the same names in any container are the same lists."""
    return frozenset(names) if isinstance(names, (set, frozenset, list, tuple)) else names


@functools.lru_cache(maxsize=256)
def _cached(key: tuple) -> Policy:
    enable, white, black, level, dtype, use_promote, policy, emulate = key
    return _policy_of(enable[1], white, black, level, dtype, use_promote[1], policy, emulate[1])


def _policy_of(enable: Any = True, custom_white_list: Any = None, custom_black_list: Any = None,
              level: Any = None, dtype: Any = None, use_promote: Any = True,
              policy: Any = None, emulate: Any = False) -> Policy:
    """``policy_of``, built."""
    check_flag("auto_cast enable", enable)
    check_flag("auto_cast use_promote", use_promote)
    check_flag("auto_cast emulate", emulate)
    lvl = None if level is None else _text("level", level, LEVELS, str.upper)
    dt = None if dtype is None else _text("dtype", dtype, DTYPES, str.lower)
    white = _names("custom_white_list", custom_white_list)
    black = _names("custom_black_list", custom_black_list)
    if policy is not None:
        base = resolve_policy(policy, device_type="cpu")
        if base.enabled and base == Policy.preset("paddle-native", dtype=base.dtype,
                                                  level=base.level, emulate=base.emulate):
            # the native preset: in this runtime, the native is paddle.amp and its lists
            return _native(enable, white, black, lvl or base.level, dt or base.dtype,
                           emulate or base.emulate, use_promote)
        changes: dict[str, Any] = {}
        if dt is not None and base.enabled:
            changes["dtype"] = dt
        if lvl is not None and lvl != "O0" and base.enabled:
            changes["level"] = lvl
        base = with_custom_lists(base, "paddle", custom_oplists(white, black))
        if not use_promote and base.use_promote:  # False turns the policy's own off
            changes["use_promote"] = False
        resolved = base.replace(**changes) if changes else base
        if not enable or lvl == "O0":
            return Policy.preset("O0")
        return resolved.with_emulation(emulate)
    return _native(enable, white, black, lvl or NATIVE_LEVEL, dt or NATIVE_DTYPE, emulate,
                   use_promote)


def _native(enable: bool, white: tuple, black: tuple, level: str, dtype: str,
            emulate: bool, use_promote: bool = True) -> Policy:
    """paddle.amp's own decisions: its dygraph lists for ``dtype`` at ``level`` with the
    custom lists applied (``lists``), every other op promoting (float32 if any
    floating input is float32), at O2 too with ``use_promote`` (``Policy.use_promote``);
    without it every op not black-listed runs low at O2, as the native's
    ``GetAmpDestDtype`` does (2.6.2 and 3.3.1; at O1 the native promotes either way)."""
    ops = native_oplists(dtype, "O1" if level == "O0" else level, white, black)
    if not enable or level == "O0":
        return Policy.preset("O0")
    return Policy(dtype=dtype, level=level, paddle_ops=ops, unlisted="promote",
                  use_promote=use_promote, defaults="native", emulate=emulate)
