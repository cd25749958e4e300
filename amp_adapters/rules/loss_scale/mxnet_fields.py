"""The native MXNet ``LossScaler``'s fields, read from and written to one config and state.

``mxnet.contrib.amp.LossScaler`` keeps its whole machine in plain attributes, and takes no
arguments, so MXNet toolkits reach into ``trainer._amp_loss_scaler``: they set
``_scale_seq_len`` to choose the growth interval, and save ``_loss_scale``,
``_next_loss_scale`` and ``_unskipped`` in every checkpoint and write them back on resume.
Here those names are views of a ``LossScaleConfig`` and a ``LossScaleState``: ``read``
answers with the native's meaning, ``write`` returns the new config and state (checked as
any state entering is, by ``check_state``) or raises ``AmpConfigError`` naming the field.

Field (native meaning) -> here:

- ``_loss_scale`` (the scale the next ``scale_loss`` multiplies by; ``loss_scale`` reads
  it) -> ``state.scale``.
- ``_next_loss_scale`` (the scale the last ``has_overflow`` decided: natively applied one
  step later, when the next ``has_overflow`` first copies it into ``_loss_scale``) ->
  ``state.scale`` too: here a decided scale is used by the very next step, so between
  steps both names read the same value, the one the next step uses. A write of either
  sets it; when a native checkpoint holds two different values (saved right after a
  move), restoring ``_loss_scale`` then ``_next_loss_scale`` (the order toolkits use)
  leaves the newer one, where the native run would be one step later.
- ``_unskipped`` (clean steps since the scale last moved) -> ``state.good_steps``;
  a write of n > 0 also clears ``bad_steps`` (a clean step ends a run of overflows).
- ``_scale_seq_len`` (clean steps in a row before the scale doubles) ->
  ``config.growth_interval``.
- ``_max_loss_scale`` (the growth ceiling) -> ``config.max_scale``; a ceiling below the
  config's ``init_scale`` lowers that to it (a fresh start must obey the ceiling).
- ``loss_scale`` (read-only property, as natively) -> ``state.scale``.

Invariants a write must keep (else ``AmpConfigError``, nothing changed): a scale is a
positive float32 normal within ``[min_scale, max_scale]``; ``_unskipped`` is a whole
number below ``_scale_seq_len`` (the native's ``==`` test would never fire past it: its
scale would stop growing until the next overflow); ``_scale_seq_len`` >= 1; a static
scale or none has no growth to set (a write that changes it is refused, never ignored)
and none has no scale but 1. The native's counters of skipped steps have no field: they
go on from the state as it is.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Union

from ..errors import AmpConfigError
from .checks import scale_value, whole
from .config import LossScaleConfig
from .consistency import check_state
from .state import LossScaleState

OWNER = "LossScaler"  # the native class whose fields these are
SCALES = ("_loss_scale", "_next_loss_scale")
FIELDS = SCALES + ("_unskipped", "_scale_seq_len", "_max_loss_scale")
READ_ONLY = ("loss_scale",)
# The core field each native one is, for messages (the scale: the first of its two names).
CORE_NAMES = {"_loss_scale": "scale", "_next_loss_scale": "scale", "_unskipped": "good_steps",
              "_scale_seq_len": "growth_interval", "_max_loss_scale": "max_scale"}
_NATIVE_NAMES = {"scale": "_loss_scale", "good_steps": "_unskipped",
                 "growth_interval": "_scale_seq_len", "max_scale": "_max_loss_scale"}

_GLOSSARY = ", ".join(f"{n} is {c}" for n, c in CORE_NAMES.items())

Number = Union[int, float]


def read(config: LossScaleConfig, state: LossScaleState, name: str) -> Number:
    """The native field ``name`` (one of ``FIELDS`` or ``loss_scale``) as plain Python:
    floats for the scales, ints for the counts, as the native holds them."""
    if name in SCALES or name in READ_ONLY:
        return float(state.scale)
    if name == "_unskipped":
        return int(state.good_steps)
    if name == "_scale_seq_len":
        return int(config.growth_interval)
    if name == "_max_loss_scale":
        return float(config.max_scale)
    raise AttributeError(unknown_field_message(name))


def write(config: LossScaleConfig, state: LossScaleState, name: str,
          value: Any) -> tuple[LossScaleConfig, LossScaleState]:
    """``(config, state)`` after the native write ``scaler.<name> = value``.

    Raises ``AmpConfigError`` (naming the field, its value and what to do) for a write that
    breaks an invariant (see the module docstring), ``AttributeError`` for ``loss_scale``
    (read-only, as natively) and for a name the native does not have."""
    if name in READ_ONLY:
        raise AttributeError(f"{OWNER}.loss_scale is read-only (a property, as natively): "
                             f"write _loss_scale to set the scale")
    if name not in FIELDS:
        raise AttributeError(unknown_field_message(name))
    where = f"{OWNER}.{name}"
    if config.kind != "dynamic" and name not in SCALES + ("_unskipped",):
        if read(config, state, name) == value:
            return config, state  # a restore of what was read: nothing changes
        raise AmpConfigError(f"{where} = {value!r}: a {config.kind!r} loss scale never grows, "
                             f"so {name} has no effect here; pass a DynamicLossScale to "
                             f"init_trainer to have one")
    if name in SCALES:
        scale = scale_value(OWNER, name, value)
        if config.kind == "static":  # a static scale is its config's init_scale
            config = _config(config, where, value, init_scale=scale)
        state = dataclasses.replace(state, scale=scale)
    elif name == "_unskipped":
        good = whole(OWNER, name, value)
        state = dataclasses.replace(state, good_steps=good,
                                    bad_steps=state.bad_steps if good == 0 else 0)
    elif name == "_scale_seq_len":
        config = _config(config, where, value,
                         growth_interval=whole(OWNER, name, value, minimum=1))
    else:  # _max_loss_scale
        ceiling = scale_value(OWNER, name, value, allow_inf=True)
        config = _config(config, where, value, max_scale=ceiling,
                         init_scale=min(config.init_scale, ceiling))
    try:
        check_state(config, state, _name_in(name, value))
    except AmpConfigError as e:
        raise AmpConfigError(f"{e} (here {_GLOSSARY}; the config is the loss scale given to "
                             f"init_trainer)") from None
    return config, state


def unknown_field_message(name: str) -> str:
    return (f"{OWNER} has no attribute {name!r}: the native LossScaler's fields are "
            f"{', '.join(FIELDS)} and the read-only {', '.join(READ_ONLY)}")


def _config(config: LossScaleConfig, where: str, value: Any, **changes: Any) -> LossScaleConfig:
    try:
        return dataclasses.replace(config, **changes)
    except AmpConfigError as e:
        raise AmpConfigError(f"{where} = {value!r}: {e}") from None


def _name_in(written: str, value: Any):
    """How ``check_state`` names a field it refuses after the write ``written = value``."""
    def name(field: str) -> str:
        native = _NATIVE_NAMES.get(field)
        if native == written or (native == "_loss_scale" and written in SCALES):
            return f"{OWNER}.{written}"
        return (f"{OWNER}.{written} = {value!r} would leave "
                + (f"{OWNER}.{native}" if native else f"the state's {field}"))
    return name
