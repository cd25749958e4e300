"""``fp16_guard`` / ``bf16_guard`` on both IRs: the native guards' name scopes.

``paddle_amp.fp16_guard`` is the native guard: ops built inside get the ``__use_fp16__``
name scope (``bf16_guard``: ``__use_bf16__``). What a program keeps of that scope is its
IR's business (``ProgramIR.guarding``): the legacy IR keeps it on each op, PIR ops keep
none, so PIR records the ops built inside. ``watch_native_guards`` makes entering either
scope, ours or a model library's own ``paddle.static.amp.fp16_guard()`` /
``paddle.static.amp.bf16.bf16_guard()``, go through that method, so all four guard the
same ops in both IRs.
"""
from __future__ import annotations

import contextlib
from typing import Iterator, Optional

import paddle
from paddle.base import framework

from . import ir
from .ir import BF16_GUARD_SCOPE, GUARD_SCOPES, FP16_GUARD_SCOPE


@contextlib.contextmanager
def fp16_guard() -> Iterator[None]:
    """Ops built inside run in low precision when decorated with ``use_fp16_guard`` (O2),
    on the legacy IR and under PIR, as inside the native guard."""
    with framework.name_scope(prefix=FP16_GUARD_SCOPE):
        yield


@contextlib.contextmanager
def bf16_guard() -> Iterator[None]:
    """The bf16 spelling of ``fp16_guard`` (``use_bf16_guard``): the same rule."""
    with framework.name_scope(prefix=BF16_GUARD_SCOPE):
        yield


def watch_native_guards() -> None:
    """Wrap ``framework.name_scope`` (which the native guards look up when entered) so that a
    guard's scope entered in static mode also enters the default main program's
    ``ProgramIR.guarding()``; anything else goes straight to Paddle's. Once, when paddle_amp
    is imported: a guard entered before that is not seen (PIR then refuses the guard,
    ``ProgramIR.prepare``)."""
    native = framework.name_scope
    if getattr(native, "_paddle_amp_watch", False):
        return

    @contextlib.contextmanager
    def name_scope(prefix: Optional[str] = None) -> Iterator[None]:
        with native(prefix):
            if prefix in GUARD_SCOPES and not framework.in_dygraph_mode():
                with ir.of(paddle.static.default_main_program()).guarding():
                    yield
            else:
                yield

    name_scope.__doc__ = native.__doc__
    name_scope.__wrapped__ = native  # type: ignore[attr-defined]
    name_scope._paddle_amp_watch = True  # type: ignore[attr-defined]
    framework.name_scope = name_scope


watch_native_guards()
