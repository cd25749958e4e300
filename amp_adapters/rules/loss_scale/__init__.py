"""The loss-scale core: config, state, the one transition, its vocabulary, guard, state dicts.

- ``config.LossScaleConfig``: the constants (what a policy holds);
- ``state.LossScaleState``: what changes (what a checkpoint stores);
- ``update.update(config, state, found_inf, ops)``: the transition, written once over
  the ``update.ArrayOps`` vocabulary; ``numpy_ops.NumpyOps`` runs it in the core;
- ``guard.check_guard``: the one place ``OverflowGuardError`` is decided;
- ``consistency.check_state``: the one rule for a state under its config (counters that
  contradict it are refused wherever a state enters);
- ``mxnet_fields``: the native MXNet ``LossScaler``'s fields read from and written to a
  config and state (what ``trainer._amp_loss_scaler._scale_seq_len = 4`` means here);
- ``state_dict``: strict checkpoints (format version, exact keys, config checked), and
  ``upgrade``: a state dict of an earlier format brought to this one (``UPGRADES``).

``step`` is the host-side convenience: one transition on a ``LossScaleState``.
"""
from __future__ import annotations

import numpy as np

from .config import KINDS, LossScaleConfig
from .consistency import check_state
from .guard import SkipWindow, check_guard
from .numpy_ops import NUMPY_OPS, NumpyOps
from .state import COUNTERS, FIELDS, LossScaleState
from .state_dict import FORMAT_VERSION, UPGRADES, load_state, state_dict, upgrade
from .update import ArrayOps, StateArrays, count_step, move_scale, update


def step(config: LossScaleConfig, state: LossScaleState, found_inf: bool) -> LossScaleState:
    """``update`` on the host: the state after one step (numpy scalars under the hood)."""
    arrays = StateArrays(np.float32(state.scale), *(np.int64(getattr(state, c))
                                                     for c in COUNTERS))
    out = update(config, arrays, np.bool_(bool(found_inf)), NUMPY_OPS)
    new = object.__new__(LossScaleState)  # values are already valid: skip re-validation
    object.__setattr__(new, "scale", float(out.scale))
    for c in COUNTERS:
        object.__setattr__(new, c, int(getattr(out, c)))
    return new


__all__ = ["KINDS", "LossScaleConfig", "LossScaleState", "FIELDS", "COUNTERS", "ArrayOps",
           "StateArrays", "update", "count_step", "move_scale", "NumpyOps", "NUMPY_OPS",
           "step", "check_guard", "SkipWindow", "state_dict", "load_state", "FORMAT_VERSION",
           "check_state", "upgrade", "UPGRADES"]
