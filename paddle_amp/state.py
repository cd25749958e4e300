"""The loss-scale state in a Paddle scope: read it, write it all-or-nothing, guard it.

The ``LossScaleState`` fields live in persistable ``[1]`` vars of the dtypes in
``DTYPE`` (``paddle.static.save``/``load`` checkpoint them with the parameters);
reading is one small host read per var.
"""
from __future__ import annotations

from typing import Any, Optional

import numpy as np

from amp_adapters import (AmpConfigError, LossScale, LossScaleConfig, LossScaleState,
                          loss_scale_from_parts)
from amp_adapters.rules.loss_scale import COUNTERS, load_state

# Each field's var dtype: the counters ``update_loss_scaling`` reads and writes are int32.
_INT32 = frozenset({"good_steps", "bad_steps"})
DTYPE = {"scale": "float32", **{c: "int32" if c in _INT32 else "int64" for c in COUNTERS}}


def held_fields(config: LossScaleConfig) -> tuple[str, ...]:
    """The state fields a program of ``config`` keeps in vars (all six when it checks
    overflow; ``total_steps`` only for ``kind='none'``)."""
    return ("scale", *COUNTERS) if config.checks_overflow else ("total_steps",)


def _tensor(scope, name: str):
    found = scope.find_var(name)
    if found is None:
        raise RuntimeError(f"{name!r} is not in the scope: run the startup program first "
                           f"(or pass the scope the program runs in)")
    return found.get_tensor()


def read_state(scope, names: dict[str, str], config: LossScaleConfig) -> LossScaleState:
    """The state held in ``scope`` (``names``: field -> var name)."""
    values: dict[str, Any] = {}
    for field, var in names.items():
        v = np.asarray(_tensor(scope, var)).reshape(-1)[0]
        values[field] = float(v) if field == "scale" else int(v)
    if "scale" not in values:
        values["scale"] = 1.0
    return LossScaleState(**values)


def read(scope, names: dict[str, str], config: LossScaleConfig) -> LossScale:
    """The user-facing value (``DynamicLossScale``...) of the state in ``scope``."""
    return loss_scale_from_parts(config, read_state(scope, names, config))


def write(scope, names: dict[str, str], config: LossScaleConfig, d: Any,
          place) -> LossScaleState:
    """Set the scope's state vars from a ``state_dict()``, all or nothing.

    The dict is checked in full (``loss_scale.load_state``: format, keys, types,
    values, and its config against ``config``, whose constants are baked into the
    program's ops) and every value is converted to its var's dtype (an int32
    counter refuses 2**40) before the first var is written. Returns the state written."""
    _, state = load_state(d, config)
    staged = []
    for field, var in names.items():
        value = getattr(state, field)
        dtype = np.dtype(DTYPE[field])
        if dtype.kind == "i" and not np.iinfo(dtype).min <= value <= np.iinfo(dtype).max:
            raise AmpConfigError(f"loss-scale state_dict['state'][{field!r}] = {value!r} does "
                                 f"not fit the program's {dtype.name} counter")
        staged.append((_tensor(scope, var), np.array([value], dtype=dtype)))
    for tensor, array in staged:
        tensor.set(array, place)
    return state


def nonfinite_params(scope, flags_var: Optional[str], param_names: tuple[str, ...]) -> list:
    """The parameters whose gradient was not finite at the last overflow step."""
    if flags_var is None or scope.find_var(flags_var) is None:
        return []
    finite = np.asarray(_tensor(scope, flags_var)).ravel()
    return [n for n, ok in zip(param_names, finite) if not ok]
