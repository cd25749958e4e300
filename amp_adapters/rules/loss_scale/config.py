"""``LossScaleConfig``: how the loss scale moves (what a ``Policy`` holds), validated once.

Config is apart from state (as optax's ``apply_if_finite`` keeps its constants
out of ``ApplyIfFiniteState``): nothing here changes during training, so a
backend may bake it into its graph, and a checkpoint only records it to check
that it is resumed under the same rule.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Optional

from ..errors import AmpConfigError, check_choice
from .checks import f32, real, scale_value, whole

KINDS = ("dynamic", "static", "none")
DEFAULT_MAX_SCALE = 2.0**24  # a dynamic scale's growth ceiling unless one is given
# What only a dynamic scale reads: a static scale or none keeps them at their defaults.
DYNAMIC_ONLY = ("growth_factor", "backoff_factor", "growth_interval", "hysteresis")


@dataclass(frozen=True)
class LossScaleConfig:
    """The constants of a loss scale.

    - ``kind``: ``'dynamic'`` (moves), ``'static'`` (fixed scale, overflow steps still
      skipped), ``'none'`` (scale 1, nothing checked: bf16 and fp32).
    - ``init_scale``: the scale of the first step (float32; within the bounds).
    - ``growth_factor`` (> 1) after ``growth_interval`` clean steps in a row;
      ``backoff_factor`` (in (0, 1)) after ``hysteresis`` overflows in a row (they are
      kept as given, in double precision: see ``update`` for the rounding rule).
    - ``min_scale`` (0: no floor) <= ``max_scale`` (inf: no ceiling).
    - The guard (``guard.check_guard``): ``max_consecutive_skips`` overflow steps in a
      row (None: no limit), or more than ``max_skip_fraction`` of the steps of a
      ``skip_window`` skipped (None: off), raise ``OverflowGuardError``; so does a
      scale that reaches 0 or a float32 denormal (always).
    """

    kind: str = "dynamic"
    init_scale: float = 2.0**16
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000
    hysteresis: int = 1
    min_scale: float = 1.0
    max_scale: float = DEFAULT_MAX_SCALE
    max_consecutive_skips: Optional[int] = 64
    max_skip_fraction: Optional[float] = None
    skip_window: int = 1000

    def __post_init__(self) -> None:
        o, put = "LossScaleConfig", lambda k, v: object.__setattr__(self, k, v)
        check_choice("loss-scale kind", self.kind, KINDS)
        put("growth_factor", real(o, "growth_factor", self.growth_factor))
        if not 1 < self.growth_factor or math.isinf(f32(self.growth_factor)):
            raise AmpConfigError(f"{o}.growth_factor must be > 1 and finite in float32, "
                                 f"got {self.growth_factor!r}")
        put("backoff_factor", real(o, "backoff_factor", self.backoff_factor))
        if not 0 < self.backoff_factor < 1 or f32(self.backoff_factor) == 0:
            raise AmpConfigError(f"{o}.backoff_factor must be in (0, 1) (and not round to 0 "
                                 f"in float32), got {self.backoff_factor!r}")
        for name in ("growth_interval", "hysteresis", "skip_window"):
            put(name, whole(o, name, getattr(self, name), minimum=1))
        put("min_scale", scale_value(o, "min_scale", self.min_scale, allow_zero=True))
        put("max_scale", scale_value(o, "max_scale", self.max_scale, allow_inf=True))
        if not self.min_scale <= self.max_scale:
            raise AmpConfigError(f"{o} needs min_scale <= max_scale, got min_scale="
                                 f"{self.min_scale!r}, max_scale={self.max_scale!r}")
        put("init_scale", scale_value(o, "init_scale", self.init_scale))
        if self.kind == "dynamic" and not self.min_scale <= self.init_scale <= self.max_scale:
            raise AmpConfigError(
                f"{o}.init_scale must be within [min_scale, max_scale] = "
                f"[{self.min_scale:g}, {self.max_scale:g}], got {self.init_scale!r}")
        if self.max_consecutive_skips is not None:
            put("max_consecutive_skips",
                whole(o, "max_consecutive_skips", self.max_consecutive_skips, minimum=1))
        if self.max_skip_fraction is not None:
            put("max_skip_fraction", real(o, "max_skip_fraction", self.max_skip_fraction))
            if not 0 < self.max_skip_fraction < 1:
                raise AmpConfigError(f"{o}.max_skip_fraction must be in (0, 1) or None (off), "
                                     f"got {self.max_skip_fraction!r}")

    @property
    def checks_overflow(self) -> bool:
        """False for ``kind='none'``: nothing is checked, nothing skipped."""
        return self.kind != "none"

    def as_dict(self) -> dict[str, Any]:
        """Every field as plain Python values (JSON-serialisable except ``inf``)."""
        return dataclasses.asdict(self)

    def differences(self, other: "LossScaleConfig") -> dict[str, tuple[Any, Any]]:
        """``{field: (self's value, other's value)}`` for every field that differs."""
        a, b = self.as_dict(), other.as_dict()
        return {k: (a[k], b[k]) for k in a if a[k] != b[k]}


DEFAULTS = {f.name: f.default for f in dataclasses.fields(LossScaleConfig)}
