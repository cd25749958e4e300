"""Whole-program casts without an optimizer: the native ``cast_model_to_fp16`` family.

``cast_model`` rewrites a built program (``rewrite.Rewriter``) under the policy
the native list object describes (``config.native_policy``, as ``decorate``)
and returns the parameters now declared low; ``cast_parameters`` converts their
values in a scope.
"""
from __future__ import annotations

from typing import Iterable, Optional

import paddle
from paddle.base import core

from amp_adapters import dtype_name

from . import ir as program_ir
from .config import native_policy
from .env import DTYPE_OF, current_device, from_low, to_low
from .lists import check_amp_dtype, check_lists
from .report import record
from .rewrite import Rewriter
from .speed import note_native_speed, profile



def dtype_of(dest_type) -> str:
    """'float16' / 'bfloat16' from a VarType, a paddle dtype or a string (else the native
    ValueError)."""
    return check_amp_dtype(DTYPE_OF.get(dest_type, dest_type))


def cast_model(program, amp_lists=None, use_guard: bool = True, dtype: str = "float16",
               level: str = "O2", use_promote: bool = False) -> set[str]:
    """Rewrite ``program`` (its forward ops) in ``dtype`` at ``level``; returns the names of
    the parameters declared ``dtype`` (convert them with ``cast_parameters``)."""
    lists = check_lists(amp_lists, dtype)
    policy = native_policy(lists, dtype, level.upper(), use_promote)
    device, probe = current_device(), program_ir.of(program).probe
    note_native_speed(policy, probe, training=False)
    rewriter = Rewriter(policy, profile(policy, device, probe, False), use_guard,
                        frozenset(lists.black_varnames or ()))
    low = rewriter.low_params(program)
    rewriter.set_low_params(program, low)
    record(program, rewriter.rewrite(program))
    return set(low)


def cast_model_to_fp16(program, amp_lists=None, use_fp16_guard=True,
                       dest_type=core.VarDesc.VarType.FP16, level="O2", use_promote=False):
    """The native ``cast_model_to_fp16``: rewrite ``program`` in ``dest_type`` at ``level``
    (O1, O2, OD) under ``amp_lists``; returns the parameters now declared low precision.
    Device-aware: an op without a low-precision kernel here stays fp32."""
    return cast_model(program, amp_lists, bool(use_fp16_guard), dtype_of(dest_type), level,
                      use_promote)


def cast_parameters_to_fp16(place, program, scope=None, to_fp16_var_names=None,
                            dest_type=core.VarDesc.VarType.FP16, rewrite_master_weight=False,
                            master_weights=None):
    """The native ``cast_parameters_to_fp16``: convert the values of ``to_fp16_var_names``
    (what ``cast_model_to_fp16`` returned) in ``scope``; never converts a value twice."""
    cast_parameters(place, program, scope, to_fp16_var_names, dtype_of(dest_type),
                    rewrite_master_weight, master_weights)


def cast_parameters(place, program, scope=None, names: Optional[Iterable[str]] = None,
                    dtype: str = "float16", rewrite_master_weight: bool = False,
                    master_weights: Optional[dict] = None) -> None:
    """Convert the values of ``program``'s parameters in ``names`` to ``dtype`` in ``scope``;
    with ``rewrite_master_weight``, their fp32 masters get the rounded values."""
    scope = scope or paddle.static.global_scope()
    names = set(names or ())
    for block in program.blocks:
        for param in block.all_parameters():
            if param.name not in names or scope.find_var(param.name) is None:
                continue
            tensor = scope.find_var(param.name).get_tensor()
            if dtype_name(tensor._dtype()) == dtype:
                continue  # converted already: never twice (bf16 bits)
            low = to_low(tensor, dtype)  # the one fp32 -> low conversion (amp_init's)
            tensor.set(low, place)
            master = (master_weights or {}).get(param.name)
            if rewrite_master_weight and master is not None:
                scope.find_var(master.name).get_tensor().set(from_low(low, dtype), place)


def find_true_prev_op(ops, cur_op, var_name):
    """The one op before ``cur_op`` in ``ops`` that writes ``var_name`` (None if none);
    two such ops are a ValueError, as natively."""
    prev = []
    for op in ops:
        if op == cur_op:
            break
        if var_name in op.output_arg_names:
            prev.append(op)
    if len(prev) > 1:
        raise ValueError(f"There must be only one previous op that outputs {var_name} variable")
    return prev[0] if prev else None


def find_true_post_op(ops, cur_op, var_name, search_all=False):
    """The ops after ``cur_op`` in ``ops`` that read ``var_name`` (all of ``ops`` when
    ``search_all``: ``cur_op`` may come from another program)."""
    start = 0
    if not search_all:
        start = next((i + 1 for i, op in enumerate(ops) if op == cur_op), len(ops))
    return [op for op in ops[start:] if var_name in op.input_arg_names]


def find_op_index(block_desc, cur_op_desc) -> int:
    """The index of ``cur_op_desc`` in ``block_desc``, or -1."""
    for idx in range(block_desc.op_size()):
        if cur_op_desc == block_desc.op(idx):
            return idx
    return -1


def map_block(block, fn, parent_op=None) -> None:
    """Call ``fn(block, parent_op)`` on ``block`` and on every sub-block of its ops."""
    program = block.program
    fn(block, parent_op)
    for op in block.ops:
        if op.has_attr("sub_block"):
            map_block(program.block(op._block_attr_id("sub_block")), fn, op)
