"""``save_checkpoint`` / ``load_checkpoint``: a Gluon run's whole state, atomically.

One checkpoint is the parameters (``net.save_parameters``), the optimizer
state (``trainer.save_states``: moments, update counts, the optimizer), the
loss-scale state and ``last_step_skipped``, and the step, published by
``amp_adapters.services.checkpoint`` (temp folder, fsync, rename, pointer swap), so a
kill at any moment leaves the previous checkpoint loadable. Loading verifies
the checksums, the policy, the optimizer type and every parameter's name and
shape before it changes anything. Both read the parameters back to the host
(one sync per parameter), as the native save/load do.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Optional

import mxnet as mx
from mxnet import gluon

from amp_adapters.services import checkpoint as core
from amp_adapters import AmpConfigError, CheckpointError

from .active import active_policy
from .scaling import AmpTrainerState, checked_restore

PARAMS, STATES = "net.params", "trainer.states"


def _amp(trainer: gluon.Trainer) -> Optional[AmpTrainerState]:
    state = getattr(trainer, "_amp_loss_scaler", None)
    return state if isinstance(state, AmpTrainerState) else None


def _check_args(net: Any, trainer: Any) -> None:
    if not isinstance(net, gluon.Block):
        raise TypeError(f"net must be a mxnet.gluon.Block, got {type(net).__name__}")
    if not isinstance(trainer, gluon.Trainer):
        raise TypeError(f"trainer must be a mxnet.gluon.Trainer, got {type(trainer).__name__}")


def _param_shapes(net: gluon.Block) -> dict[str, list[int]]:
    return {name: list(p.shape) for name, p in net._collect_params_with_prefix().items()}


def save_checkpoint(path: "str | os.PathLike[str]", net: gluon.Block, trainer: gluon.Trainer,
                    step: Optional[int] = None) -> Path:
    """Save ``net``'s parameters, ``trainer``'s optimizer and loss-scale state, and ``step``
    as the newest checkpoint in the folder ``path``; returns the checkpoint's folder.

    ``step`` defaults to the loss scale's ``total_steps`` (the number of
    ``trainer.step`` calls since ``init_trainer``). The previous checkpoint stays
    valid until this one is complete."""
    _check_args(net, trainer)
    amp = _amp(trainer)
    if step is None:
        if amp is None:
            raise TypeError("save_checkpoint needs step= when the trainer has no AMP loss "
                            "scale (mxnet_amp.init_trainer was not called)")
        step = amp.state.total_steps
    meta = {"optimizer": type(trainer._optimizer).__name__, "params": _param_shapes(net),
            "amp": None if amp is None else {"last_step_skipped": amp.last_step_skipped}}
    with core.save(path, framework="mxnet", step=step, policy=active_policy(),
                   loss_scale=None if amp is None else amp.state, meta=meta) as folder:
        net.save_parameters(str(folder / PARAMS))
        trainer.save_states(str(folder / STATES))
    return Path(path)


def load_checkpoint(path: "str | os.PathLike[str]", net: gluon.Block, trainer: gluon.Trainer,
                    *, check_policy: bool = True) -> int:
    """Restore the newest checkpoint of ``path`` into ``net`` and ``trainer``; return its step.

    Everything is verified first (checksums, the policy of ``init`` unless
    ``check_policy=False``, the optimizer type, each parameter's name and
    shape, AMP on the trainer); a torn, truncated or mismatched checkpoint is a
    ``CheckpointError`` and leaves ``net`` and ``trainer`` unchanged. Continue
    training with step ``returned + 1``'s data."""
    _check_args(net, trainer)
    ckpt = core.load(path, framework="mxnet", policy=active_policy(), check_policy=check_policy)
    core.check_meta(ckpt, "optimizer", type(trainer._optimizer).__name__, "the optimizer")
    amp = _amp(trainer)
    if (ckpt.meta.get("amp") is None) != (amp is None):
        raise CheckpointError(
            f"checkpoint {str(path)!r} was saved from a trainer "
            f"{'without' if amp is not None else 'with'} AMP loss scaling; call "
            f"mxnet_amp.init_trainer(trainer) the same way before loading")
    saved = mx.nd.load(str(ckpt.file(PARAMS)))
    current = net._collect_params_with_prefix()
    if set(saved) != set(current):
        missing, extra = sorted(set(current) - set(saved)), sorted(set(saved) - set(current))
        raise CheckpointError(f"checkpoint {str(path)!r} does not fit this net: parameters "
                              f"missing from it {missing[:5]}, not in the net {extra[:5]}")
    for name, p in current.items():
        shape = tuple(saved[name].shape)
        here = p.shape  # 0 (or None) where not known yet (deferred initialisation)
        if here is not None and (len(here) != len(shape) or any(
                d not in (0, s) for d, s in zip(here, shape))):
            raise CheckpointError(f"checkpoint {str(path)!r} does not fit this net: parameter "
                                  f"{name} has shape {shape} there, {p.shape} here")
    restore_amp = _checked_amp(path, trainer, ckpt) if amp is not None else None
    net.load_parameters(str(ckpt.file(PARAMS)))  # everything is checked: now change things
    trainer.load_states(str(ckpt.file(STATES)))
    if restore_amp is not None:
        restore_amp()
    return ckpt.step


def _checked_amp(path: Any, trainer: gluon.Trainer, ckpt: core.Checkpoint):
    """The checkpoint's loss scale checked against the trainer's config (nothing changed yet):
    the function that restores it, or ``CheckpointError``."""
    meta = ckpt.meta.get("amp")
    if not isinstance(meta, dict) or ckpt.loss_scale is None:
        raise CheckpointError(f"checkpoint {str(path)!r} has no complete AMP loss-scale state")
    try:
        return checked_restore(trainer, ckpt.loss_scale, meta.get("last_step_skipped"))
    except AmpConfigError as e:
        raise CheckpointError(f"checkpoint {str(path)!r} does not fit this trainer's loss "
                              f"scale: {e}") from None
