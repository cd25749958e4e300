"""``fp16_guard`` under PIR: which ops were built inside the guard's name scope.

PIR ops keep no name scope (PIR_NOTES P12), so the native guard, which is only
``framework.name_scope("__use_fp16__")``, leaves no trace on them. Model libraries call
it (PaddleNLP's Transformer: ``with paddle.static.amp.fp16_guard():``), and the native
looks ``framework.name_scope`` up when entered, so ``watch_native_guards`` wraps that
one function: entering a guard's scope (``GUARD_PATTERNS``) in a PIR program records the
ids of the ops built inside (``guarded_ops``); anything else goes straight to Paddle's.
Installed once, when paddle_amp is imported: a guard entered before that is not seen, and
``use_fp16_guard`` on a program where nothing was recorded is an error (``PirProgram``).
"""
from __future__ import annotations

import contextlib
import weakref
from typing import Iterator, Optional

import paddle
from paddle.base import framework

from ...guard import BF16_GUARD_PATTERN, GUARD_PATTERN

GUARD_PATTERNS = (GUARD_PATTERN, BF16_GUARD_PATTERN)

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
def recording() -> Iterator[None]:
    """Record the ops built inside into the default main program's guarded ops (PIR)."""
    program = paddle.static.default_main_program()
    before = _op_ids(program)
    try:
        yield
    finally:
        _GUARDED.setdefault(program, set()).update(_op_ids(program) - before)


def guarded_ops(program) -> frozenset[int]:
    """The ids of ``program``'s ops built inside a guard (paddle_amp's or the native's)."""
    return frozenset(_GUARDED.get(program, ()))


def watch_native_guards() -> None:
    """Wrap ``framework.name_scope`` so a guard's scope entered under PIR records its ops
    (once; the wrapper keeps Paddle's signature and behaviour otherwise)."""
    native = framework.name_scope
    if getattr(native, "_paddle_amp_watch", False):
        return

    @contextlib.contextmanager
    def name_scope(prefix: Optional[str] = None) -> Iterator[None]:
        with native(prefix):
            if prefix in GUARD_PATTERNS and framework.in_pir_mode():
                with recording():
                    yield
            else:
                yield

    name_scope.__doc__ = native.__doc__
    name_scope.__wrapped__ = native  # type: ignore[attr-defined]
    name_scope._paddle_amp_watch = True  # type: ignore[attr-defined]
    framework.name_scope = name_scope
