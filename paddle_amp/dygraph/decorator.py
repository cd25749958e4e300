"""``decorate`` / ``amp_decorate``: ``paddle.amp.decorate``'s signature, every argument checked
before anything happens.

Level O1 returns the models and optimizers as they are, as the native does (O1 keeps
float32 parameters; ``auto_cast`` does the work). The native checks little at O1 (a wrong
model type, ``save_dtype`` or ``dtype`` mostly passes) and at O2 casts the parameters
before it checks the optimizers and ``save_dtype``: here a bad argument is an error before
anything is touched, at every level. Level O2 (low-precision parameters, float32 master
weights, ``save_dtype``, ``master_grad``, ``excluded_layers``) is not built yet: it is
refused with a ``NotSupportedError`` that says what to use, never silently treated as O1.
"""
from __future__ import annotations

from typing import Any

from amp_adapters import resolve_policy
from amp_adapters.errors import AmpConfigError, NotSupportedError, check_flag

from .config import DTYPES

SAVE_DTYPES = ("float16", "bfloat16", "float32", "float64")


def _as_list(value: Any, kind: type, what: str) -> list:
    items = value if isinstance(value, list) else [value]
    bad = [v for v in items if not isinstance(v, kind)]
    if not items or bad:
        raise AmpConfigError(f"decorate: {what} must be a single {kind.__name__} or a list of "
                             f"them, got {bad[0] if bad else value!r}")
    return items


def decorate(models: Any, optimizers: Any = None, level: Any = "O1", dtype: Any = "float16",
             master_weight: Any = None, save_dtype: Any = None, master_grad: Any = False,
             excluded_layers: Any = None, *, policy: Any = None, emulate: Any = False):
    """``paddle.amp.decorate`` (see the module docstring): returns ``models`` (and
    ``optimizers`` when given) as the native does."""
    import paddle
    _as_list(models, paddle.nn.Layer, "models")
    if optimizers is not None:
        _as_list(optimizers, paddle.optimizer.Optimizer, "optimizers")
    if level not in ("O1", "O2"):
        raise AmpConfigError(f"decorate: level must be 'O1' or 'O2' (O1: mixed precision by op "
                             f"lists; O2: low-precision parameters), got {level!r}")
    if dtype not in DTYPES:
        raise AmpConfigError(f"decorate: dtype must be one of {', '.join(map(repr, DTYPES))}, "
                             f"got {dtype!r}")
    if master_weight is not None:
        check_flag("decorate master_weight", master_weight, also="or None")
    if save_dtype is not None and save_dtype not in SAVE_DTYPES:
        raise AmpConfigError(f"decorate: save_dtype must be None or one of "
                             f"{', '.join(map(repr, SAVE_DTYPES))}, got {save_dtype!r}")
    check_flag("decorate master_grad", master_grad)
    check_flag("decorate emulate", emulate)
    if excluded_layers is not None:
        items = excluded_layers if isinstance(excluded_layers, (list, tuple)) else \
            [excluded_layers]
        if not all(isinstance(x, paddle.nn.Layer) or
                   (isinstance(x, type) and issubclass(x, paddle.nn.Layer)) for x in items):
            raise AmpConfigError(f"decorate: excluded_layers must be a Layer, a Layer type or a "
                                 f"list of them, got {excluded_layers!r}")
    if policy is not None:
        resolved = resolve_policy(policy, device_type="cpu")
        level = resolved.level if resolved.level in ("O1", "O2") else "O1"
    if level == "O2":
        raise NotSupportedError(
            "paddle_amp.dygraph.decorate(level='O2') is not built yet (low-precision "
            "parameters with float32 master weights in eager mode); nothing was cast. Use "
            "level='O1' (auto_cast does the mixed precision), or the static drop-in "
            "paddle_amp.decorate for O2")
    return models if optimizers is None else (models, optimizers)


amp_decorate = decorate
