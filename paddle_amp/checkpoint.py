"""Checkpoints of a decorated static program: every persistable, the loss scale, the step.

``save`` writes ``paddle.static.save``'s files (``model.pdparams``: parameters,
``model.pdopt``: optimizer accumulators, learning rate and the loss-scale vars,
``model.pdmodel``, or ``model.json`` under PIR: the program) from ``scope`` through
``amp_adapters.services.checkpoint`` (temp folder, fsync, rename, pointer swap), so a
kill at any moment leaves the previous checkpoint loadable; the files stay
readable by ``paddle.static.load``. Either IR (the persistables are the IR layer's
``persistables()``). ``load`` verifies the checksums and the
policy, then checks that the saved tensors are exactly the program's
persistables (names, shapes, dtypes) and that the scope holds them all before
it writes any. One host read (save) or write (load) per persistable.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import numpy as np
import paddle


from amp_adapters.services import checkpoint as ckpt_core
from amp_adapters import CheckpointError

from . import ir

PREFIX = "model"


def _check_program(program, built) -> None:
    if not isinstance(program, ir.program_types()):
        raise TypeError(f"program must be a paddle.static.Program, got {type(program).__name__}")
    if program is not built:
        raise CheckpointError("save_checkpoint/load_checkpoint take the program this optimizer "
                              "decorated (the one minimize() built), so the loss-scale state "
                              "is in it")


def _scope_array(scope, name: str) -> Optional[np.ndarray]:
    found = scope.find_var(name)
    if found is None or not found.get_tensor()._is_initialized():
        return None
    return np.array(found.get_tensor())


def check_saveable(program, built, scope) -> None:
    """``program`` is ``built`` (the decorated program, so the loss-scale state is in it) and
    ``scope`` holds all its persistables: else the error, before anything is read."""
    _check_program(program, built)
    missing = [n for n in ir.of(program).persistables() if _scope_array(scope, n) is None]
    if missing:
        raise CheckpointError(f"persistables {missing[:5]} are not in the scope: run the "
                              f"startup program (in the scope passed as scope=) first")


def save(path, program, scope, policy, loss_scale, optimizer: str,
         step: Optional[int] = None) -> Path:
    """Save ``program``'s persistables from ``scope`` (``check_saveable`` first), ``policy``,
    ``loss_scale`` and the ``optimizer`` class name; ``step``: default ``total_steps``."""
    step = loss_scale.total_steps if step is None else step
    with ckpt_core.save(path, framework="paddle", step=step, policy=policy,
                        loss_scale=loss_scale, meta={"optimizer": optimizer}) as folder:
        with paddle.static.scope_guard(scope):
            paddle.static.save(program, str(folder / PREFIX))
    return Path(path)


def load(path, program, built, scope, policy, optimizer: str, place, *,
         check_policy: bool = True) -> int:
    """The newest checkpoint of ``path`` into ``scope`` for ``program`` (``built``) at
    ``place``, if saved under ``policy`` by an ``optimizer`` of that class; its step."""
    _check_program(program, built)
    ckpt = ckpt_core.load(path, framework="paddle", policy=policy, check_policy=check_policy)
    ckpt_core.check_meta(ckpt, "optimizer", optimizer, "the optimizer")
    saved = paddle.static.load_program_state(str(ckpt.file(PREFIX)))
    wanted = set(ir.of(program).persistables())
    if set(saved) != wanted:
        raise CheckpointError(
            f"checkpoint {str(path)!r} does not fit this program: persistables missing from "
            f"it {sorted(wanted - set(saved))[:5]}, not in the program "
            f"{sorted(set(saved) - wanted)[:5]}")
    for name in sorted(wanted):
        current = _scope_array(scope, name)
        if current is None:
            raise CheckpointError(f"{name!r} is not in the scope: run the startup program "
                                  f"(in the scope passed as scope=) before load_checkpoint")
        if current.shape != saved[name].shape or current.dtype != saved[name].dtype:
            raise CheckpointError(
                f"checkpoint {str(path)!r} does not fit this program: {name} is "
                f"{saved[name].dtype}{list(saved[name].shape)} there, "
                f"{current.dtype}{list(current.shape)} here")
    for name in sorted(wanted):
        scope.find_var(name).get_tensor().set(saved[name], place)
    return ckpt.step
