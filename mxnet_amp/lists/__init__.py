"""``mxnet.contrib.amp.lists`` (submodules ``symbol_fp16``, ``symbol_bf16``: the native's
default lists, from the core data) and the native ``list_*`` helpers.

The helpers answer for the policy of ``init`` when its dtype matches, else for
the native default (preset ``mxnet-native``) of that dtype, so without ``init``
they return the native's lists (as sorted lists). The categories map as: lp16 =
lower, fp32 = fp32, lp16_fp32 = follow, widest_type_cast = promote.
"""
from __future__ import annotations

from typing import Any, Optional

from amp_adapters import Policy, categorize, effective_lists
from amp_adapters.rules.dtypes import low_dtype
from amp_adapters.rules.oplists import load_table, native_lists

from ..patching import active_policy
from . import symbol_bf16, symbol_fp16  # noqa: F401


def _policy(target_dtype: Any) -> Policy:
    dtype = low_dtype(target_dtype, "target_dtype")
    active = active_policy()
    if active is not None and active.dtype == dtype:
        return active
    return Policy.preset("mxnet-native", dtype=dtype)


def list_lp16_ops(target_dtype: Any = "float16") -> list[str]:
    """Ops that run in ``target_dtype`` ('float16' or 'bfloat16')."""
    return effective_lists(_policy(target_dtype), "mxnet")["lower"]


def list_fp32_ops(target_dtype: Any = "float16") -> list[str]:
    """Ops that always run in float32."""
    return effective_lists(_policy(target_dtype), "mxnet")["fp32"]


def list_lp16_fp32_ops(target_dtype: Any = "float16") -> list[str]:
    """Ops that run in whatever dtype their inputs have."""
    return effective_lists(_policy(target_dtype), "mxnet")["follow"]


def list_widest_type_cast(target_dtype: Any = "float16") -> list[str]:
    """Ops that run in the widest floating dtype among their inputs."""
    return effective_lists(_policy(target_dtype), "mxnet")["promote"]


def list_conditional_fp32_ops(target_dtype: Any = "float16") -> list[tuple[str, str, list[str]]]:
    """(op, attribute, values) for which the op runs in float32, as the native lists them."""
    policy = _policy(target_dtype)
    if policy.mxnet_ops.replaces("conditional_fp32"):  # init(conditional_fp32_ops=[...])
        rules = []
    elif policy.defaults == "native":
        rules = [(op, attr, list(values)) for op, attr, values in
                 native_lists("mxnet", policy.dtype).conditional_fp32]
    else:
        rules = []
        for op, rule in sorted(load_table("mxnet").conditional.items()):
            values = [v for v in rule.values
                      if categorize(policy, "mxnet", op, {rule.attr: v}).category == "fp32"]
            if values:
                rules.append((op, rule.attr, values))
    rules.extend((op, attr, list(values)) for op, attr, values in policy.mxnet_ops.conditional_fp32)
    return rules


def list_loss_output_functions(target_dtype: Any = "float16") -> list[str]:
    """Loss-output ops (the native's list; they take a ``grad_scale``)."""
    return list(native_lists("mxnet", _policy(target_dtype).dtype).loss_output)


def list_lp16_use_fp32_params(target_dtype: Any = "float16") -> Optional[dict]:
    """{op: input names kept fp32} for ``target_dtype``: None for float16, the native's
    BF16_USE_FP32_PARAMS for bfloat16 (as natively)."""
    dtype = _policy(target_dtype).dtype
    params = native_lists("mxnet", dtype).fp32_params
    return {op: list(names) for op, names in params.items()} if dtype == "bfloat16" else None
