"""``save_checkpoint`` / ``load_checkpoint``: a dygraph training state that survives a kill.

The model's and the optimizer's ``state_dict`` (``paddle.save``'s files, readable by
``paddle.load``: ``model.pdparams``, ``model.pdopt``) and the scaler's loss-scale state go
through ``amp_adapters.services.checkpoint`` (a temp folder, fsync, rename, a pointer swap),
so a kill at any moment leaves the previous checkpoint loadable. ``load_checkpoint`` verifies the
checksums (and the policy, when one is given), then checks that the saved parameters are
exactly the model's (names, shapes, dtypes) before it sets anything. Paddle's own
``set_state_dict`` can still fail half way (an optimizer with moments meets a state
without them: it sets the learning-rate schedule, then asserts), so the load is a
transaction: the values it may change (parameters, buffers, moments, O2's masters, the
schedule) are copied first and put back on any error, which is then a ``CheckpointError``.
Nothing changes on error; the copy costs the memory of the model's and optimizer's state
for the length of the load. The resumed run continues the same trajectory: parameters,
optimizer moments (O2's masters too) and the loss scale with all its counters (or, for a
dynamic scaler that turned itself off in a bfloat16 run, a scaler turned off). The model's
values are saved in their own dtypes (``save_dtype``'s hook is for ``paddle.save``: a
resume must be exact).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from amp_adapters.services import checkpoint as ckpt_core
from amp_adapters import CheckpointError, loss_scale_from_parts

MODEL, OPTIMIZER = "model.pdparams", "model.pdopt"


def _param_names(model: Any) -> dict[str, str]:
    """{the parameter's place in the model (its state-dict key): its Paddle name}."""
    return {key: getattr(value, "name", key)
            for key, value in model.state_dict(use_hook=False).items()}


def _renamed(state: dict, saved: Any, now: dict[str, str], where: str) -> dict:
    """The optimizer state ``state`` with its keys moved from the saved parameters' Paddle
    names to this model's: Paddle keys optimizer state by a global counter's names
    (``linear_0.w_0_moment1_0``), which differ when the model is built again in the same
    process or in another order; the place in the model is the same."""
    if not isinstance(saved, dict):
        raise CheckpointError(f"{where}: its metadata has no parameter names")
    rename = {old: now[key] for key, old in saved.items() if key in now and old != now[key]}
    if not rename:
        return state
    olds = sorted(rename, key=len, reverse=True)  # the longest name that prefixes a key

    def move(key: str) -> str:
        for old in olds:
            if key == old or key.startswith(old + "_"):
                return rename[old] + key[len(old):]
        return key
    out = {}
    for key, value in state.items():
        if isinstance(value, dict):  # master_weights: by parameter name
            value = {move(k): v for k, v in value.items()}
        out[move(key)] = value
    return out


def optimizer_state(optimizer: Any) -> dict:
    """The optimizer's state as a checkpoint holds it: ``state_dict()`` plus what a load
    handed it that it has not taken yet. Paddle's ``set_state_dict`` parks moments it has
    no accumulator for (none before the first update) in ``_accumulators_holder`` and
    ``state_dict()`` leaves them out, so a resumed run whose first step was skipped (an
    overflow) saved a checkpoint without Adam's moments, and the next resume restarted
    them from zero."""
    state = optimizer.state_dict()
    for key, value in getattr(optimizer, "_accumulators_holder", {}).items():
        state.setdefault(key, value)
    return state


def save_checkpoint(path: Any, model: Any, optimizer: Any, scaler: Any = None, *,
                    step: Optional[int] = None, policy: Any = None) -> Path:
    """Save ``model``, ``optimizer`` and ``scaler`` (a ``GradScaler``; None or disabled: no
    loss scale) as the newest checkpoint of the folder ``path``; ``step``: default the
    scaler's step count (0 without one); ``policy``: recorded, and checked on load."""
    import paddle
    config_state = scaler.loss_scale() if scaler is not None and scaler.is_enable() else None
    loss_scale = loss_scale_from_parts(*config_state) if config_state else None
    if step is None:
        step = config_state[1].total_steps if config_state else 0
    with ckpt_core.save(path, framework="paddle-dygraph", step=step, policy=policy,
                        loss_scale=loss_scale,
                        meta={"optimizer": type(optimizer).__name__,
                              "params": _param_names(model),
                              "scaler_off_for": getattr(scaler, "_off_for", None)}) as folder:
        paddle.save(model.state_dict(use_hook=False), str(folder / MODEL))
        paddle.save(optimizer_state(optimizer), str(folder / OPTIMIZER))
    return Path(path)


def load_checkpoint(path: Any, model: Any, optimizer: Any, scaler: Any = None, *,
                    policy: Any = None, check_policy: bool = True) -> int:
    """Load the newest checkpoint of ``path`` into ``model``, ``optimizer`` and ``scaler``;
    return its step. Everything is checked before anything is set."""
    import paddle
    ckpt = ckpt_core.load(path, framework="paddle-dygraph", policy=policy,
                          check_policy=check_policy)
    ckpt_core.check_meta(ckpt, "optimizer", type(optimizer).__name__, "the optimizer")
    where = f"checkpoint {str(path)!r}"
    scaled = scaler is not None and scaler.is_enable()
    # The saved scaler was dynamic and turned itself off under a bfloat16 region (as the
    # native does at scale()); a fresh one given to resume it is turned off the same way.
    off_for = ckpt.meta.get("scaler_off_for")
    turn_off = scaled and off_for is not None and ckpt.loss_scale is None and scaler._dynamic
    if scaled != (ckpt.loss_scale is not None) and not turn_off:
        raise CheckpointError(f"{where} does not fit: it was saved "
                              f"{'with' if ckpt.loss_scale is not None else 'without'} a loss "
                              f"scale, and the scaler given is "
                              f"{'an enabled one' if scaled else 'none or disabled'}")
    params = paddle.load(str(ckpt.file(MODEL)))
    current = model.state_dict(use_hook=False)
    if set(params) != set(current):
        raise CheckpointError(
            f"{where} does not fit this model: parameters missing from it "
            f"{sorted(set(current) - set(params))[:5]}, not in the model "
            f"{sorted(set(params) - set(current))[:5]}")
    for name, value in current.items():
        saved = params[name]
        if list(saved.shape) != list(value.shape) or saved.dtype != value.dtype:
            raise CheckpointError(f"{where} does not fit this model: {name} is "
                                  f"{saved.dtype}{list(saved.shape)} there, "
                                  f"{value.dtype}{list(value.shape)} here")
    opt_state = _renamed(paddle.load(str(ckpt.file(OPTIMIZER))), ckpt.meta.get("params"),
                         _param_names(model), where)
    undo = _snapshot(model, optimizer)
    try:
        model.set_state_dict(params)
        optimizer.set_state_dict(opt_state)
    except Exception as e:  # Paddle's own loaders, half way: put everything back
        undo()
        raise CheckpointError(f"{where} could not be loaded into this model and optimizer "
                              f"({type(e).__name__}: {e}); both are as they were") from e
    if turn_off:
        scaler._turn_off(off_for)
    elif scaled:
        scaler._restore(ckpt.loss_scale.config, ckpt.loss_scale.state)
    return ckpt.step


def _snapshot(model: Any, optimizer: Any):
    """A copy of every value loading may change in ``model`` and ``optimizer``; returns the
    function that puts them back."""
    import paddle
    from paddle.optimizer.lr import LRScheduler

    from .masters import KEY
    live = [t for _, t in model.named_parameters()]
    live += [t for _, t in model.named_buffers() if t is not None]
    live += [v for acc in getattr(optimizer, "_accumulators", {}).values() for v in acc.values()]
    o2 = getattr(optimizer, KEY, None)
    live += list(o2.masters.values()) if o2 is not None else []
    with paddle.no_grad():
        copies = [(t, t.clone()) for t in live if t._is_initialized()]
    attrs = dict(vars(optimizer))
    lr = getattr(optimizer, "_learning_rate", None)
    lr_state = lr.state_dict() if isinstance(lr, LRScheduler) else None

    def undo() -> None:
        with paddle.no_grad():
            for t, copy in copies:
                paddle.assign(copy, output=t)
        vars(optimizer).clear()
        vars(optimizer).update(attrs)
        if lr_state is not None:
            lr.set_state_dict(lr_state)
    return undo
