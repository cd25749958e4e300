"""The true skip: an overflow step leaves parameters and all optimizer state bit-identical.

Ops whose kernel skips itself on ``found_inf`` (Adam, AdamW, Lamb: ``SkipUpdate``)
stay where they are. Plain SGD is folded (``fold_sgd``): on overflow the
gradients are zeroed and every ``sgd`` op reads a learning rate of 0, so
``param - 0 * (0 + decay * param)`` is ``param`` exactly, at the cost of two
scalar ops a step. If any other op of the optimizer writes a parameter or a
persistable state (Momentum's velocity moves even on a zero gradient), all its
ops (clipping, weight decay, update, accumulators) move into a
``conditional_block`` on ``not found_inf`` (its sub-executor costs ~0.1 ms a
step on CPU). The native instead zeroes the grads and still runs SGD and
Momentum.
"""
from __future__ import annotations

from typing import Callable

from paddle.base import unique_name

from .env import VarType
from .legacy_ops import BlockOps


def needs_guard(block, ops, found_inf, lr_folded=None) -> bool:
    """True if some op of ``ops`` writes state and does not skip itself on ``found_inf``
    (an ``sgd`` op reading the folded learning rate ``lr_folded`` skips itself)."""
    return any(writes_state(block, op) and not skips_on(op, found_inf)
               and not (lr_folded is not None and op.type == "sgd"
                        and op.input("LearningRate") == [lr_folded.name])
               for op in ops)


def fold_sgd(block, optimizer, found_inf, grads, state_vars):
    """Before an SGD optimizer's ops: on overflow zero ``grads`` and make the learning rate 0.

    Returns the folded learning-rate var; ``use_folded_lr`` points the ``sgd`` ops at it
    once they exist. The zeroing is ``update_loss_scaling`` with ``stop_update``: it
    writes the gradients only on an overflow step, and moves no scale.
    """
    ops = BlockOps(block)
    by_dtype: dict = {}
    for g in grads:
        by_dtype.setdefault(g.dtype, []).append(g)
    for group in by_dtype.values():
        scale, good, bad = (ops.tmp(state_vars[n].dtype) for n in ("scale", "good", "bad"))
        block.append_op(
            type="update_loss_scaling",
            inputs={"X": group, "FoundInfinite": [found_inf],
                    "PrevLossScaling": [state_vars["scale"]],
                    "InGoodSteps": [state_vars["good"]], "InBadSteps": [state_vars["bad"]]},
            outputs={"Out": group, "LossScaling": [scale], "OutGoodSteps": [good],
                     "OutBadSteps": [bad]},
            attrs={"incr_every_n_steps": 1, "decr_every_n_nan_or_inf": 1, "incr_ratio": 2.0,
                   "decr_ratio": 0.5, "stop_update": True})
    optimizer._create_global_learning_rate()
    lr = optimizer._global_learning_rate()
    finite = ops.cast(ops.logical_not(found_inf), lr.dtype)
    return ops.binary("elementwise_mul", lr, finite, lr.dtype)


def use_folded_lr(ops, lr, folded) -> None:
    """Point every ``sgd`` op of ``ops`` that reads ``lr`` at the folded learning rate."""
    for op in ops:
        if op.type == "sgd" and op.input("LearningRate") == [lr.name]:
            op._rename_input(lr.name, folded.name)


def guard_ops(program, block, start: int, found_inf) -> list:
    """Move ``block``'s ops from ``start`` on into ``if not found_inf:``; returns the moved
    ops (as they are in the sub-block)."""
    finite = BlockOps(block).tmp(VarType.BOOL)
    block._insert_op(start, type="logical_not", inputs={"X": [found_inf]},
                     outputs={"Out": [finite]})
    moved_src = block.ops[start + 1:]

    def build(sub):
        for op in moved_src:
            sub.desc.append_op().copy_from(op.desc)
        sub._sync_with_cpp()
        return list(sub.ops)
    moved = cond_block(program, block, finite, build)
    for _ in range(len(block.ops) - start - 2):  # keep logical_not and the cond op
        block._remove_op(start + 1, sync=False)  # one sync per removal made this quadratic
    block._sync_with_cpp()
    return moved


def writes_state(block, op) -> bool:
    """True if ``op`` writes a persistable var (a parameter or optimizer state)."""
    return any(getattr(block._find_var_recursive(n), "persistable", False)
               for n in op.output_arg_names)


def skips_on(op, found_inf) -> bool:
    """True if ``op``'s kernel leaves all its outputs unchanged when ``found_inf`` is set."""
    return "SkipUpdate" in op.input_names and op.input("SkipUpdate") == [found_inf.name]


def cond_block(program, parent, cond, build: Callable) -> list:
    """Append ``if cond: build(sub_block)`` to ``parent``; returns what ``build`` returns."""
    sub = program._create_block(parent_idx=parent.idx)
    try:
        result = build(sub)
    finally:
        program._rollback()
    reads: dict = {}
    writes: dict = {}
    for op in sub.ops:  # the outer vars the block reads and writes, in first-use order
        for names, into in ((op.input_arg_names, reads), (op.output_arg_names, writes)):
            for name in names:
                var = None if sub.has_var(name) else parent._find_var_recursive(name)
                if var is not None:
                    into.setdefault(name, var)
    scope = parent.create_var(name=unique_name.generate("amp_cond_scope"),
                              type=VarType.STEP_SCOPES)
    parent.append_op(type="conditional_block",
                     inputs={"Cond": [cond], "Input": list(reads.values())},
                     outputs={"Out": list(writes.values()), "Scope": [scope]},
                     attrs={"sub_block": sub, "is_scalar_condition": True})
    return result
