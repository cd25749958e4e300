"""The loss-scale state machine shared by both backends (DESIGN.md, normative).

Each loss scale is a frozen dataclass whose ``adjust(found_inf)`` returns the
next state; nothing here touches a framework or a device, so one trajectory
can be replayed in MXNet, Paddle and plain Python and compared step by step.
The scale is a float32 value and each move is rounded once to float32, as the
natives' kernels do (torch multiplies by a double factor; Paddle stores its
ratios as float32, which ``from_paddle`` reproduces by rounding them).

- ``DynamicLossScale``: grows after ``growth_interval`` clean steps, backs off
  after ``hysteresis`` overflows in a row, kept within ``[min_scale, max_scale]``.
  ``from_torch``, ``from_paddle`` and ``from_mxnet`` take those libraries'
  argument names and give their exact transitions.
- ``StaticLossScale``: a fixed scale; overflow steps are still skipped.
- ``NoOpLossScale``: scale 1 and no overflow check (bf16 and fp32 runs).

A backend skips the optimizer update whenever ``found_inf`` is true and
``checks_overflow`` is set, then uses the returned state's ``scale`` for the
very next step (no lag). ``exhausted`` tells it to stop with
``OverflowGuardError`` instead of skipping forever.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, ClassVar, Optional, Union

import numpy as np

from .errors import AmpConfigError, UnknownChoiceError


def _f32(x: float) -> float:
    """``x`` rounded to float32 (inf if it overflows float32), as a Python float."""
    with np.errstate(over="ignore"):
        return float(np.float32(x))


def _mul_f32(scale: float, factor: float) -> float:
    """``scale * factor`` rounded once to float32 (inf if it overflows float32)."""
    return _f32(scale * factor)


def _check_steps(obj: Any, *names: str) -> None:
    for name in names:
        value = getattr(obj, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise AmpConfigError(f"{type(obj).__name__}.{name} must be an int >= 0, got {value!r}")


def _check_guard(obj: Any) -> None:
    g = obj.max_consecutive_skips
    if g is not None and (isinstance(g, bool) or not isinstance(g, int) or g < 1):
        raise AmpConfigError(
            f"{type(obj).__name__}.max_consecutive_skips must be an int >= 1 or None "
            f"(no guard), got {g!r}"
        )


class _StateDictMixin:
    """``state_dict`` / ``from_state_dict`` for a frozen dataclass: every field, plus its kind."""

    kind: ClassVar[str]

    def state_dict(self) -> dict[str, Any]:
        """All fields (state and config), plain Python values; JSON-serialisable."""
        d = {"kind": self.kind}
        d.update(dataclasses.asdict(self))  # type: ignore[call-overload]
        return d

    @classmethod
    def from_state_dict(cls, d: dict[str, Any]):
        """Rebuild exactly the state ``state_dict`` returned (validated like a new one)."""
        d = dict(d)
        kind = d.pop("kind", cls.kind)
        if kind != cls.kind:
            raise AmpConfigError(
                f"state_dict is for a {kind!r} loss scale, not {cls.kind!r}; "
                f"use amp_adapters.loss_scale_from_state_dict to load any kind"
            )
        fields = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        unknown = sorted(set(d) - fields)
        if unknown:
            raise AmpConfigError(f"unknown keys in {cls.__name__} state_dict: {unknown}")
        return cls(**d)


@dataclass(frozen=True)
class DynamicLossScale(_StateDictMixin):
    """Dynamic loss scaling: back off on overflow, grow after a run of clean steps.

    State: ``scale``, ``good_steps`` (clean steps since the last change),
    ``bad_steps`` (overflows in a row, reset at ``hysteresis``),
    ``total_steps``, ``skipped_steps`` and ``consecutive_skips``.
    """

    kind: ClassVar[str] = "dynamic"
    checks_overflow: ClassVar[bool] = True

    scale: float = 2.0**16
    good_steps: int = 0
    bad_steps: int = 0
    total_steps: int = 0
    skipped_steps: int = 0
    consecutive_skips: int = 0
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000
    hysteresis: int = 1
    min_scale: float = 1.0
    max_scale: float = 2.0**24
    max_consecutive_skips: Optional[int] = 64

    def __post_init__(self) -> None:
        name = type(self).__name__
        for field in ("scale", "growth_factor", "backoff_factor", "min_scale", "max_scale"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
                raise AmpConfigError(f"{name}.{field} must be a number, got {value!r}")
            is_scale = field in ("scale", "min_scale", "max_scale")
            object.__setattr__(self, field, _f32(value) if is_scale else float(value))
        if not self.growth_factor > 1:
            raise AmpConfigError(f"{name}.growth_factor must be > 1, got {self.growth_factor!r}")
        if not 0 < self.backoff_factor < 1:
            raise AmpConfigError(
                f"{name}.backoff_factor must be in (0, 1), got {self.backoff_factor!r}"
            )
        for field in ("growth_interval", "hysteresis"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise AmpConfigError(f"{name}.{field} must be an int >= 1, got {value!r}")
        _check_steps(self, "good_steps", "bad_steps", "total_steps", "skipped_steps",
                     "consecutive_skips")
        _check_guard(self)
        if not 0 <= self.min_scale <= self.max_scale:
            raise AmpConfigError(
                f"{name} needs 0 <= min_scale <= max_scale, got min_scale={self.min_scale!r}, "
                f"max_scale={self.max_scale!r}"
            )
        if not (self.min_scale <= self.scale <= self.max_scale) or not math.isfinite(self.scale):
            raise AmpConfigError(
                f"{name}.scale must be finite and within [min_scale, max_scale] = "
                f"[{self.min_scale:g}, {self.max_scale:g}], got {self.scale!r}"
            )

    def adjust(self, found_inf: bool) -> "DynamicLossScale":
        """The state after one step that did (``found_inf``) or did not overflow."""
        replace = dataclasses.replace
        total = self.total_steps + 1
        if found_inf:
            bad, scale = self.bad_steps + 1, self.scale
            if bad == self.hysteresis:
                scale, bad = max(_mul_f32(scale, self.backoff_factor), self.min_scale), 0
            return replace(self, scale=scale, good_steps=0, bad_steps=bad, total_steps=total,
                           skipped_steps=self.skipped_steps + 1,
                           consecutive_skips=self.consecutive_skips + 1)
        good, scale = self.good_steps + 1, self.scale
        if good == self.growth_interval:
            grown = min(_mul_f32(scale, self.growth_factor), self.max_scale)
            scale, good = (grown if math.isfinite(grown) else scale), 0
        return replace(self, scale=scale, good_steps=good, bad_steps=0, total_steps=total,
                       consecutive_skips=0)

    @property
    def exhausted(self) -> bool:
        """True after ``max_consecutive_skips`` overflow steps in a row."""
        g = self.max_consecutive_skips
        return g is not None and self.consecutive_skips >= g

    @classmethod
    def from_torch(cls, init_scale: float = 2.0**16, growth_factor: float = 2.0,
                   backoff_factor: float = 0.5, growth_interval: int = 2000,
                   **kw: Any) -> "DynamicLossScale":
        """``torch.amp.GradScaler`` semantics: hysteresis 1, no floor, no ceiling."""
        return cls(scale=init_scale, growth_factor=growth_factor, backoff_factor=backoff_factor,
                   growth_interval=growth_interval, hysteresis=1, min_scale=0.0,
                   max_scale=math.inf, **kw)

    @classmethod
    def from_paddle(cls, init_loss_scaling: float = 2.0**16, incr_every_n_steps: int = 2000,
                    decr_every_n_nan_or_inf: int = 1, incr_ratio: float = 2.0,
                    decr_ratio: float = 0.5, **kw: Any) -> "DynamicLossScale":
        """Paddle's ``update_loss_scaling`` op semantics: floor 1, no ceiling, float32 ratios."""
        return cls(scale=init_loss_scaling, growth_interval=incr_every_n_steps,
                   hysteresis=decr_every_n_nan_or_inf, growth_factor=_f32(incr_ratio),
                   backoff_factor=_f32(decr_ratio), min_scale=1.0, max_scale=math.inf, **kw)

    @classmethod
    def from_mxnet(cls, **kw: Any) -> "DynamicLossScale":
        """``mxnet.contrib.amp.LossScaler``'s constants (2**16, x2 per 2000, /2, cap 2**24, no
        floor), without its one-step lag in applying a new scale."""
        return cls(**{"scale": 2.0**16, "growth_interval": 2000, "min_scale": 0.0,
                      "max_scale": 2.0**24, **kw})


@dataclass(frozen=True)
class StaticLossScale(_StateDictMixin):
    """A fixed scale. Overflow steps are still detected and skipped (and counted)."""

    kind: ClassVar[str] = "static"
    checks_overflow: ClassVar[bool] = True

    scale: float = 2.0**10
    total_steps: int = 0
    skipped_steps: int = 0
    consecutive_skips: int = 0
    max_consecutive_skips: Optional[int] = 64

    def __post_init__(self) -> None:
        if (isinstance(self.scale, bool) or not isinstance(self.scale, (int, float))
                or not math.isfinite(self.scale) or self.scale <= 0):
            raise AmpConfigError(f"StaticLossScale.scale must be finite and > 0, got {self.scale!r}")
        object.__setattr__(self, "scale", _f32(self.scale))
        _check_steps(self, "total_steps", "skipped_steps", "consecutive_skips")
        _check_guard(self)

    def adjust(self, found_inf: bool) -> "StaticLossScale":
        """Count the step; the scale never moves."""
        return dataclasses.replace(
            self, total_steps=self.total_steps + 1,
            skipped_steps=self.skipped_steps + bool(found_inf),
            consecutive_skips=self.consecutive_skips + 1 if found_inf else 0)

    exhausted = DynamicLossScale.exhausted


@dataclass(frozen=True)
class NoOpLossScale(_StateDictMixin):
    """No scaling (scale 1) and no overflow check: bf16 and fp32 need none."""

    kind: ClassVar[str] = "none"
    checks_overflow: ClassVar[bool] = False

    total_steps: int = 0

    def __post_init__(self) -> None:
        _check_steps(self, "total_steps")

    @property
    def scale(self) -> float:
        return 1.0

    @property
    def skipped_steps(self) -> int:
        return 0

    @property
    def exhausted(self) -> bool:
        return False

    def adjust(self, found_inf: bool) -> "NoOpLossScale":
        """Count the step; ``found_inf`` is ignored (nothing is checked, nothing skipped)."""
        return dataclasses.replace(self, total_steps=self.total_steps + 1)


LossScale = Union[DynamicLossScale, StaticLossScale, NoOpLossScale]
LOSS_SCALE_KINDS = {c.kind: c for c in (DynamicLossScale, StaticLossScale, NoOpLossScale)}


def loss_scale_from_state_dict(d: dict[str, Any]) -> LossScale:
    """Rebuild any loss scale from its ``state_dict()`` (dispatches on ``d['kind']``)."""
    kind = d.get("kind")
    if kind not in LOSS_SCALE_KINDS:
        raise UnknownChoiceError("loss-scale kind", kind, LOSS_SCALE_KINDS)
    return LOSS_SCALE_KINDS[kind].from_state_dict(d)


def loss_scale_from_config(d: dict[str, Any]) -> LossScale:
    """Build a loss scale from a policy file's ``[loss_scale]`` table.

    ``kind`` is ``dynamic`` (default), ``static`` or ``none``; the other keys are
    the dataclass fields, with ``init_scale`` accepted for ``scale``.
    """
    d = dict(d)
    kind = d.pop("kind", "dynamic")
    if kind not in LOSS_SCALE_KINDS:
        raise UnknownChoiceError("loss-scale kind", kind, LOSS_SCALE_KINDS)
    if "init_scale" in d:
        d["scale"] = d.pop("init_scale")
    cls = LOSS_SCALE_KINDS[kind]
    fields = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    for key in d:
        if key not in fields:
            raise UnknownChoiceError(f"[loss_scale] key for kind {kind!r}", key, sorted(fields))
    if d.get("max_scale") == "inf":
        d["max_scale"] = math.inf
    return cls(**d)
