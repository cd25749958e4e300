"""Strict loss-scale state dicts: a format version, the state, and the config it ran under.

``{"format_version": 1, "kind": ..., "config": {...}, "state": {...}}``. The
config is recorded to be *checked* on load, never applied: resuming under a
different rule would silently change the trajectory. Loading validates
everything before anything is returned, so a caller that writes only after
``load_state`` succeeded changes nothing on error.

A state dict written by an earlier version loads in every later one: ``upgrade`` brings
it to ``FORMAT_VERSION`` one registered step at a time (``UPGRADES``: version -> the
function that turns a dict of that version into one of the next), then it is checked as
strictly as a new one. A change of the format comes with its step; a new config field is
one: ``UPGRADES[n] = add_config_key(name, value)`` where ``value`` reproduces the
behaviour before the field existed. A version newer than this one's is a clear error.
Versions: 1 (amp-adapters 0.1.0).
"""
from __future__ import annotations

import dataclasses
import math
import numbers
from typing import Any, Callable, Mapping, Optional

import numpy as np

from ..errors import AmpConfigError, check_choice
from .config import DEFAULTS, DYNAMIC_ONLY, KINDS, LossScaleConfig
from .checks import F32_TINY, INT64_MAX, f32
from .consistency import check_state
from .state import COUNTERS, FIELDS, LossScaleState

FORMAT_VERSION = 1
Upgrade = Callable[[dict], dict]
UPGRADES: dict[int, Upgrade] = {}  # format_version -> its dict as the next version's
KEYS = ("format_version", "kind", "config", "state")
CONFIG_KEYS = tuple(f.name for f in dataclasses.fields(LossScaleConfig) if f.name != "kind")


def state_dict(config: LossScaleConfig, state: LossScaleState) -> dict[str, Any]:
    """The checkpoint form of ``state`` under ``config``: plain Python values."""
    cfg = config.as_dict()
    del cfg["kind"]
    return {"format_version": FORMAT_VERSION, "kind": config.kind, "config": cfg,
            "state": state.as_dict()}


def _err(key: str, value: Any, what: str) -> AmpConfigError:
    return AmpConfigError(f"loss-scale state_dict{key} = {value!r}: {what}")


def add_config_key(name: str, value: Any) -> Upgrade:
    """The upgrade step of a format that added the config field ``name``: a dict of the
    previous format gets ``value``, the one that reproduces the behaviour it was saved with."""
    def step(d: dict) -> dict:
        config = d.get("config")
        if isinstance(config, Mapping) and name not in config:
            d = {**d, "config": {**config, name: value}}
        return d
    step.__doc__ = f"config[{name!r}] = {value!r} (the behaviour before the field existed)"
    return step


def upgrade(d: Mapping, current: Optional[int] = None,
            upgrades: Optional[Mapping[int, Upgrade]] = None) -> dict:
    """``d`` (a state dict of any version up to ``current``, default ``FORMAT_VERSION``) as a
    dict of version ``current``, through ``upgrades`` (default ``UPGRADES``) one version at
    a time. A version that is not an int >= 1, or newer than ``current``, is an
    ``AmpConfigError``."""
    current = FORMAT_VERSION if current is None else current
    steps = UPGRADES if upgrades is None else upgrades
    version = d["format_version"]
    if type(version) is not int or version < 1:
        raise _err("['format_version']", version, f"must be an int from 1 to {current} (this "
                                                  f"version reads formats 1 to {current})")
    if version > current:
        raise _err("['format_version']", version,
                   f"written by a newer amp-adapters (this version reads formats 1 to "
                   f"{current}); load it with that version or upgrade amp-adapters")
    out = dict(d)
    while version < current:
        if version not in steps:
            raise _err("['format_version']", version, f"no upgrade from format {version} to "
                                                      f"{version + 1} is known")
        out = dict(steps[version](out))
        version += 1
        out["format_version"] = version
    return out


def _exact_keys(d: Any, keys: tuple[str, ...], where: str) -> dict:
    if not isinstance(d, Mapping):
        raise _err(where or " (the whole dict)", d,
                   f"expected a dict with the keys {list(keys)} (as state_dict() returns), "
                   f"got {type(d).__name__}")
    missing = [k for k in keys if k not in d]
    unknown = sorted(map(str, set(d) - set(keys)))
    if missing:
        raise AmpConfigError(f"loss-scale state_dict{where if where != '' else ''} misses the "
                             f"key {missing[0]!r} (expected {list(keys)}); was it saved by "
                             f"state_dict()?")
    if unknown:
        raise AmpConfigError(f"loss-scale state_dict{where} has the unknown key "
                             f"{unknown[0]!r} (expected {list(keys)})")
    return dict(d)


def _counter(key: str, value: Any) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise _err(key, value, f"must be an int >= 0, not a {type(value).__name__}")
    if not 0 <= int(value) <= INT64_MAX:
        raise _err(key, value, "must be an int in [0, 2**63-1]")
    return int(value)


def _scale(key: str, value: Any) -> float:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise _err(key, value, f"must be a float, not a {type(value).__name__}")
    x = float(value)
    if not math.isfinite(x) or x <= 0 or not math.isfinite(f32(x)) or f32(x) < F32_TINY:
        raise _err(key, value, "must be a finite float32 scale > 0 (not NaN, inf, negative, "
                               "0 or a denormal)")
    return x


def load_state(d: Any, config: Optional[LossScaleConfig] = None
               ) -> tuple[LossScaleConfig, LossScaleState]:
    """``(config, state)`` from a ``state_dict``, checked key by key.

    With ``config`` (the running one), the recorded config must equal it: a
    difference is an error naming the key and both values. Every problem is an
    ``AmpConfigError`` naming the key and the value."""
    if not isinstance(d, Mapping) or "format_version" not in d:
        _exact_keys(d, KEYS, "")  # raises: what is missing
    d = _exact_keys(upgrade(d), KEYS, "")
    kind = d["kind"]
    check_choice("loss-scale kind in state_dict['kind']", kind, KINDS)
    if config is not None:
        _same_kind(kind, config.kind)
    cfg = _exact_keys(d["config"], CONFIG_KEYS, "['config']")
    try:
        saved = LossScaleConfig(kind=kind, **cfg)
    except AmpConfigError as e:
        raise AmpConfigError(f"loss-scale state_dict['config']: {e}") from None
    for name in DYNAMIC_ONLY if kind != "dynamic" else ():
        if getattr(saved, name) != DEFAULTS[name]:  # what no static/none scale writes
            raise _err(f"['config'][{name!r}]", cfg[name],
                       f"a dynamic loss scale's setting in a state dict of kind {kind!r}, "
                       f"which never moves the scale: was the kind edited?")
    st = _exact_keys(d["state"], FIELDS, "['state']")
    values = {"scale": _scale("['state']['scale']", st["scale"])}
    for name in COUNTERS:
        values[name] = _counter(f"['state'][{name!r}]", st[name])
    state = LossScaleState(**values)
    check_state(saved, state, "loss-scale state_dict['state'][{!r}]".format)
    if config is not None:
        check_same_config(saved, config)
    return saved, state


def _same_kind(saved: str, running: str) -> None:
    if saved != running:
        raise _err("['kind']", saved, f"this run uses a {running!r} loss scale; resume with "
                                      f"the policy the checkpoint was made under")


def check_same_config(saved: LossScaleConfig, running: LossScaleConfig) -> None:
    """Raise ``AmpConfigError`` naming the first key where a saved config differs from the
    running one (a resumed run keeps its rule: the saved one is checked, never applied)."""
    _same_kind(saved.kind, running.kind)
    diff = saved.differences(running)
    if diff:
        key, (theirs, ours) = next(iter(diff.items()))
        more = f" (and {sorted(diff)[1:]})" if len(diff) > 1 else ""
        raise _err(f"['config'][{key!r}]", theirs,
                   f"differs from this run's {key}={ours!r}{more}; the state dict is "
                   f"checked against the running config, not applied: build the "
                   f"trainer/program with the policy it was saved under")
