"""Strict loss-scale state dicts: a format version, the state, and the config it ran under.

``{"format_version": 1, "kind": ..., "config": {...}, "state": {...}}``. The
config is recorded to be *checked* on load, never applied: resuming under a
different rule would silently change the trajectory. Loading validates
everything before anything is returned, so a caller that writes only after
``load_state`` succeeded changes nothing on error.
"""
from __future__ import annotations

import dataclasses
import math
import numbers
from typing import Any, Mapping, Optional

import numpy as np

from ..errors import AmpConfigError, UnknownChoiceError
from .config import KINDS, LossScaleConfig
from .checks import F32_TINY, INT64_MAX, f32
from .state import COUNTERS, FIELDS, LossScaleState

FORMAT_VERSION = 1
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
    d = _exact_keys(d, KEYS, "")
    version = d["format_version"]
    if type(version) is not int or version != FORMAT_VERSION:
        raise _err("['format_version']", version, f"this version reads format {FORMAT_VERSION}")
    kind = d["kind"]
    if kind not in KINDS:
        raise UnknownChoiceError("loss-scale kind in state_dict['kind']", kind, KINDS)
    if config is not None and config.kind != kind:
        raise _err("['kind']", kind, f"this run uses a {config.kind!r} loss scale; resume "
                                   f"with the policy the checkpoint was made under")
    cfg = _exact_keys(d["config"], CONFIG_KEYS, "['config']")
    try:
        saved = LossScaleConfig(kind=kind, **cfg)
    except AmpConfigError as e:
        raise AmpConfigError(f"loss-scale state_dict['config']: {e}") from None
    st = _exact_keys(d["state"], FIELDS, "['state']")
    values = {"scale": _scale("['state']['scale']", st["scale"])}
    for name in COUNTERS:
        values[name] = _counter(f"['state'][{name!r}]", st[name])
    state = LossScaleState(**values)
    if kind == "dynamic" and not saved.min_scale <= state.scale <= saved.max_scale:
        raise _err("['state']['scale']", st["scale"],
                   f"outside [min_scale, max_scale] = [{saved.min_scale:g}, "
                   f"{saved.max_scale:g}] of its config")
    if kind != "dynamic" and state.scale != (saved.init_scale if kind == "static" else 1.0):
        raise _err("['state']['scale']", st["scale"], f"a {kind!r} scale never moves from "
                   f"{saved.init_scale if kind == 'static' else 1.0:g}")
    if config is not None:
        diff = saved.differences(config)
        if diff:
            key, (theirs, ours) = next(iter(diff.items()))
            more = f" (and {sorted(diff)[1:]})" if len(diff) > 1 else ""
            raise _err(f"['config'][{key!r}]", theirs,
                       f"differs from this run's {key}={ours!r}{more}; the state dict is "
                       f"checked against the running config, not applied: build the "
                       f"trainer/program with the policy it was saved under")
    return saved, state
