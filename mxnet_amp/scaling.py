"""Loss scaling for a Gluon ``Trainer``: scale the loss, skip overflow steps, move the scale.

``init_trainer`` attaches an ``AmpTrainerState`` as ``trainer._amp_loss_scaler``,
the hook ``Trainer._update`` already calls (``has_overflow``), and checks the
gradients *before* ``Trainer._allreduce_grads`` so that with
``update_on_kvstore=True`` an overflow step never reaches the kvstore (the
native checks too late there and writes NaN weights). With a distributed
kvstore the check runs on the reduced gradients instead, so all workers skip
the same steps (``update_on_kvstore=True`` is refused there). Every gradient on every
device is checked with one host sync per step (see ``overflow``); an overflow
step skips the whole update, so parameters and optimizer state (momentum, Adam
moments and step counts) stay bit-identical. Unscaling is folded into the
optimizer's ``rescale_grad`` through ``trainer._scale``, as in the native, so
it costs nothing. Every scale move is the core's ``loss_scale.update`` (via
``LossScale.adjust``) and every stop the core's ``check_guard``; the new scale
is used by the very next ``scale_loss``.

The per-step protocol is one explicit ``Stage`` (like torch's ``OptState``):
``READY`` -> ``scale_loss`` -> ``SCALED`` -> (``unscale`` -> ``UNSCALED``) ->
``trainer.step``/``update`` -> ``STEPPED``. A misplaced call raises an error
naming the stage it came in. ``scale_loss`` always starts a step afresh: an
overflow answer cached by ``trainer.allreduce_grads()`` for a batch the user
then dropped (no ``update()``) does not leak into the next step.
"""
from __future__ import annotations

import contextlib
import enum
import numbers
from decimal import Decimal
from typing import Any, Iterator, Optional, Union

from mxnet.gluon import Trainer

from amp_adapters import (AmpConfigError, LossScale, LossScaleConfig, Policy, StaticLossScale,
                          loss_scale_from_parts)
from amp_adapters.rules.loss_scale import SkipWindow, check_guard
from amp_adapters.rules.loss_scale.state_dict import check_same_config
from amp_adapters.rules.scaler import LOSS_SCALE_KINDS

from ._mx import unpatched
from .active import active_policy, check_layers
from .native_fields import NativeScalerFields
from .overflow import FiniteCheck


# The trainer whose scale the loss-output functions (SoftmaxOutput...) apply: the first one
# ``init_trainer`` got after ``init``, as natively (its global loss scaler); ``reset`` forgets it.
_loss_output_trainer: Optional["AmpTrainerState"] = None


def loss_output_scale() -> float:
    """The loss scale a loss-output function called now multiplies its ``grad_scale`` by: the
    current scale of that first trainer, 1.0 before there is one."""
    return 1.0 if _loss_output_trainer is None else _loss_output_trainer.loss_scale


def forget_loss_output_trainer() -> None:
    global _loss_output_trainer
    _loss_output_trainer = None


class Stage(enum.Enum):
    """Where a trainer is in its step (the errors of misplaced calls name it)."""

    READY = "READY (no scale_loss yet in this step)"
    SCALED = "SCALED (inside/after scale_loss, gradients still scaled)"
    UNSCALED = "UNSCALED (unscale(trainer) was called in this step)"
    STEPPED = "STEPPED (trainer.step()/update() done; the next step starts at scale_loss)"


class AmpTrainerState(NativeScalerFields):
    """The loss scale of one Trainer and the bookkeeping of the current step.

    As ``trainer._amp_loss_scaler`` it carries the native ``LossScaler``'s fields
    (``_loss_scale``, ``_next_loss_scale``, ``_unskipped``, ``_scale_seq_len``,
    ``_max_loss_scale``, ``loss_scale``) as views of ``state``: reads have the native's
    meaning, writes go through the core (``loss_scale.mxnet_fields``; see
    ``native_fields``), and setting any other attribute raises ``AttributeError``."""

    OWN = frozenset({"trainer", "original_scale", "_check", "state", "last_step_skipped",
                     "nonfinite_params", "stage", "_found_inf", "_pre_unscale", "_window"})

    def __init__(self, trainer: Trainer, loss_scale: LossScale):
        self.trainer = trainer
        self.original_scale: float = trainer._scale
        self._check = FiniteCheck()
        self.reset(loss_scale)
        allreduce = trainer._allreduce_grads

        def _allreduce_grads() -> None:
            if not trainer._distributed:
                if not self._checked_found_inf():  # never push an overflow into the kvstore
                    self._apply_pre_unscale()  # before a kvstore-side optimizer sees them
                    allreduce()
                return
            if trainer._update_on_kvstore:
                raise AmpConfigError("mxnet_amp loss scaling with a distributed kvstore needs "
                                     "update_on_kvstore=False: with the optimizer on the "
                                     "servers an overflow would be applied before any worker "
                                     "could check it")
            allreduce()  # every worker pulls the same reduced gradients (inf + x = inf) ...
            self._checked_found_inf()  # ... so every worker takes the same decision
        trainer._allreduce_grads = _allreduce_grads

    def reset(self, loss_scale: LossScale, last_step_skipped: bool = False) -> None:
        """Start from ``loss_scale`` at stage READY (``init_trainer``, ``load_state_dict``)."""
        self.state: LossScale = loss_scale
        self.last_step_skipped = last_step_skipped
        self.nonfinite_params: list[str] = []
        self.stage = Stage.READY
        self._found_inf: Optional[bool] = None  # this step's answer, once computed
        self._pre_unscale = 1.0  # a part of 1/scale applied to the gradients (huge scales)
        self._window: Optional[SkipWindow] = SkipWindow.at(loss_scale.state)
        self.trainer._scale = self.original_scale

    def begin_step(self) -> float:
        """``scale_loss``: a new step (or another loss of this one) at the current scale.

        New gradients are coming, so an overflow answer cached by ``allreduce_grads()``
        (for a batch then dropped, or before more accumulation) is forgotten."""
        self._found_inf = None
        self.nonfinite_params = []
        self.stage = Stage.SCALED
        scale = self.state.scale
        # MXNet's optimizers refuse a rescale_grad below float32's normal range, so a scale
        # above 2**64 is unscaled in two exact power-of-two parts: 2**-64 on the gradients
        # (one extra pass, only then) and the rest through rescale_grad as usual.
        self._pre_unscale = _SPLIT_UNSCALE if scale > 1 / _SPLIT_UNSCALE else 1.0
        self.trainer._scale = self.original_scale / (scale * self._pre_unscale)
        return scale

    def _apply_pre_unscale(self) -> None:
        """Multiply the gradients by the split-off part of 1/scale, once (see begin_step)."""
        if self._pre_unscale != 1.0:
            _multiply_grads(self.trainer, self._pre_unscale)
            self._pre_unscale = 1.0

    def _checked_found_inf(self) -> bool:
        """Whether this step overflowed; checks once per step (one host sync)."""
        if self._found_inf is None:
            self.nonfinite_params = (self._check.nonfinite(self.trainer._params)
                                     if self.state.checks_overflow else [])
            self._found_inf = bool(self.nonfinite_params)
        return self._found_inf

    def has_overflow(self, params: Any) -> bool:
        """Called by ``Trainer._update`` once per step: True skips the update.

        Moves the scale with the core's transition and asks the core's guard, which
        raises ``OverflowGuardError`` after ``max_consecutive_skips`` overflows in a row,
        when the scale collapsed to 0/a denormal, or on too many skips in a window.
        """
        found_inf = self._checked_found_inf()
        if not found_inf:
            self._apply_pre_unscale()
        self._pre_unscale = 1.0
        self.state = self.state.adjust(found_inf)
        self.last_step_skipped = found_inf
        self._found_inf = None
        self.stage = Stage.STEPPED
        self.trainer._scale = self.original_scale
        self._window = check_guard(self.state.config, self.state.state, self.nonfinite_params,
                                   self._window)
        return found_inf


_SPLIT_UNSCALE = 2.0**-64


def _multiply_grads(trainer: Trainer, factor: float) -> None:
    """Every gradient on every device times ``factor``, in place (no host sync)."""
    with unpatched():
        for p in trainer._params:
            if p.grad_req != "null" and p._grad is not None:
                for g in p.list_grad():
                    g *= factor


def _amp(trainer: Any) -> AmpTrainerState:
    if not isinstance(trainer, Trainer):
        raise TypeError(f"expected a mxnet.gluon.Trainer, got {type(trainer).__name__}; AMP "
                        f"loss scaling works on a Gluon Trainer (not an Optimizer)")
    state = getattr(trainer, "_amp_loss_scaler", None)
    if not isinstance(state, AmpTrainerState):
        raise RuntimeError("this Trainer has no AMP loss scale: call "
                           "mxnet_amp.init_trainer(trainer) after creating it")
    return state


def _is_number(x: Any) -> bool:
    return isinstance(x, (numbers.Real, Decimal)) and not isinstance(x, bool)


def init_trainer(optimizer_or_trainer: Trainer,
                 loss_scale: Union[LossScale, float, None] = None) -> None:
    """Attach loss scaling to the trainer (the native's parameter name; a Gluon ``Trainer``).

    ``loss_scale``: a ``DynamicLossScale`` / ``StaticLossScale`` / ``NoOpLossScale``,
    a ``LossScaleConfig`` (started at its ``init_scale``), a number (a static scale), or
    None for the policy's default (dynamic for float16, none for bfloat16; the policy of
    ``init``, else float16's).
    Calling it again replaces the scale (and starts the step protocol afresh).
    """
    trainer = optimizer_or_trainer
    if not isinstance(trainer, Trainer):
        raise TypeError(f"init_trainer expects a mxnet.gluon.Trainer, got "
                        f"{type(trainer).__name__}; optimizers are not supported, wrap them "
                        f"in gluon.Trainer(params, optimizer)")
    if loss_scale is None:
        loss_scale = (active_policy() or Policy()).loss_scale
    elif _is_number(loss_scale):
        loss_scale = StaticLossScale(scale=loss_scale)
    elif isinstance(loss_scale, LossScaleConfig):
        loss_scale = loss_scale_from_parts(loss_scale)
    elif not isinstance(loss_scale, tuple(LOSS_SCALE_KINDS.values())):
        raise AmpConfigError(f"loss_scale must be a DynamicLossScale, StaticLossScale, "
                             f"NoOpLossScale, LossScaleConfig or a number, got "
                             f"{type(loss_scale).__name__}")
    policy = active_policy()
    if policy is not None and policy.level == "O2":
        from .masters import attach  # O2: float32 masters for the low-precision parameters
        attach(trainer, policy)
    existing = getattr(trainer, "_amp_loss_scaler", None)
    if isinstance(existing, AmpTrainerState):
        existing.reset(loss_scale)
    else:
        trainer._amp_loss_scaler = AmpTrainerState(trainer, loss_scale)
    global _loss_output_trainer
    if _loss_output_trainer is None and policy is not None:
        _loss_output_trainer = trainer._amp_loss_scaler


@contextlib.contextmanager
def scale_loss(loss: Any, optimizer_or_trainer: Trainer) -> Iterator[Any]:
    """Yield ``loss * scale`` (or a list, for a list of losses) to call ``backward`` on.

    Also sets ``trainer._scale = original / scale`` so ``trainer.step`` unscales
    the gradients inside the optimizer update (no extra pass, no host sync).
    """
    trainer = optimizer_or_trainer
    check_layers()  # every block of the step has been called: a layer rule must name one
    scale = _amp(trainer).begin_step()
    with unpatched():
        scaled = ([l * scale for l in loss] if isinstance(loss, (list, tuple)) else loss * scale)
    yield scaled


def unscale(optimizer_or_trainer: Trainer) -> None:
    """Divide the gradients by the scale now (e.g. before clipping), at most once per step.

    Works on every device in place, without a host sync; ``trainer.step`` then
    applies no further unscaling and still skips the update on overflow. Only in
    stage SCALED (after ``scale_loss`` and ``backward``, before ``trainer.step``).
    """
    trainer = optimizer_or_trainer
    amp = _amp(trainer)
    if amp.stage is not Stage.SCALED:
        what = {Stage.UNSCALED: "the gradients are already unscaled; call it at most once per "
                                "step",
                Stage.READY: "no loss was scaled yet: call it after backward() on the loss "
                             "scale_loss yielded",
                Stage.STEPPED: "the step is done: call it between backward() and "
                               "trainer.step()"}[amp.stage]
        raise RuntimeError(f"unscale(trainer) called in stage {amp.stage.value}: {what}")
    factor = trainer._scale / amp.original_scale
    if factor != 1:
        _multiply_grads(trainer, factor)
    amp._apply_pre_unscale()
    trainer._scale = amp.original_scale
    amp.stage = Stage.UNSCALED


def loss_scale(trainer: Trainer) -> LossScale:
    """The trainer's current loss-scale state (immutable: scale, skipped_steps, ...)."""
    return _amp(trainer).state


def last_step_skipped(trainer: Trainer) -> bool:
    """Whether the last ``trainer.step`` was skipped because of an overflow."""
    return _amp(trainer).last_step_skipped


_KEYS = ("loss_scale", "last_step_skipped")


def state_dict(trainer: Trainer) -> dict[str, Any]:
    """The loss-scale state as plain, JSON-serialisable values (save it with the checkpoint):
    ``{"loss_scale": <the core's strict state dict>, "last_step_skipped": bool}``."""
    amp = _amp(trainer)
    return {"loss_scale": amp.state.state_dict(), "last_step_skipped": amp.last_step_skipped}


def load_state_dict(trainer: Trainer, d: dict[str, Any]) -> None:
    """Restore what ``state_dict`` returned, so a resumed run follows the same trajectory.

    Strict: exactly the two keys, the core's checks on ``loss_scale`` (format version,
    keys, types, values) and its recorded config must equal the trainer's (it is
    checked, never applied). Any problem is an ``AmpConfigError`` naming the key and the
    value, and the trainer is left as it was."""
    amp = _amp(trainer)
    if not isinstance(d, dict):
        raise AmpConfigError(f"load_state_dict expects the dict mxnet_amp.state_dict(trainer) "
                             f"returned, got {type(d).__name__}")
    missing = [k for k in _KEYS if k not in d]
    unknown = sorted(map(str, set(d) - set(_KEYS)))
    if missing or unknown:
        key = missing[0] if missing else unknown[0]
        what = "misses the" if missing else "has the unknown"
        raise AmpConfigError(f"mxnet_amp state_dict {what} key {key!r} (expected {list(_KEYS)})")
    skipped = _last_step_skipped(d["last_step_skipped"])
    new = amp.state.with_state_dict(d["loss_scale"])
    amp.reset(new, skipped)


def _last_step_skipped(value: Any) -> bool:
    if not isinstance(value, bool):
        raise AmpConfigError(f"mxnet_amp state_dict['last_step_skipped'] = {value!r}: must be "
                             f"true or false")
    return value


def checked_restore(trainer: Trainer, loss_scale: LossScale, last_step_skipped: Any):
    """Check a loss scale already loaded and validated (a checkpoint's) against ``trainer``'s
    config, and return the function that restores it: a loader checks everything first and
    changes the trainer only after (``load_state_dict`` is this for a plain dict)."""
    amp = _amp(trainer)
    check_same_config(loss_scale.config, amp.state.config)
    skipped = _last_step_skipped(last_step_skipped)
    return lambda: amp.reset(amp.state.with_state(loss_scale.state), skipped)
