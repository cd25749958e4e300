"""``GradScaler`` / ``AmpScaler``: ``paddle.amp``'s scaler on the core loss-scale state machine.

The native's surface and defaults (``AmpScaler``: 2**15, 1000 steps; ``GradScaler``: 2**16,
2000 steps; both ``decr_every_n_nan_or_inf=1``), its per-optimizer stages and their errors
(``unscale_`` twice, ``unscale_`` after ``step``, ``step`` twice), and its state dict keys.
What differs, and why:

- it works on a CPU (the native turns itself off there);
- the moves are the core's (``amp_adapters.rules.loss_scale.step`` on a ``LossScaleConfig``: no
  third copy of the rule). Without ``policy=`` the config is the native's rule: float32
  ratios, no floor, no ceiling; with it, the policy's ``[loss_scale]``;
- an overflow step is skipped on the host: the optimizer is not called, so parameters and
  every optimizer moment (Adam's beta powers too) stay bit-identical. The native hands
  ``found_inf`` to the optimizer, and an optimizer that does not read it (SGD) updates
  with non-finite gradients. Cost: one host read of ``found_inf`` per step;
- ``found_inf`` is agreed across data-parallel ranks (``paddle.distributed``, any backend:
  gloo on a CPU), so one rank's overflow skips the step on all;
- ``OverflowGuardError`` (naming the parameters with non-finite gradients) after
  ``max_consecutive_skips`` overflows in a row or a scale collapsed to 0, instead of
  skipping forever;
- ``state_dict()`` has the native's keys (``scale`` as a float32 array of one, the ratios
  and intervals, ``incr_count``, ``decr_count``, ``use_dynamic_loss_scaling``) and one more,
  ``amp_adapters_counters`` (total, skipped and consecutive skips), which a native scaler
  ignores; ``load_state_dict`` takes the config from the dict, as the native does, checks
  every key first (a missing key, a wrong type, a negative counter, a non-finite scale is
  an error naming it) and changes nothing on error;
- a setter refuses a value the native asserts against, with the same checks, and keeps
  the state; a counter the new interval would never reach is carried to one below it.

Under a bfloat16 region a dynamic scaler turns itself off at ``scale()``, with the native's
warning: bfloat16 has float32's exponent range and needs no loss scaling.
"""
from __future__ import annotations

import dataclasses
import logging
import math
import warnings
from collections import defaultdict
from typing import Any, Optional

import numpy as np

from amp_adapters import AmpConfigError, LossScaleConfig, LossScaleState, resolve_policy
from amp_adapters.rules.errors import check_flag
from amp_adapters.rules.loss_scale import check_guard, check_state, step
from amp_adapters.rules.loss_scale.checks import f32

from . import frames, masters

log = logging.getLogger("paddle_amp.dygraph")

INIT, UNSCALED, STEPPED = "init", "unscaled", "stepped"  # an optimizer's stage since update()
COUNTERS_KEY = "amp_adapters_counters"
# the native's argument names -> the core config's
NATIVE_FIELDS = {"incr_ratio": "growth_factor", "decr_ratio": "backoff_factor",
                 "incr_every_n_steps": "growth_interval",
                 "decr_every_n_nan_or_inf": "hysteresis"}
_UNSET = object()


def native_config(init_loss_scaling: Any, incr_ratio: Any, decr_ratio: Any,
                  incr_every_n_steps: Any, decr_every_n_nan_or_inf: Any,
                  use_dynamic_loss_scaling: Any, base: Optional[LossScaleConfig] = None,
                  where: str = "GradScaler") -> LossScaleConfig:
    """The core config of the native scaler arguments (on ``base``'s other constants; default:
    the native's own, no floor and no ceiling), each checked with its native name."""
    check_flag(f"{where} use_dynamic_loss_scaling", use_dynamic_loss_scaling)
    base = base or LossScaleConfig(min_scale=0.0, max_scale=math.inf)
    values = {"init_loss_scaling": init_loss_scaling, "incr_ratio": incr_ratio,
              "decr_ratio": decr_ratio, "incr_every_n_steps": incr_every_n_steps,
              "decr_every_n_nan_or_inf": decr_every_n_nan_or_inf}
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, (int, float, np.number)):
            raise AmpConfigError(f"{where}: {name} must be a number, got {value!r}")
    fields = {NATIVE_FIELDS[k]: v for k, v in values.items() if k in NATIVE_FIELDS}
    fields["growth_factor"] = f32(float(fields["growth_factor"]))
    fields["backoff_factor"] = f32(float(fields["backoff_factor"]))
    try:
        return dataclasses.replace(base, kind="dynamic" if use_dynamic_loss_scaling else
                                   "static", init_scale=float(init_loss_scaling), **fields)
    except AmpConfigError as e:
        names = {v: k for k, v in NATIVE_FIELDS.items()} | {"init_scale": "init_loss_scaling"}
        text = str(e)
        for core, native in names.items():
            text = text.replace(f"LossScaleConfig.{core}", native)
        raise AmpConfigError(f"{where}: {text}") from None


class AmpScaler:
    """``paddle.amp.AmpScaler`` (see the module docstring); ``policy=``: its loss scale."""

    _DEFAULTS = dict(init_loss_scaling=2.0**15, incr_every_n_steps=1000)

    def __init__(self, enable: Any = True, init_loss_scaling: Any = _UNSET,
                 incr_ratio: Any = _UNSET, decr_ratio: Any = _UNSET,
                 incr_every_n_steps: Any = _UNSET, decr_every_n_nan_or_inf: Any = _UNSET,
                 use_dynamic_loss_scaling: Any = _UNSET, *, policy: Any = None) -> None:
        where = type(self).__name__
        check_flag(f"{where} enable", enable)
        given = {k: v for k, v in dict(
            init_loss_scaling=init_loss_scaling, incr_ratio=incr_ratio, decr_ratio=decr_ratio,
            incr_every_n_steps=incr_every_n_steps,
            decr_every_n_nan_or_inf=decr_every_n_nan_or_inf,
            use_dynamic_loss_scaling=use_dynamic_loss_scaling).items() if v is not _UNSET}
        if policy is not None:
            config = resolve_policy(policy, device_type="cpu").loss_scale_config
            if given:
                raise AmpConfigError(
                    f"{where}: {', '.join(sorted(given))} given beside policy=: the policy's "
                    f"[loss_scale] holds the scaler's constants; set them there")
        else:
            args = {"init_loss_scaling": 2.0**16, "incr_ratio": 2.0, "decr_ratio": 0.5,
                    "incr_every_n_steps": 2000, "decr_every_n_nan_or_inf": 1,
                    "use_dynamic_loss_scaling": True, **self._DEFAULTS, **given}
            config = native_config(**args, where=where)
        self._enable = bool(enable) and config.checks_overflow
        self._off_for: Optional[str] = None  # the dtype under which scale() turned it off
        self._config = config
        self._state = LossScaleState.initial(config)
        self._init_loss_scaling = config.init_scale
        self._found_inf = False  # any optimizer's gradients not finite, this step
        self._found: dict[int, bool] = {}  # id(optimizer) -> its gradients not finite
        self._cache_found_inf: Optional[bool] = None
        self._stages: dict[int, str] = defaultdict(lambda: INIT)
        self._params: list = []
        self._window = None

    # -- the loss-scale value --------------------------------------------------------------
    @property
    def _dynamic(self) -> bool:
        return self._config.kind == "dynamic"

    def loss_scale(self) -> tuple[LossScaleConfig, LossScaleState]:
        """The core records: (config, state)."""
        return self._config, self._state

    def scale(self, var):
        """``var`` times the current loss scale (``var`` itself when disabled)."""
        from paddle.base import core
        if not isinstance(var, core.eager.Tensor):
            raise TypeError(f"{type(self).__name__}.scale(): var must be a paddle Tensor, got "
                            f"{type(var).__name__}")
        if self._enable and self._dynamic and frames.last_dtype() != "float16":
            self._turn_off(frames.last_dtype())
            warnings.warn(f"It is not recommended to use dynamic loss scaling for "
                          f"{frames.last_dtype()}, so GradScaler is disable by default.")
        if not self._enable:
            return var
        return var * float(self._state.scale)

    # -- the optimizer stages --------------------------------------------------------------
    @staticmethod
    def _parameters(optimizer) -> list:
        return masters.optimizer_params(optimizer)

    def _unscale(self, optimizer) -> None:
        if not self._enable:
            return
        stage = self._stages[id(optimizer)]
        if stage == UNSCALED:
            raise RuntimeError("unscale_() has already been called on this optimizer since "
                               "the last update().")
        if stage == STEPPED:
            raise RuntimeError("unscale_() is being called after step().")
        import paddle
        from paddle import _legacy_C_ops
        params = self._parameters(optimizer)
        self._params += params  # every optimizer's this step: what the guard names
        by_dtype: dict[Any, list] = {}
        low = []
        for p in params:
            g = p._grad_ivar()
            if g is not None:
                if g.dtype in (paddle.float16, paddle.bfloat16):
                    low.append(p)
                else:
                    by_dtype.setdefault(g.dtype, []).append(g)
        if low:  # O2's low gradients, widened (exact): no CPU kernel unscales them
            masters.widen_grads(low)
            by_dtype.setdefault(paddle.float32, []).extend(p._grad_ivar() for p in low)
        scale = paddle.to_tensor(np.array([self._state.scale], np.float32))
        found = False
        for grads in by_dtype.values():
            flag = paddle.to_tensor(np.array([False]))
            _legacy_C_ops.check_finite_and_unscale(grads, scale, grads, flag)
            found = found or bool(flag.numpy().any())  # the one host read per step
        self._found[id(optimizer)] = _agreed(found)
        self._found_inf = any(self._found.values())
        self._stages[id(optimizer)] = UNSCALED

    def unscale_(self, optimizer) -> None:
        """Divide ``optimizer``'s gradients by the scale, and note whether any is not finite."""
        self._unscale(optimizer)

    def minimize(self, optimizer, *args: Any, **kwargs: Any):
        """Unscale (unless done), ``optimizer.minimize(*args, **kwargs)`` unless a gradient is
        not finite (then nothing is touched), then move the scale."""
        if not self._enable:
            return optimizer.minimize(*args, **kwargs)
        if self._stages[id(optimizer)] == INIT:
            self._unscale(optimizer)
        result: Any = (None, None)
        found = self._found[id(optimizer)]
        self._cache_found_inf = bool(self._cache_found_inf) or found
        if not found:
            result = optimizer.minimize(*args, **kwargs)
        self._update()
        self._stages = defaultdict(lambda: INIT)
        return result

    def _update(self) -> None:
        """One transition of the core state machine, then the guard."""
        if self._cache_found_inf is None:
            return
        found, self._cache_found_inf = self._cache_found_inf, None
        old = self._state.scale
        params, self._params, self._found = self._params, [], {}
        self._state = step(self._config, self._state, found)
        if self._state.scale < old:
            log.debug("Found inf or nan, current scale is: %g, decrease to: %g", old,
                     self._state.scale)
        self._window = check_guard(self._config, self._state, lambda: _nonfinite(params),
                                   self._window)

    # -- getters and setters ---------------------------------------------------------------
    def is_enable(self) -> bool:
        return self._enable

    def is_use_dynamic_loss_scaling(self) -> bool:
        return self._enable and self._dynamic

    def get_init_loss_scaling(self) -> float:
        return self._init_loss_scaling

    def set_init_loss_scaling(self, new_init_loss_scaling: Any) -> None:
        """Set the initial scale and restart the current scale from it (as the native)."""
        config = native_config(new_init_loss_scaling, *self._native_rule(),
                               base=self._config, where=type(self).__name__)
        self._set(config, dataclasses.replace(self._state, scale=config.init_scale))
        self._init_loss_scaling = config.init_scale

    def _native_rule(self) -> tuple:
        c = self._config
        return (c.growth_factor, c.backoff_factor, c.growth_interval, c.hysteresis,
                c.kind == "dynamic")

    def _set_field(self, native: str, value: Any) -> None:
        rule = dict(zip(("incr_ratio", "decr_ratio", "incr_every_n_steps",
                         "decr_every_n_nan_or_inf", "use_dynamic_loss_scaling"),
                        self._native_rule()))
        rule[native] = value
        config = native_config(self._config.init_scale, **rule, base=self._config,
                               where=type(self).__name__)
        state = dataclasses.replace(
            self._state, good_steps=min(self._state.good_steps, config.growth_interval - 1),
            bad_steps=min(self._state.bad_steps, config.hysteresis - 1))
        self._set(config, state)

    def _restore(self, config: LossScaleConfig, state: LossScaleState) -> None:
        """Take a checkpoint's loss scale (``checkpoint.load_checkpoint``): config and state."""
        self._set(config, state)
        self._init_loss_scaling = config.init_scale
        self._stages = defaultdict(lambda: INIT)

    def _turn_off(self, dtype: str) -> None:
        """Off, as ``scale()`` turns a dynamic scaler off under a ``dtype`` (bfloat16) region;
        a checkpoint records it so a resume turns a fresh scaler off the same way."""
        self._enable, self._off_for = False, dtype

    def _set(self, config: LossScaleConfig, state: LossScaleState) -> None:
        check_state(config, state, f"{type(self).__name__}.{{}}".format)
        self._config, self._state = config, state

    def get_incr_ratio(self) -> float:
        return self._config.growth_factor

    def set_incr_ratio(self, new_incr_ratio: Any) -> None:
        self._set_field("incr_ratio", new_incr_ratio)

    def get_decr_ratio(self) -> float:
        return self._config.backoff_factor

    def set_decr_ratio(self, new_decr_ratio: Any) -> None:
        self._set_field("decr_ratio", new_decr_ratio)

    def get_incr_every_n_steps(self) -> int:
        return self._config.growth_interval

    def set_incr_every_n_steps(self, new_incr_every_n_steps: Any) -> None:
        self._set_field("incr_every_n_steps", new_incr_every_n_steps)

    def get_decr_every_n_nan_or_inf(self) -> int:
        return self._config.hysteresis

    def set_decr_every_n_nan_or_inf(self, new_decr_every_n_nan_or_inf: Any) -> None:
        self._set_field("decr_every_n_nan_or_inf", new_decr_every_n_nan_or_inf)

    # -- checkpoints ----------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The native's keys (empty when disabled, as the native), plus the counters it
        lacks under ``amp_adapters_counters``."""
        if not self._enable:
            return {}
        c, s = self._config, self._state
        return {"scale": np.array([s.scale], np.float32), "incr_ratio": c.growth_factor,
                "decr_ratio": c.backoff_factor, "incr_every_n_steps": c.growth_interval,
                "decr_every_n_nan_or_inf": c.hysteresis, "incr_count": s.good_steps,
                "decr_count": s.bad_steps, "use_dynamic_loss_scaling": c.kind == "dynamic",
                COUNTERS_KEY: {"total_steps": s.total_steps, "skipped_steps": s.skipped_steps,
                               "consecutive_skips": s.consecutive_skips}}

    def load_state_dict(self, state_dict: Any) -> None:
        """Load a state dict of ours or of a native scaler (its config included). Every key
        is checked before anything changes."""
        if not self._enable:
            return
        where = f"{type(self).__name__}.load_state_dict"
        if not isinstance(state_dict, dict):
            raise AmpConfigError(f"{where}: expected a dict, got {type(state_dict).__name__}")
        if len(state_dict) == 0:
            raise RuntimeError("The input state dict is empty, possibly because it was saved "
                               "from a disabled instance of GradScaler.")
        keys = ("scale", "incr_ratio", "decr_ratio", "incr_every_n_steps",
                "decr_every_n_nan_or_inf", "incr_count", "decr_count",
                "use_dynamic_loss_scaling")
        missing = [k for k in keys if k not in state_dict]
        if missing:
            raise AmpConfigError(f"{where}: missing key {missing[0]!r} (a GradScaler state dict "
                                 f"has {', '.join(keys)})")
        scale = _scale_value(state_dict["scale"], where)
        counters = {"incr_count": state_dict["incr_count"],
                    "decr_count": state_dict["decr_count"],
                    **dict(state_dict.get(COUNTERS_KEY) or {})}
        for k, v in counters.items():
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0:
                raise AmpConfigError(f"{where}: {k!r} must be a whole number >= 0, got {v!r}")
        extra = set(counters) - {"incr_count", "decr_count", "total_steps", "skipped_steps",
                                 "consecutive_skips"}
        if extra:
            raise AmpConfigError(f"{where}: unknown key {sorted(extra)[0]!r} in {COUNTERS_KEY}")
        config = native_config(scale, state_dict["incr_ratio"], state_dict["decr_ratio"],
                               state_dict["incr_every_n_steps"],
                               state_dict["decr_every_n_nan_or_inf"],
                               state_dict["use_dynamic_loss_scaling"], base=self._config,
                               where=where)
        skipped = int(counters.get("skipped_steps", 0))
        state = LossScaleState(
            scale=config.init_scale if config.kind != "dynamic" else scale,
            good_steps=int(counters["incr_count"]) if config.kind == "dynamic" else 0,
            bad_steps=int(counters["decr_count"]) if config.kind == "dynamic" else 0,
            total_steps=int(counters.get("total_steps", skipped)), skipped_steps=skipped,
            consecutive_skips=int(counters.get("consecutive_skips", 0)))
        check_state(config, state, lambda f: f"{where}: state {f}")
        self._config, self._state, self._init_loss_scaling = config, state, scale
        self._stages = defaultdict(lambda: INIT)


def _agreed(found: bool) -> bool:
    """``found`` agreed across the data-parallel ranks (any rank's overflow skips the step
    on every rank, so their parameters and scales stay equal): an all-reduce (max) where
    ``paddle.distributed`` is initialized with more than one rank, else ``found``. Needed
    wherever gradients are not summed before the check (no ``DataParallel``, ``no_sync``
    accumulation, sharded gradients); with them summed it agrees anyway, at one small
    collective per step."""
    import paddle.distributed as dist
    if not dist.is_initialized() or dist.get_world_size() < 2:
        return found
    import paddle
    flag = paddle.to_tensor(np.array([int(found)], np.int32))
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())


def _scale_value(value: Any, where: str) -> float:
    """The scale of a state dict: the native's float32 array of one (or a number)."""
    arr = np.asarray(value.numpy() if hasattr(value, "numpy") else value)
    if arr.size != 1 or arr.dtype.kind not in "fiu":
        raise AmpConfigError(f"{where}: 'scale' must be one number (the native saves a float32 "
                             f"array of one), got {value!r}")
    scale = float(arr.reshape(-1)[0])
    if not (math.isfinite(scale) and scale > 0):
        raise AmpConfigError(f"{where}: 'scale' must be finite and > 0, got {scale!r}")
    return scale


def _nonfinite(params: list) -> list[str]:
    """The names of ``params`` whose gradient is not finite (the guard's error names them)."""
    import paddle
    return [p.name for p in params if p._grad_ivar() is not None
            and not bool(paddle.isfinite(p._grad_ivar()).all())]


class GradScaler(AmpScaler):
    """``paddle.amp.GradScaler``: ``AmpScaler`` with its defaults (2**16, 2000 steps), and
    ``step`` / ``update`` for ``scaler.step(opt); scaler.update()``."""

    _DEFAULTS = dict(init_loss_scaling=2.0**16, incr_every_n_steps=2000)

    def step(self, optimizer) -> None:
        """Unscale (unless done), then ``optimizer.step()`` unless a gradient is not finite."""
        if not self._enable:
            return optimizer.step()
        stage = self._stages[id(optimizer)]
        if stage == STEPPED:
            raise RuntimeError("step() has already been called since the last update().")
        if stage == INIT:
            self._unscale(optimizer)
        found = self._found[id(optimizer)]  # this optimizer's own gradients decide its step
        self._cache_found_inf = bool(self._cache_found_inf) or found  # any: the scale moves
        if not found:
            optimizer.step()
        self._stages[id(optimizer)] = STEPPED
        if not self._dynamic:
            self._update()
            self._stages = defaultdict(lambda: INIT)

    def update(self) -> None:
        """Move the scale after ``step`` (a static scale: done in ``step``)."""
        if not self._enable:
            return
        if self._dynamic:
            self._update()
            self._stages = defaultdict(lambda: INIT)

    def unscale_(self, optimizer) -> None:
        return super().unscale_(optimizer)
