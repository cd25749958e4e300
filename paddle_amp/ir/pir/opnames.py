"""PIR op names and operand names, translated into the legacy vocabulary the op tables use.

The core decides by legacy Paddle op name (``matmul_v2``, ``reduce_mean``...),
so ``[ops.paddle]`` in a policy means the same ops on both IRs. Under PIR the
same ops carry their phi kernel names, and three of them change meaning:
PIR ``matmul`` is legacy ``matmul_v2`` (legacy ``matmul`` is PIR
``legacy_matmul``), PIR ``mean`` is ``reduce_mean`` (legacy ``mean`` is
``mean_all``), PIR ``sum`` is ``reduce_sum`` (legacy ``sum`` is ``add_n``).
Passing PIR names straight to the core would silently apply the wrong
category, so every PIR name goes through ``legacy_name``:

1. ``OVERRIDES`` (data): the names Paddle's own legacy->phi map leaves without
   a reverse (``reshape``, the control-flow ``if``) or reaches from two legacy
   names (``transpose``, ``fill``, ``deformable_conv``);
2. the reverse of ``core._get_phi_kernel_name`` over every registered legacy op;
3. an in-place variant (``relu_``, ``batch_norm_``) as its base;
4. otherwise the PIR name itself when it is no legacy op's name (a PIR-only op,
   which the core treats as an unknown op: ``follow``), else the full
   ``pd_op.`` name, which no table lists: never a different legacy op by accident.

Operand and result names are snake_case under PIR and CamelCase in the legacy
tables (``Scale`` -> ``scale``, ``MeanOut`` -> ``mean_out``): ``snake``, and back: ``camel``.
"""
from __future__ import annotations

import functools
import re

from paddle.base import core

# PIR op name (without dialect) -> legacy op name, where the derived reverse is wrong or empty.
OVERRIDES = {
    "reshape": "reshape2",            # reshape2 -> reshape_with_xshape, reshape -> legacy_reshape
    "transpose": "transpose2",        # tie: transpose and transpose2; programs hold transpose2
    "transpose_grad": "transpose2_grad",
    "fill": "fill_any",               # tie: fill and fill_any; Tensor.fill_ builds fill_any
    "deformable_conv": "deformable_conv",
    "deformable_conv_grad": "deformable_conv_grad",
    "if": "conditional_block",        # paddle.static.nn.cond
    "while": "while",                 # paddle.static.nn.while_loop
    "pylayer": "pylayer",
}

# Ops that carry no computation to plan: program plumbing (the legacy rewrite's _IO_OPS).
SKIPPED_DIALECTS = ("builtin.", "cf.")
SKIPPED = frozenset({"pd_op.data", "pd_op.feed", "pd_op.fetch", "pd_op.full",
                     "pd_op.full_int_array", "pd_op.full_like", "pd_op.assign_value_",
                     "pd_op.assign_value"})


def is_plumbing(pir_name: str) -> bool:
    """True for ops the rewrite never plans (parameters, data, constants, combine/split,
    yields)."""
    return pir_name.startswith(SKIPPED_DIALECTS) or pir_name in SKIPPED


@functools.lru_cache(maxsize=1)
def _reverse() -> dict[str, str]:
    """phi name -> legacy name over the live registry, ties left to ``OVERRIDES``."""
    out: dict[str, list[str]] = {}
    for legacy in core.get_all_op_names():
        try:
            phi = core._get_phi_kernel_name(legacy)
        except Exception:  # noqa: BLE001 - an op with no phi kernel: not reachable from PIR
            continue
        if phi:
            out.setdefault(phi, []).append(legacy)
    return {phi: sorted(names)[0] for phi, names in out.items()}


@functools.lru_cache(maxsize=1)
def _legacy_names() -> frozenset[str]:
    return frozenset(core.get_all_op_names())


@functools.lru_cache(maxsize=None)
def legacy_name(pir_name: str) -> str:
    """The legacy op name the op tables and policies use for the PIR op ``pir_name``
    (``"pd_op.matmul"`` -> ``"matmul_v2"``)."""
    name = pir_name.split(".", 1)[1] if "." in pir_name else pir_name
    for candidate in (name, name[:-1] if name.endswith("_") else None):
        if candidate is None:
            continue
        if candidate in OVERRIDES:
            return OVERRIDES[candidate]
        found = _reverse().get(candidate)
        if found is not None:
            return found
    if name not in _legacy_names():
        return name
    return pir_name


def snake(slot: str) -> str:
    """A legacy CamelCase slot name in PIR's snake_case (``MeanOut`` -> ``mean_out``)."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", slot).lower()


def camel(slot: str) -> str:
    """A PIR snake_case operand name as the legacy CamelCase slot the op tables and the core
    use (``mean_out`` -> ``MeanOut``, ``x`` -> ``X``): the inverse of ``snake``."""
    return "".join(part[:1].upper() + part[1:] for part in slot.split("_"))
