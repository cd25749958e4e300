"""The true skip on the legacy IR: an overflow step leaves parameters and all optimizer state
bit-identical (the native zeroes the grads and still runs SGD and Momentum).

Chosen by what the optimizer's ops do, never by its type (torch's
``_step_supports_amp_scaling`` is the model): each built op that writes a
persistable is looked up once in one table, ``skip_of``:

- ``self``: its kernel skips itself (it reads ``found_inf`` as ``SkipUpdate``:
  adam, adamw, lamb);
- ``fold``: a ``FOLDABLE`` kernel reading the global learning rate (``sgd``). On
  overflow, ops put before the optimizer's zero the gradients and the learning
  rate, so ``param - 0 * (0 + decay * param)`` is ``param`` exactly (two scalar
  ops a step);
- ``guard``: anything else (Momentum's velocity moves on a zero gradient): all
  the optimizer's ops move into a ``conditional_block`` on ``not found_inf``
  (~0.1 ms a step on CPU).
"""
from __future__ import annotations

from typing import Callable, Optional

from paddle.base import framework, unique_name

from ...env import VarType
from .ops import BlockOps

# Kernels whose update is exact with a zero gradient and a learning rate of 0.
FOLDABLE = frozenset({"sgd"})


def skip_of(block, op, found_inf, lr) -> Optional[str]:
    """The table: how ``op`` skips an overflow step ('self', 'fold', 'guard'), or None when
    it writes no persistable."""
    if not any(getattr(block._find_var_recursive(n), "persistable", False)
               for n in op.output_arg_names):
        return None
    if "SkipUpdate" in op.input_names and op.input("SkipUpdate") == [found_inf.name]:
        return "self"
    if op.type in FOLDABLE and lr is not None and op.input("LearningRate") == [lr.name]:
        return "fold"
    return "guard"


def skip(program, block, optimizer, start: int, found_inf, grads, state: dict):
    """The optimizer's ops from ``start`` on made a true skip; the moved ops if guarded."""
    lr = optimizer._global_learning_rate()
    kinds = {skip_of(block, op, found_inf, lr) for op in block.ops[start:]}
    if "guard" in kinds:
        return guard_ops(program, block, start, found_inf)
    if "fold" in kinds:
        folded = _fold(block, start, found_inf, grads, state, lr)
        for op in block.ops[start:]:
            if op.type in FOLDABLE and op.input("LearningRate") == [lr.name]:
                op._rename_input(lr.name, folded.name)
    return None


def _fold(block, start: int, found_inf, grads, state: dict, lr):
    """Before the optimizer's ops (at ``start``): on overflow zero ``grads`` and make the
    learning rate 0; returns the folded learning-rate var. The zeroing is
    ``update_loss_scaling`` with ``stop_update``: it writes the gradients only on an
    overflow step, and moves no scale."""
    end = len(block.ops)
    ops = BlockOps(block)
    by_dtype: dict = {}
    for g in grads:
        by_dtype.setdefault(g.dtype, []).append(g)
    for group in by_dtype.values():
        scale, good, bad = (ops.tmp(state[n].dtype) for n in ("scale", "good_steps",
                                                               "bad_steps"))
        block.append_op(
            type="update_loss_scaling",
            inputs={"X": group, "FoundInfinite": [found_inf], "PrevLossScaling": [state["scale"]],
                    "InGoodSteps": [state["good_steps"]], "InBadSteps": [state["bad_steps"]]},
            outputs={"Out": group, "LossScaling": [scale], "OutGoodSteps": [good],
                     "OutBadSteps": [bad]},
            attrs={"incr_every_n_steps": 1, "decr_every_n_nan_or_inf": 1, "incr_ratio": 2.0,
                   "decr_ratio": 0.5, "stop_update": True})
    finite = ops.cast(ops.logical_not(found_inf), lr.dtype)
    folded = ops.binary("elementwise_mul", lr, finite, lr.dtype)
    _move(block, end, start)
    return folded


def _move(block, first: int, at: int) -> None:
    """Move ``block``'s ops from ``first`` to the end so that they start at ``at``."""
    n = len(block.ops) - first
    for k, op in enumerate(block.ops[first:]):
        block.desc._insert_op(at + k).copy_from(op.desc)
    block.desc._remove_op(first + n, first + 2 * n)
    moved = [framework.Operator(block, block.desc.op(at + k)) for k in range(n)]
    block.ops[at:] = moved + block.ops[at:first]


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
