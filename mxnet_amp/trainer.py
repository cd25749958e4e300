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
it costs nothing. Every scale move is ``LossScale.adjust(found_inf)``; the new
scale is used by the very next ``scale_loss``.
"""
from __future__ import annotations

import contextlib
from typing import Any, Iterator, Optional, Union

from mxnet.gluon import Trainer

from amp_adapters import (AmpConfigError, LossScale, OverflowGuardError, Policy,
                          StaticLossScale, loss_scale_from_state_dict)
from amp_adapters.scaler import LOSS_SCALE_KINDS

from ._mx import unpatched
from .overflow import FiniteCheck
from .patching import active_policy


class AmpTrainerState:
    """The loss scale of one Trainer and the bookkeeping of the current step."""

    def __init__(self, trainer: Trainer, loss_scale: LossScale):
        self.trainer = trainer
        self.state: LossScale = loss_scale
        self.original_scale: float = trainer._scale
        self.last_step_skipped = False
        self.nonfinite_params: list[str] = []
        self._found_inf: Optional[bool] = None  # this step's answer, once computed
        self._unscaled = False
        self._check = FiniteCheck()
        allreduce = trainer._allreduce_grads

        def _allreduce_grads() -> None:
            if not trainer._distributed:
                if not self._checked_found_inf():  # never push an overflow into the kvstore
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

    @property
    def loss_scale(self) -> float:
        """The current scale (the native ``LossScaler.loss_scale`` attribute)."""
        return self.state.scale

    def _checked_found_inf(self) -> bool:
        """Whether this step overflowed; checks once per step (one host sync)."""
        if self._found_inf is None:
            self.nonfinite_params = (self._check.nonfinite(self.trainer._params)
                                     if self.state.checks_overflow else [])
            self._found_inf = bool(self.nonfinite_params)
        return self._found_inf

    def has_overflow(self, params: Any) -> bool:
        """Called by ``Trainer._update`` once per step: True skips the update.

        Moves the scale with ``adjust(found_inf)`` and raises
        ``OverflowGuardError`` after ``max_consecutive_skips`` overflows in a row.
        """
        found_inf = self._checked_found_inf()
        self.state = self.state.adjust(found_inf)
        self.last_step_skipped = found_inf
        self._found_inf, self._unscaled = None, False
        self.trainer._scale = self.original_scale
        if self.state.exhausted:
            raise OverflowGuardError(self.state.consecutive_skips, self.state.scale,
                                     self.nonfinite_params)
        return found_inf


def _amp(trainer: Any) -> AmpTrainerState:
    if not isinstance(trainer, Trainer):
        raise TypeError(f"expected a mxnet.gluon.Trainer, got {type(trainer).__name__}; AMP "
                        f"loss scaling works on a Gluon Trainer (not an Optimizer)")
    state = getattr(trainer, "_amp_loss_scaler", None)
    if not isinstance(state, AmpTrainerState):
        raise RuntimeError("this Trainer has no AMP loss scale: call "
                           "mxnet_amp.init_trainer(trainer) after creating it")
    return state


def init_trainer(trainer: Trainer, loss_scale: Union[LossScale, float, None] = None) -> None:
    """Attach loss scaling to ``trainer``.

    ``loss_scale``: a ``DynamicLossScale`` / ``StaticLossScale`` / ``NoOpLossScale``,
    a number (a static scale), or None for the policy's default (dynamic for
    float16, none for bfloat16; the policy of ``init``, else float16's).
    Calling it again replaces the scale.
    """
    if not isinstance(trainer, Trainer):
        raise TypeError(f"init_trainer expects a mxnet.gluon.Trainer, got "
                        f"{type(trainer).__name__}; optimizers are not supported, wrap them "
                        f"in gluon.Trainer(params, optimizer)")
    if loss_scale is None:
        loss_scale = (active_policy() or Policy()).loss_scale
    elif isinstance(loss_scale, (int, float)) and not isinstance(loss_scale, bool):
        loss_scale = StaticLossScale(scale=float(loss_scale))
    elif not isinstance(loss_scale, tuple(LOSS_SCALE_KINDS.values())):
        raise AmpConfigError(f"loss_scale must be a DynamicLossScale, StaticLossScale, "
                             f"NoOpLossScale or a number, got {type(loss_scale).__name__}")
    policy = active_policy()
    if policy is not None and policy.level == "O2":
        from .o2 import attach  # O2: float32 masters for the low-precision parameters
        attach(trainer, policy)
    existing = getattr(trainer, "_amp_loss_scaler", None)
    if isinstance(existing, AmpTrainerState):
        existing.state = loss_scale
    else:
        trainer._amp_loss_scaler = AmpTrainerState(trainer, loss_scale)


@contextlib.contextmanager
def scale_loss(loss: Any, trainer: Trainer) -> Iterator[Any]:
    """Yield ``loss * scale`` (or a list, for a list of losses) to call ``backward`` on.

    Also sets ``trainer._scale = original / scale`` so ``trainer.step`` unscales
    the gradients inside the optimizer update (no extra pass, no host sync).
    """
    amp = _amp(trainer)
    scale = amp.state.scale
    trainer._scale = amp.original_scale / scale
    with unpatched():
        scaled = ([l * scale for l in loss] if isinstance(loss, (list, tuple)) else loss * scale)
    yield scaled


def unscale(trainer: Trainer) -> None:
    """Divide the gradients by the scale now (e.g. before clipping), at most once per step.

    Works on every device in place, without a host sync; ``trainer.step`` then
    applies no further unscaling and still skips the update on overflow.
    """
    amp = _amp(trainer)
    if amp._unscaled:
        raise RuntimeError("unscale(trainer) was already called since the last "
                           "trainer.step(): the gradients are already unscaled; call it at "
                           "most once per step")
    factor = trainer._scale / amp.original_scale
    with unpatched():
        for p in trainer._params:
            if factor != 1 and p.grad_req != "null" and p._grad is not None:
                for g in p.list_grad():
                    g *= factor
    trainer._scale = amp.original_scale
    amp._unscaled = True


def loss_scale(trainer: Trainer) -> LossScale:
    """The trainer's current loss-scale state (immutable: scale, skipped_steps, ...)."""
    return _amp(trainer).state


def last_step_skipped(trainer: Trainer) -> bool:
    """Whether the last ``trainer.step`` was skipped because of an overflow."""
    return _amp(trainer).last_step_skipped


def state_dict(trainer: Trainer) -> dict[str, Any]:
    """The loss-scale state as plain, JSON-serialisable values (save it with the checkpoint)."""
    amp = _amp(trainer)
    return {"loss_scale": amp.state.state_dict(), "last_step_skipped": amp.last_step_skipped}


def load_state_dict(trainer: Trainer, d: dict[str, Any]) -> None:
    """Restore what ``state_dict`` returned, so a resumed run follows the same trajectory."""
    amp = _amp(trainer)
    if not isinstance(d, dict) or "loss_scale" not in d:
        raise AmpConfigError("load_state_dict expects the dict returned by "
                             "mxnet_amp.state_dict(trainer) (with a 'loss_scale' key)")
    amp.state = loss_scale_from_state_dict(d["loss_scale"])
    amp.last_step_skipped = bool(d.get("last_step_skipped", False))
