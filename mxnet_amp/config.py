"""From ``init``'s arguments (native list names, or an explicit policy) to one ``Policy``."""
from __future__ import annotations

from typing import Optional, Sequence

import mxnet as mx

from amp_adapters import AmpConfigError, OpLists, Policy, resolve_policy
from amp_adapters.rules.errors import check_flag
from amp_adapters.rules.dtypes import low_dtype
from amp_adapters.rules.policy import PolicyLike

from ._mx import registry


# each native list argument -> the default list it replaces (OpLists.replace)
_LISTS = {"target_precision_ops": "lower", "fp32_ops": "fp32",
          "conditional_fp32_ops": "conditional_fp32"}


def device_type(ctx: Optional[mx.Context] = None) -> str:
    """The device a policy runs on, as MXNet answers it: ``ctx``'s ``device_type``, else
    ``"gpu"`` where MXNet sees a GPU (``mx.context.num_gpus() > 0``: ``init`` patches
    before any context is chosen), else ``"cpu"``. The preset ``"auto"`` takes its dtype
    from it (``amp_adapters.rules.device.auto_dtype``)."""
    if ctx is not None:
        return ctx.device_type
    return "gpu" if mx.context.num_gpus() > 0 else "cpu"


def user_policy(policy: PolicyLike, ctx: Optional[mx.Context] = None) -> Policy:
    """``policy=`` as the user gave it, resolved for ``ctx`` (``device_type``): the core's
    ``resolve_policy``, told the device."""
    return resolve_policy(policy, device_type=device_type(ctx))


def init_policy(target_dtype: object = "float16",
                   target_precision_ops: Optional[Sequence[str]] = None,
                   conditional_fp32_ops: Optional[Sequence[tuple]] = None,
                   fp32_ops: Optional[Sequence[str]] = None, *,
                   policy: Optional[PolicyLike] = None, emulate: bool = False,
                   ctx: Optional[mx.Context] = None) -> Policy:
    """The policy ``init``/``convert_*`` run under, validated against MXNet's op registry.

    Without ``policy`` the defaults are the installed native's lists (preset
    ``mxnet-native``). The native list arguments map onto ``Policy.mxnet_ops``
    and, as natively, each REPLACES the default list it names (only that one:
    ``target_precision_ops=["Convolution"]`` leaves FullyConnected in no list, so
    it follows its inputs; the fp32 and conditional defaults stay). An op the
    user lists takes the user's category even where a default list the user did
    not pass names it; an op in two of the user's lists, ``conditional_fp32_ops``
    included, is an error. An explicit ``policy`` (a ``Policy``, a preset name such as
    ``"O1"``, or a TOML file path) wins over ``target_dtype``; combining it
    with list arguments is an error, since one of them would be ignored. The preset
    ``"auto"`` runs float16 on a GPU, bfloat16 on a CPU: ``ctx``'s, else a GPU if MXNet
    sees one (``device_type``).
    Raises ``UnknownOpError`` / ``ConflictingOpError`` before anything is patched.
    """
    check_flag("emulate", emulate)
    given = {"target_precision_ops": target_precision_ops, "fp32_ops": fp32_ops,
             "conditional_fp32_ops": conditional_fp32_ops}
    if policy is not None:
        if any(v is not None for v in given.values()):
            raise AmpConfigError("pass op lists either in policy= (Policy.mxnet_ops) or as "
                                 "target_precision_ops/fp32_ops/conditional_fp32_ops, not both")
        resolved = user_policy(policy, ctx)
    else:
        dtype = low_dtype(target_dtype, "target_dtype")
        for name, value in given.items():
            if isinstance(value, str):
                raise AmpConfigError(f"{name} must be a list of op names, not the string "
                                     f"{value!r} (write [{value!r}])")
        ops = OpLists(lower=target_precision_ops or (), fp32=fp32_ops or (),
                      conditional_fp32=tuple(conditional_fp32_ops or ()),
                      replace=frozenset(_LISTS[name] for name, value in given.items()
                                        if value is not None))
        resolved = Policy.preset("mxnet-native", dtype=dtype, mxnet_ops=ops)
    resolved = resolved.with_emulation(emulate)
    resolved.validate_for("mxnet", registry())
    return resolved
