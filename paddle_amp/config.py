"""From ``decorate``'s native arguments (either overload, or an explicit policy) to one ``Policy``.

The peer of ``mxnet_amp/config.py``, on the same floor (it reads the list
objects and the core, nothing that touches a program): native arguments ->
``Policy``, in named steps: which overload (``overload``), the argument
checks (``check_arguments``), the policy (``native_policy`` from the lists'
live sets, or the caller's ``policy=``), the loss scale
(``DynamicLossScale.from_paddle``). ``decorator.decorate`` applies the result.
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Optional

from amp_adapters import (LEVELS, LOW_DTYPES, DynamicLossScale, LossScale, OpLists, Policy,
                          StaticLossScale, UnknownChoiceError, resolve_policy, with_custom_lists)
from amp_adapters.rules.dtypes import low_dtype
from amp_adapters.rules.errors import check_flag
from amp_adapters.rules.policy import PolicyLike, default_loss_scale

from .env import current_device
from .lists import check_lists, known_ops

logger = logging.getLogger("paddle_amp")

# The native argument sets: the new ``decorate`` and the old fluid fp16 overload, which is
# selected (as natively) by passing use_pure_fp16, use_fp16_guard or use_bf16.
NEW_DEFAULTS = dict(init_loss_scaling=2.0**16, incr_every_n_steps=2000,
                    decr_every_n_nan_or_inf=1, incr_ratio=2.0, decr_ratio=0.5)
OLD_DEFAULTS = dict(init_loss_scaling=2.0**15, incr_every_n_steps=1000,
                    decr_every_n_nan_or_inf=2, incr_ratio=2.0, decr_ratio=0.8)


@dataclass(frozen=True)
class DecorateConfig:
    """What ``decorate``'s arguments mean: the policy and the native switches beside it."""

    policy: Policy
    use_guard: bool                 # fp16_guard / use_amp_guard: only guarded ops go low
    black_varnames: frozenset       # amp_lists.custom_black_varnames (also in the policy's
                                    # paddle_layers.fp32; the rewrite keeps their readers fp32)
    master_grad: bool               # O2 only: fp32 gradients of low-precision parameters


def native_policy(lists, dtype: str, level: str, use_promote: bool = False, **fields) -> Policy:
    """The ``paddle-native`` policy at ``level`` with ``lists``' live sets as overrides: what
    the native decides for these arguments (``use_promote``: unlisted ops promote)."""
    return Policy.preset("paddle-native", dtype=dtype, level=level,
                         unlisted="promote" if use_promote else None,
                         paddle_ops=lists.overrides("promote" if use_promote else "fp32", level),
                         **fields)


def native_loss_scale(dtype: str, dynamic: Optional[bool], args: dict) -> LossScale:
    """The loss scale the native arguments describe, where the core says ``dtype`` needs one
    (``use_dynamic_loss_scaling=False``: a static scale; overflow steps are still skipped)."""
    if dynamic is None or dynamic:
        return default_loss_scale(dtype, lambda: DynamicLossScale.from_paddle(**args))
    return default_loss_scale(dtype, lambda: StaticLossScale(scale=args["init_loss_scaling"]))


def overload(use_pure_fp16, use_fp16_guard, use_bf16) -> bool:
    """True for the old fluid fp16 overload, which (as natively) passing ``use_pure_fp16``,
    ``use_fp16_guard`` or ``use_bf16`` selects."""
    return any(a is not None for a in (use_pure_fp16, use_fp16_guard, use_bf16))


def check_arguments(level, flags: dict, scaling: dict) -> None:
    """TypeError naming the argument: a positional number where ``level`` goes, a flag that
    is no bool (None where the native takes None for its default), a loss-scaling number
    that is not finite."""
    if isinstance(level, (int, float)) and not isinstance(level, bool):
        raise TypeError(f"level={level!r} looks like the old positional init_loss_scaling; "
                        f"pass the loss-scaling arguments by keyword")
    for name, flag in flags.items():
        if flag is not None or name in ("master_grad", "use_promote", "emulate"):
            check_flag(name, flag)
    for k in ("init_loss_scaling", "incr_ratio", "decr_ratio"):
        if isinstance(scaling[k], bool) or not isinstance(scaling[k], (int, float)) or \
                not math.isfinite(scaling[k]):
            raise TypeError(f"{k} must be a finite number, got {scaling[k]!r}")


def explicit_policy(policy: PolicyLike, lists, emulate: bool, use_promote: bool) -> Policy:
    """The caller's ``policy=`` (it wins over level, dtype and the scaling arguments) with the
    custom op lists of ``lists`` on top, by the core's one rule (``with_custom_lists``, as
    ``paddle_amp.dygraph.auto_cast`` does): a custom white op runs low, a custom black op
    float32, whatever the policy's lists say."""
    policy = with_custom_lists(policy, "paddle", lists.custom())
    policy = policy.with_emulation(emulate)
    if use_promote and policy.unlisted is None:
        policy = policy.replace(unlisted="promote")
    if policy.paddle_ops != OpLists():  # list objects checked their names already
        policy.validate_for("paddle", known_ops())
    return policy


def resolve_decorate(amp_lists=None, level="O1", dtype="float16", master_grad=False,
                     init_loss_scaling=None, incr_every_n_steps=None,
                     decr_every_n_nan_or_inf=None, incr_ratio=None, decr_ratio=None,
                     use_dynamic_loss_scaling=None, use_amp_guard=None, use_promote=False, *,
                     use_pure_fp16=None, use_fp16_guard=None, use_bf16=None,
                     policy: Optional[PolicyLike] = None,
                     emulate: bool = False) -> DecorateConfig:
    """``decorate``'s arguments (see its docstring) -> ``DecorateConfig``, checked: TypeError /
    ``AmpConfigError`` naming the argument, before anything is built.

    Without ``policy`` the decisions are the installed native's (preset
    ``paddle-native`` plus ``amp_lists``' live sets, read now) at ``level``;
    the loss-scaling arguments, defaulted per overload, map onto
    ``DynamicLossScale.from_paddle``. ``policy="auto"`` (by name or a file's preset) runs
    the low dtype of the device programs run on now (``env.current_device``, as
    ``paddle.set_device`` says): float16 on a GPU, bfloat16 on a CPU."""
    old = overload(use_pure_fp16, use_fp16_guard, use_bf16)
    given = dict(init_loss_scaling=init_loss_scaling, incr_every_n_steps=incr_every_n_steps,
                 decr_every_n_nan_or_inf=decr_every_n_nan_or_inf, incr_ratio=incr_ratio,
                 decr_ratio=decr_ratio)
    args = {k: (v if v is not None else (OLD_DEFAULTS if old else NEW_DEFAULTS)[k])
            for k, v in given.items()}
    check_arguments(level, dict(master_grad=master_grad, use_promote=use_promote,
                                emulate=emulate,
                                use_dynamic_loss_scaling=use_dynamic_loss_scaling,
                                use_amp_guard=use_amp_guard, use_pure_fp16=use_pure_fp16,
                                use_fp16_guard=use_fp16_guard, use_bf16=use_bf16), args)
    if old:
        level = "O2" if use_pure_fp16 else "O1"
        dtype = "bfloat16" if use_bf16 else "float16"
        use_guard = bool(use_pure_fp16) if use_fp16_guard is None else bool(use_fp16_guard)
    else:
        use_guard = bool(use_amp_guard)
    if not isinstance(level, str) or not isinstance(dtype, str):
        raise TypeError(f"level and dtype must be strings, got {level!r} and {dtype!r}")
    dtype = low_dtype(dtype)
    level = level.upper()
    if level not in LEVELS:
        raise UnknownChoiceError("level", level, LEVELS)
    if policy is not None:
        # the preset "auto" runs the low dtype of the device programs run on (fp16 on a GPU)
        policy = resolve_policy(policy, device_type=current_device())
        if amp_lists is not None and policy.dtype in LOW_DTYPES:
            dtype = policy.dtype
    lists = check_lists(amp_lists, dtype)
    if level == "OD" and amp_lists is not None and policy is None:
        logger.warning("level OD: amp_lists are not used, as natively (only the default "
                       "white list runs in %s)", dtype)
        lists = check_lists(None, dtype)
    if policy is not None:
        policy = explicit_policy(policy, lists, emulate, use_promote)
    elif level == "O0":
        policy = Policy.preset("O0")
    else:
        policy = native_policy(lists, dtype, level, use_promote,
                               loss_scale=native_loss_scale(dtype, use_dynamic_loss_scaling, args)
                               ).with_emulation(emulate)
    black = frozenset(lists.black_varnames or ())
    if black and policy.enabled:  # the policy says it too: a file written from it agrees
        policy = policy.replace(paddle_layers=policy.paddle_layers.with_fp32(black))
    return DecorateConfig(policy, use_guard, black, master_grad and policy.level == "O2")
