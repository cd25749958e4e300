"""The native ``list_*`` helpers, computed from the policy's effective lists.

They answer for the policy of ``init`` when its dtype matches, else for the
default policy of that dtype. The categories map as: lp16 = lower,
fp32 = fp32, lp16_fp32 = follow, widest_type_cast = promote.
"""
from __future__ import annotations

from typing import Any

from amp_adapters import Policy, categorize, effective_lists
from amp_adapters.dtypes import low_dtype
from amp_adapters.oplists import load_table

from .patching import active_policy

# Ops whose backward takes a grad_scale: the native's list, not a precision category.
_LOSS_OUTPUT_FUNCTIONS = ("SoftmaxOutput", "LinearRegressionOutput",
                          "LogisticRegressionOutput", "MAERegressionOutput")


def _policy(target_dtype: Any) -> Policy:
    dtype = low_dtype(target_dtype, "target_dtype")
    active = active_policy()
    return active if active is not None and active.dtype == dtype else Policy(dtype=dtype)


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
    out = []
    for op, rule in sorted(load_table("mxnet").conditional.items()):
        values = [v for v in rule.values
                  if categorize(policy, "mxnet", op, {rule.attr: v}).category == "fp32"]
        if values:
            out.append((op, rule.attr, values))
    out.extend((op, attr, list(values)) for op, attr, values in policy.mxnet_ops.conditional_fp32)
    return out


def list_loss_output_functions(target_dtype: Any = "float16") -> list[str]:
    """Loss-output ops (the native's list; they take a ``grad_scale``)."""
    _policy(target_dtype)  # validates the dtype like the other helpers
    return list(_LOSS_OUTPUT_FUNCTIONS)
