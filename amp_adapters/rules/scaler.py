"""The user-facing loss scales: a config and its current state as one immutable value.

``DynamicLossScale``, ``StaticLossScale`` and ``NoOpLossScale`` are the names
users write (flat fields: ``scale``, the counters, the config). Each is a thin
view of the core's two records (``.config``: a ``LossScaleConfig``; ``.state``: a
``LossScaleState``, see ``amp_adapters.rules.loss_scale``), validated by them, and
``adjust(found_inf)`` is ``loss_scale.step``: the one transition. ``from_torch``,
``from_paddle`` and ``from_mxnet`` take those libraries' argument names and give
their exact transitions (see ``loss_scale.update`` for the float32 rounding rule).

A backend skips the optimizer update whenever ``found_inf`` is true and
``checks_overflow`` is set, then uses the returned value's ``scale`` for the
very next step (no lag); ``loss_scale.check_guard`` tells it to stop with
``OverflowGuardError`` instead of skipping forever.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, ClassVar, Optional, Union

from .errors import AmpConfigError, OverflowGuardError, UnknownChoiceError, check_choice
from .loss_scale import (FIELDS, LossScaleConfig, LossScaleState, check_guard, load_state,
                         state_dict, step)
from .loss_scale.checks import f32 as _f32
from .loss_scale.checks import real as _real
from .loss_scale.consistency import check_state

_STATE = FIELDS  # the state fields, as LossScaleState defines them
_CONFIG_FIELDS = tuple(f.name for f in dataclasses.fields(LossScaleConfig))


def _fields_of(*, state: tuple[str, ...], config: tuple[str, ...],
               defaults: Optional[dict[str, Any]] = None):
    """Class decorator: give a loss-scale view the named fields of ``LossScaleState`` and
    ``LossScaleConfig`` (in that order, with the records' types and defaults unless
    ``defaults`` says otherwise), after which its own annotations come, and make it a
    frozen dataclass. The records stay the one definition of every field and default."""
    def build(cls):
        declared: dict[str, Any] = {}
        for record, names in ((LossScaleState, state), (LossScaleConfig, config)):
            fields = {f.name: f for f in dataclasses.fields(record)}
            for name in names:
                declared[name] = fields[name].type
                setattr(cls, name, (defaults or {}).get(name, fields[name].default))
        cls.__annotations__ = {**declared, **cls.__dict__.get("__annotations__", {})}
        return dataclass(frozen=True)(cls)
    return build


class _View:
    """What the three loss scales share: the core records, the step, the state dict."""

    kind: ClassVar[str]
    checks_overflow: ClassVar[bool] = True

    def _records(self) -> tuple[LossScaleConfig, LossScaleState]:  # pragma: no cover
        raise NotImplementedError

    def _config(self, **fixed: Any) -> LossScaleConfig:
        """The config: this view's config fields, plus what its kind fixes."""
        mine = self._fields()
        given = {k: getattr(self, k) for k in _CONFIG_FIELDS if k in mine and k not in fixed}
        return LossScaleConfig(kind=self.kind, **given, **fixed)

    def __post_init__(self) -> None:
        config, state = self._records()
        check_state(config, state, f"{type(self).__name__}.{{}}".format)
        self._store(config, state)

    def _store(self, config: LossScaleConfig, state: LossScaleState) -> None:
        mine = self._fields()
        for rec, names in ((config, _CONFIG_FIELDS), (state, _STATE)):
            for k in names:
                if k in mine:
                    object.__setattr__(self, k, getattr(rec, k))
        object.__setattr__(self, "_config", config)
        object.__setattr__(self, "_state", state)

    @classmethod
    def _fields(cls) -> tuple[str, ...]:
        """This class's dataclass field names (cached: ``adjust`` runs every step)."""
        cached = cls.__dict__.get("_field_names")
        if cached is None:
            cached = tuple(f.name for f in dataclasses.fields(cls))  # type: ignore[arg-type]
            cls._field_names = cached  # type: ignore[attr-defined]
        return cached

    @property
    def config(self) -> LossScaleConfig:
        """The constants (what a ``Policy`` holds and a program bakes in)."""
        return self._config  # type: ignore[attr-defined]

    @property
    def state(self) -> LossScaleState:
        """The changing part (what a checkpoint stores)."""
        return self._state  # type: ignore[attr-defined]

    @classmethod
    def from_parts(cls, config: LossScaleConfig, state: LossScaleState):
        """The value of ``config`` at ``state``, which must not contradict it (``check_state``)."""
        check_state(config, state)
        return cls._at(config, state)

    @classmethod
    def _at(cls, config: LossScaleConfig, state: LossScaleState):
        """``from_parts`` for a state the machine reached (not re-checked: ``adjust``)."""
        klass = LOSS_SCALE_KINDS[config.kind]
        new = object.__new__(klass)
        fields = klass._fields()
        for name in fields:
            object.__setattr__(new, name, None)
        if "init_scale" in fields:
            object.__setattr__(new, "init_scale", config.init_scale)
        new._store(config, state)
        return new

    def with_state(self, state: LossScaleState):
        """This config at ``state``."""
        return self.from_parts(self.config, state)

    def adjust(self, found_inf: bool):
        """The value after one step that did (``found_inf``) or did not overflow."""
        return self._at(self.config, step(self.config, self.state, found_inf))

    @property
    def exhausted(self) -> bool:
        """True when ``loss_scale.check_guard`` would raise for this state."""
        try:
            check_guard(self.config, self.state)
        except OverflowGuardError:  # the guard's answer is "stop"
            return True
        return False

    def state_dict(self) -> dict[str, Any]:
        """The strict checkpoint form: format version, kind, config, state (plain values)."""
        return state_dict(self.config, self.state)

    def with_state_dict(self, d: Any):
        """This config at the state of ``d``, whose recorded config must equal this one."""
        _, state = load_state(d, self.config)
        return self.with_state(state)

    @classmethod
    def from_state_dict(cls, d: Any):
        """Rebuild exactly the value ``state_dict`` returned (its own config)."""
        value = loss_scale_from_state_dict(d)
        if not isinstance(value, cls):
            raise AmpConfigError(
                f"state_dict is for a {value.kind!r} loss scale, not {cls.kind!r}; "
                f"use amp_adapters.loss_scale_from_state_dict to load any kind")
        return value


@_fields_of(state=FIELDS, config=tuple(f for f in _CONFIG_FIELDS
                                       if f not in ("kind", "init_scale")))
class DynamicLossScale(_View):
    """Dynamic loss scaling: back off on overflow, grow after a run of clean steps.

    State: ``scale``, ``good_steps`` (clean steps since the last change),
    ``bad_steps`` (overflows in a row, reset at ``hysteresis``), ``total_steps``,
    ``skipped_steps`` and ``consecutive_skips``; then every ``LossScaleConfig`` constant
    (``growth_factor``... ``skip_window``), with the records' defaults. ``init_scale``
    (default: ``scale``) is where the run started; it is part of the config a checkpoint
    is checked against.
    """

    kind: ClassVar[str] = "dynamic"

    init_scale: Optional[float] = None

    def _records(self) -> tuple[LossScaleConfig, LossScaleState]:
        init = self.scale if self.init_scale is None else self.init_scale
        return (self._config(init_scale=init),
                LossScaleState(**{k: getattr(self, k) for k in _STATE}))

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
        ratios = {name: _f32(_real("DynamicLossScale.from_paddle", name, value))
                  for name, value in (("incr_ratio", incr_ratio), ("decr_ratio", decr_ratio))}
        return cls(scale=init_loss_scaling, growth_interval=incr_every_n_steps,
                   hysteresis=decr_every_n_nan_or_inf, growth_factor=ratios["incr_ratio"],
                   backoff_factor=ratios["decr_ratio"], min_scale=1.0, max_scale=math.inf, **kw)

    @classmethod
    def from_mxnet(cls, **kw: Any) -> "DynamicLossScale":
        """``mxnet.contrib.amp.LossScaler``'s constants (2**16, x2 per 2000, /2, cap 2**24, no
        floor), without its one-step lag in applying a new scale."""
        return cls(**{"scale": 2.0**16, "growth_interval": 2000, "min_scale": 0.0,
                      "max_scale": 2.0**24, **kw})


@_fields_of(state=("scale", "total_steps", "skipped_steps", "consecutive_skips"),
            config=("max_consecutive_skips", "max_skip_fraction", "skip_window"),
            defaults={"scale": 2.0**10})
class StaticLossScale(_View):
    """A fixed scale. Overflow steps are still detected and skipped (and counted)."""

    kind: ClassVar[str] = "static"

    def _records(self) -> tuple[LossScaleConfig, LossScaleState]:
        scale = _real("StaticLossScale", "scale", self.scale, allow_inf=True)
        if not (math.isfinite(scale) and scale > 0):
            raise AmpConfigError(f"StaticLossScale.scale must be finite and > 0, "
                                 f"got {self.scale!r:.40}")
        config = self._config(init_scale=self.scale, min_scale=0.0, max_scale=math.inf)
        return config, LossScaleState(scale=config.init_scale, total_steps=self.total_steps,
                                      skipped_steps=self.skipped_steps,
                                      consecutive_skips=self.consecutive_skips)


@_fields_of(state=("total_steps",), config=())
class NoOpLossScale(_View):
    """No scaling (scale 1) and no overflow check: bf16 and fp32 need none."""

    kind: ClassVar[str] = "none"
    checks_overflow: ClassVar[bool] = False

    def _records(self) -> tuple[LossScaleConfig, LossScaleState]:
        config = self._config(init_scale=1.0, min_scale=0.0, max_scale=math.inf)
        return config, LossScaleState(scale=1.0, total_steps=self.total_steps)

    @property
    def scale(self) -> float:
        return 1.0

    @property
    def skipped_steps(self) -> int:
        return 0


LossScale = Union[DynamicLossScale, StaticLossScale, NoOpLossScale]
LOSS_SCALE_KINDS = {c.kind: c for c in (DynamicLossScale, StaticLossScale, NoOpLossScale)}


def loss_scale_from_parts(config: LossScaleConfig,
                          state: Optional[LossScaleState] = None) -> LossScale:
    """The user-facing value of ``config`` at ``state`` (default: its initial state)."""
    if not isinstance(config, LossScaleConfig):
        raise TypeError(f"config must be a LossScaleConfig, got {type(config).__name__}")
    if state is not None and not isinstance(state, LossScaleState):
        raise TypeError(f"state must be a LossScaleState, got {type(state).__name__}")
    return _View.from_parts(config, state or LossScaleState.initial(config))


def loss_scale_from_state_dict(d: Any) -> LossScale:
    """Rebuild any loss scale from its ``state_dict()`` (strict: see ``loss_scale.load_state``)."""
    config, state = load_state(d)
    return loss_scale_from_parts(config, state)


def loss_scale_from_config(d: dict[str, Any]) -> LossScale:
    """Build a loss scale from a policy file's ``[loss_scale]`` table.

    ``kind`` is ``dynamic`` (default), ``static`` or ``none``; the other keys are
    the dataclass fields, with ``init_scale`` accepted for ``scale``.
    """
    d = dict(d)
    kind = check_choice("loss-scale kind", d.pop("kind", "dynamic"), LOSS_SCALE_KINDS)
    if "init_scale" in d:
        d["scale"] = d.pop("init_scale")
    cls = LOSS_SCALE_KINDS[kind]
    fields = {f.name for f in dataclasses.fields(cls)} - {"init_scale"}  # type: ignore[arg-type]
    for key in d:
        if key not in fields:
            raise UnknownChoiceError(f"[loss_scale] key for kind {kind!r}", key, sorted(fields))
    if d.get("max_scale") == "inf":
        d["max_scale"] = math.inf
    if d.get("max_consecutive_skips") is False:  # a file's "no limit" (TOML has no null)
        d["max_consecutive_skips"] = None
    return cls(**d)
