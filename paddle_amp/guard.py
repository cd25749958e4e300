"""``fp16_guard`` on both IRs: the native guard's name scope.

``paddle_amp.fp16_guard`` is the native guard: ops built inside get the ``__use_fp16__``
name scope. The legacy IR keeps it on each op (``op_namescope``); PIR ops keep none, so
under PIR entering that scope records the ops built inside (``ir.pir.guard``): a model
library's own ``paddle.static.amp.fp16_guard()`` counts as this one, in both IRs.
"""
from __future__ import annotations

import contextlib
from typing import Iterator

from paddle.base import framework

# The native fp16_guard name scope: code written for the native guard works unchanged.
GUARD_PATTERN = "__use_fp16__"
BF16_GUARD_PATTERN = "__use_bf16__"  # the native bf16_guard's name scope


@contextlib.contextmanager
def fp16_guard() -> Iterator[None]:
    """Ops built inside run in low precision when decorated with ``use_fp16_guard`` (O2),
    on the legacy IR and under PIR, as inside the native guard."""
    with framework.name_scope(prefix=GUARD_PATTERN):
        yield


@contextlib.contextmanager
def bf16_guard() -> Iterator[None]:
    """The bf16 spelling of ``fp16_guard`` (``use_bf16_guard``): the same rule."""
    with framework.name_scope(prefix=BF16_GUARD_PATTERN):
        yield
