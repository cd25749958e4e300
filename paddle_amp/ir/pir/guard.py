"""The guards under PIR: which ops were built inside a guard's name scope.

PIR ops keep no name scope (PIR_NOTES P12), so a guard, which is only
``framework.name_scope("__use_fp16__")`` (``__use_bf16__``), leaves no trace on them.
``PirProgram.guarding`` (entered by ``paddle_amp.guard`` whenever a guard's scope is,
ours or the native's) records the ids of the ops built inside (``guarded_ops``).
"""
from __future__ import annotations

import contextlib
import weakref
from typing import Iterator

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
def recording(program) -> Iterator[None]:
    """Record the ops built inside into ``program``'s guarded ops."""
    before = _op_ids(program)
    try:
        yield
    finally:
        _GUARDED.setdefault(program, set()).update(_op_ids(program) - before)


def guarded_ops(program) -> frozenset[int]:
    """The ids of ``program``'s ops built inside a guard (paddle_amp's or the native's)."""
    return frozenset(_GUARDED.get(program, ()))
