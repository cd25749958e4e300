"""``LossScaleState``: what changes each step, and all a checkpoint stores.

Six fields, in every backend: ``scale`` (float32), ``good_steps`` (clean steps
since the last move), ``bad_steps`` (overflows in a row not yet acted on),
``total_steps``, ``skipped_steps`` and ``consecutive_skips``. This dataclass is their
one definition: ``FIELDS``/``COUNTERS``, ``update.StateArrays``, the user-facing loss
scales' fields and the backends' state vars all derive from it.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from ..errors import AmpConfigError
from .checks import f32, real, whole
from .config import LossScaleConfig


@dataclass(frozen=True)
class LossScaleState:
    """One step's loss-scale state, as plain Python numbers (numpy scalars are accepted).

    A scale of 0 or a denormal is a valid record (a collapsed run); the guard, not
    this record, refuses to go on with it."""

    scale: float = LossScaleConfig.init_scale  # where a run starts: the config's default
    good_steps: int = 0
    bad_steps: int = 0
    total_steps: int = 0
    skipped_steps: int = 0
    consecutive_skips: int = 0

    def __post_init__(self) -> None:
        o = "LossScaleState"
        scale = real(o, "scale", self.scale)
        if scale < 0:
            raise AmpConfigError(f"{o}.scale must be >= 0, got {self.scale!r}")
        object.__setattr__(self, "scale", f32(scale))
        for name in COUNTERS:
            object.__setattr__(self, name, whole(o, name, getattr(self, name)))

    @classmethod
    def initial(cls, config) -> "LossScaleState":
        """The state before the first step of ``config`` (scale 1 for ``kind='none'``)."""
        return cls(scale=config.init_scale if config.kind != "none" else 1.0)

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(LossScaleState))
COUNTERS: tuple[str, ...] = FIELDS[1:]  # the integer fields (the scale is FIELDS[0])
