"""The loss-scale transition, written once over a tiny array vocabulary.

``update(config, state, found_inf, ops)`` is the whole state machine of
DESIGN.md, branch-free: every quantity is computed and ``ops.where`` picks,
as jmp's ``DynamicLossScale.adjust`` and optax's ``apply_if_finite`` do. The
core runs it on numpy scalars (``NumpyOps``); ``paddle_amp`` runs the very
same function with a vocabulary whose methods append graph ops, so the program
it builds is this function, not a translation of it. Only the ``kind`` (a
config constant) selects code in Python; no branch depends on data.

**The float32 rounding rule** (the one place a backend could differ): the scale
is a float32 value; the factors are kept in double precision as configured;
a move computes ``scale * factor`` as an IEEE double product and rounds that
once to float32 (round to nearest even; inf when it exceeds float32's range),
then clamps to ``[min_scale, max_scale]`` (float32 values). This is what
torch's ``_amp_update_scale_`` does (float scale times double factor), so
``from_torch`` is exact for any factor; ``from_paddle`` rounds its ratios to
float32 first, as Paddle's attributes do, and then the double product of two
float32 values is exact, so its rounding equals Paddle's float32 multiply.
A vocabulary must implement ``mul`` to give exactly this.
"""
from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple, Protocol, TypeVar, runtime_checkable

from .config import LossScaleConfig
from .state import FIELDS

A = TypeVar("A")


@runtime_checkable
class ArrayOps(Protocol[A]):
    """What a backend provides to run ``update``: ``A`` is its array type (a numpy scalar,
    a Paddle ``Variable``, a PIR ``Value``...). Every array is a scalar (shape ``[1]`` in a
    graph); counters are integer arrays, ``scale`` a float32 array, flags bool arrays.
    Python numbers passed as arguments are constants of the other operand's dtype."""

    def where(self, cond: A, x: A, y: A) -> A:
        """``x`` where ``cond`` else ``y`` (same dtype)."""

    def add(self, x: A, value: int) -> A:
        """``x + value`` for an integer array."""

    def zero(self, like: A) -> A:
        """A 0 of ``like``'s dtype."""

    def equal(self, x: A, value: int) -> A:
        """``x == value`` (bool)."""

    def mul(self, scale: A, factor: float) -> A:
        """``scale * factor`` under the rounding rule: the double product rounded once
        to float32 (float32 result; inf on overflow)."""

    def minimum(self, x: A, bound: float) -> A:
        """``min(x, bound)`` for a float32 ``x`` and a float32-exact ``bound`` (may be inf)."""

    def maximum(self, x: A, bound: float) -> A:
        """``max(x, bound)`` for a float32 ``x`` and a float32-exact ``bound``."""

    def isfinite(self, x: A) -> A:
        """``x`` is neither inf nor NaN (bool)."""

    def logical_and(self, x: A, y: A) -> A: ...

    def logical_not(self, x: A) -> A: ...


StateArrays = NamedTuple("StateArrays", [(name, Any) for name in FIELDS])  # type: ignore
StateArrays.__doc__ = """The six state fields (``state.FIELDS``) as a backend's arrays: what
``update`` reads and returns when the caller has no record type of its own."""
StateArrays.__module__ = __name__


S = TypeVar("S")


def _replace(state: S, **changes: Any) -> S:
    if dataclasses.is_dataclass(state):
        return dataclasses.replace(state, **changes)  # type: ignore[type-var]
    return state._replace(**changes)  # type: ignore[attr-defined]


def count_step(config: LossScaleConfig, state: S, found_inf: Any, ops: ArrayOps) -> S:
    """The counters every kind keeps: ``total_steps`` always; for kinds that check overflow
    ``skipped_steps`` (+1 on overflow) and ``consecutive_skips`` (+1 on overflow, else 0).
    ``scale``, ``good_steps``, ``bad_steps`` are returned unchanged."""
    total = ops.add(state.total_steps, 1)
    if not config.checks_overflow:
        return _replace(state, total_steps=total)
    skipped = ops.where(found_inf, ops.add(state.skipped_steps, 1), state.skipped_steps)
    consecutive = ops.where(found_inf, ops.add(state.consecutive_skips, 1),
                            ops.zero(state.consecutive_skips))
    return _replace(state, total_steps=total, skipped_steps=skipped,
                    consecutive_skips=consecutive)


def move_scale(config: LossScaleConfig, scale: A, good_steps: A, bad_steps: A, found_inf: A,
               ops: ArrayOps) -> tuple[A, A, A]:
    """``(scale, good_steps, bad_steps)`` after one step of a dynamic loss scale.

    - overflow: ``good=0``, ``bad+=1``; at ``bad == hysteresis``:
      ``scale = max(scale * backoff_factor, min_scale)``, ``bad=0``.
    - clean: ``bad=0``, ``good+=1``; at ``good == growth_interval``:
      ``scale = min(scale * growth_factor, max_scale)`` unless that is not finite
      (then the scale stays), ``good=0``.
    """
    clean = ops.logical_not(found_inf)
    good, bad = ops.add(good_steps, 1), ops.add(bad_steps, 1)
    back_off = ops.logical_and(found_inf, ops.equal(bad, config.hysteresis))
    grow = ops.logical_and(clean, ops.equal(good, config.growth_interval))
    backed = ops.maximum(ops.mul(scale, config.backoff_factor), config.min_scale)
    grown = ops.minimum(ops.mul(scale, config.growth_factor), config.max_scale)
    grown = ops.where(ops.isfinite(grown), grown, scale)
    new_scale = ops.where(back_off, backed, ops.where(grow, grown, scale))
    zero_good, zero_bad = ops.zero(good_steps), ops.zero(bad_steps)
    new_good = ops.where(grow, zero_good, ops.where(found_inf, zero_good, good))
    new_bad = ops.where(back_off, zero_bad, ops.where(found_inf, bad, zero_bad))
    return new_scale, new_good, new_bad


def update(config: LossScaleConfig, state: S, found_inf: Any, ops: ArrayOps) -> S:
    """The state after one step that did (``found_inf``) or did not overflow.

    ``state`` is any record with the six fields (``LossScaleState``, ``StateArrays``, a
    dataclass or a NamedTuple) holding ``ops``' arrays; a new record of the same type is
    returned. A new scale is the one the very next step uses (no lag). No host sync: with a
    graph vocabulary this only builds ops."""
    counted = count_step(config, state, found_inf, ops)
    if config.kind != "dynamic":
        return counted
    scale, good, bad = move_scale(config, state.scale, state.good_steps, state.bad_steps,
                                  found_inf, ops)
    return _replace(counted, scale=scale, good_steps=good, bad_steps=bad)
