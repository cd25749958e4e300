"""``fp16_guard`` on both IRs: the native name scope (legacy) and recorded op ids (PIR).

The legacy IR finds guarded ops by the native ``__use_fp16__`` name scope. PIR
ops keep none, so under PIR ``fp16_guard`` records the ids of the ops built
inside it (``guarded_ops``); the native guard leaves no trace there, and a
``use_fp16_guard`` program whose guard recorded nothing is an error (``ir.pir``).
"""
from __future__ import annotations

import contextlib
import weakref
from typing import Iterator

import paddle
from paddle.base import framework

# The native fp16_guard name scope: code written for the native guard works unchanged.
GUARD_PATTERN = "__use_fp16__"
BF16_GUARD_PATTERN = "__use_bf16__"  # the native bf16_guard's name scope

_GUARDED: "weakref.WeakKeyDictionary[object, set[int]]" = weakref.WeakKeyDictionary()


def _op_ids(program) -> set[int]:
    ids = set()
    stack = [program.global_block()]
    while stack:
        block = stack.pop()
        for op in block.ops:
            ids.add(op.id())
            if op.num_regions():
                stack.extend(list(op.blocks()))
    return ids


@contextlib.contextmanager
def fp16_guard() -> Iterator[None]:
    """Ops built inside run in low precision when decorated with ``use_fp16_guard`` (O2),
    on the legacy IR and under PIR."""
    if not framework.in_pir_mode():
        with framework.name_scope(prefix=GUARD_PATTERN):
            yield
        return
    program = paddle.static.default_main_program()
    before = _op_ids(program)
    try:
        yield
    finally:
        _GUARDED.setdefault(program, set()).update(_op_ids(program) - before)


@contextlib.contextmanager
def bf16_guard() -> Iterator[None]:
    """The bf16 spelling of ``fp16_guard`` (``use_bf16_guard``): the same rule (legacy IR)."""
    with framework.name_scope(prefix=BF16_GUARD_PATTERN):
        yield


def guarded_ops(program) -> frozenset[int]:
    """The ids of ``program``'s ops built inside ``paddle_amp.fp16_guard()`` under PIR."""
    return frozenset(_GUARDED.get(program, ()))
