"""``decorate`` / ``amp_decorate``: ``paddle.amp.decorate``'s signature, every argument checked
before anything happens.

Level O1 returns the models and optimizers as they are, as the native does (O1 keeps
float32 parameters; ``auto_cast`` does the work). The native checks little at O1 (a wrong
model type, ``save_dtype`` or ``dtype`` mostly passes) and at O2 casts the parameters
before it checks the optimizers and ``save_dtype``: here a bad argument is an error before
anything is touched, at every level.

Level O2 (``o2``): the core's parameter plan (``params``: what only a routed low op reads
is stored low; norms, biases, ``excluded_layers`` stay float32), the cast in place (the
same Parameter objects), float32 masters kept by each optimizer in the native's format
(``masters``), ``save_dtype`` as a state-dict hook, ``master_grad`` as the native's
backward hook. The models and optimizers come back as given (the same objects).
"""
from __future__ import annotations

import logging
from typing import Any

from amp_adapters import AmpConfigError, resolve_policy
from amp_adapters.rules.errors import check_flag

from . import dispatch, kernels, masters
from . import params as param_plan
from .config import DTYPES, policy_of

log = logging.getLogger("paddle_amp.dygraph")
O2_MARK = "_amp_adapters_o2_plan"  # a model decorated at O2: its ParamPlan

SAVE_DTYPES = ("float16", "bfloat16", "float32", "float64")


def _as_list(value: Any, kind: type, what: str) -> list:
    items = value if isinstance(value, list) else [value]
    bad = [v for v in items if not isinstance(v, kind)]
    if not items or bad:
        raise AmpConfigError(f"decorate: {what} must be a single {kind.__name__} or a list of "
                             f"them, got {bad[0] if bad else value!r}")
    return items


def decorate(models: Any, optimizers: Any = None, level: Any = None, dtype: Any = None,
             master_weight: Any = None, save_dtype: Any = None, master_grad: Any = False,
             excluded_layers: Any = None, *, policy: Any = None, emulate: Any = False):
    """``paddle.amp.decorate`` (see the module docstring): returns ``models`` (and
    ``optimizers`` when given) as the native does. ``level``/``dtype`` default to the
    native's ``"O1"``/``"float16"``, or to ``policy``'s own when one is given; given
    explicitly, they apply over the policy (as ``auto_cast``'s do)."""
    import paddle
    _as_list(models, paddle.nn.Layer, "models")
    if optimizers is not None:
        _as_list(optimizers, paddle.optimizer.Optimizer, "optimizers")
    if level is not None and level not in ("O1", "O2"):
        raise AmpConfigError(f"decorate: level must be 'O1' or 'O2' (O1: mixed precision by op "
                             f"lists; O2: low-precision parameters), got {level!r}")
    if dtype is not None and dtype not in DTYPES:
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
    if policy is not None and level is None:
        resolved = resolve_policy(policy, device_type="cpu")
        level = resolved.level if resolved.level in ("O1", "O2") else "O1"
    if policy is None and dtype is None:
        dtype = "float16"  # the native's default
    level = "O1" if level is None else level  # the native's default
    if level == "O1":
        return models if optimizers is None else (models, optimizers)
    model_list = _as_list(models, paddle.nn.Layer, "models")
    for model in model_list:
        if isinstance(model, paddle.DataParallel):
            raise AmpConfigError("decorate: decorate the model first, then wrap it in "
                                 "paddle.DataParallel (got a DataParallel model at O2)")
        if getattr(model, O2_MARK, False):
            raise AmpConfigError(f"decorate: {type(model).__name__} is decorated at O2 "
                                 f"already (its parameters are stored low); decorate it once")
    opt_list = [] if optimizers is None else _as_list(optimizers, paddle.optimizer.Optimizer,
                                                      "optimizers")
    for opt in opt_list:
        if hasattr(opt, masters.KEY):
            raise AmpConfigError(f"decorate: {type(opt).__name__} is decorated at O2 already; "
                                 f"decorate it once")
    resolved = policy_of(level="O2", dtype=dtype, policy=policy, emulate=emulate)
    o2(model_list, opt_list, resolved, master_weight, save_dtype, master_grad,
       excluded_layers)
    return models if optimizers is None else (models, optimizers)


def o2(models: list, optimizers: list, policy: Any, master_weight: Any, save_dtype: Any,
       master_grad: bool, excluded_layers: Any) -> None:
    """Level O2 on arguments checked: the core's plan, then the cast, the masters, the
    hooks (see the module docstring)."""
    import paddle
    plan, params = param_plan.plan(models, policy, excluded_layers)
    low = {n: params[n] for n in sorted(plan.low)}
    opt_params = [{id(p) for p in masters.optimizer_params(opt)} for opt in optimizers]
    with paddle.no_grad():
        fp32 = {n: p.clone() for n, p in low.items()}
        for name, p in low.items():
            param_plan.store_low(p, plan.dtypes[name])
    for opt, ids in zip(optimizers, opt_params):
        mine = {n: p for n, p in low.items() if id(p) in ids}
        if mine:
            masters.attach(opt, mine, policy.dtype, master_weight is not False, fp32)
    for model in models:
        setattr(model, O2_MARK, plan)
        if save_dtype is not None:
            for layer in model.sublayers(include_self=True):
                layer.register_state_dict_hook(_SaveAs(save_dtype))
    if master_grad:
        dispatch.master_grad_params(list(low.values()))
    log.info("paddle_amp.dygraph O2: %d of %d parameters stored in %s:\n%s", len(low),
             len(params), policy.dtype, plan.format())


class _SaveAs:
    """``save_dtype``: a model's ``state_dict`` with its floating values in that dtype (the
    parameters themselves keep theirs), as the native's ``StateDictHook``."""

    def __init__(self, dtype: str):
        self.dtype = dtype

    def __call__(self, state_dict: dict) -> None:
        import paddle
        cast = kernels.rounding_cast() if self.dtype != "float64" else None
        with paddle.no_grad():  # values to save, not part of any graph
            for key, value in state_dict.items():
                if paddle.is_floating_point(value) and \
                        value.dtype != getattr(paddle, self.dtype):
                    out = cast(value, self.dtype) if cast else value.astype(self.dtype)
                    out.name = value.name
                    state_dict[key] = out


def param_dtypes(model: Any) -> Any:
    """The O2 ``ParamPlan`` ``decorate`` applied to ``model`` (None: not decorated at O2)."""
    return getattr(model, O2_MARK, None)


amp_decorate = decorate
