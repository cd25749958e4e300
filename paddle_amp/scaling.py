"""Loss scaling as program ops: the core's ``update``, emitted into the program.

Written once, for both IRs, over ``ir.ScalingIR`` (its part of ``ir.ProgramIR``). After
the backward pass:

1. unscale: ``found_inf`` over every gradient, all-reduced over the
   data-parallel workers (``resolve_ring_id``) before anything reads it, so
   all workers take the same decision and keep a bit-identical scale state;
2. on overflow, which gradients were not finite (``check_guard`` names them);
3. the optimizer's ops, made a true skip by the IR's skip table (a kernel that
   skips itself, a fold, or the guard block);
4. ``amp_adapters.rules.loss_scale.update`` itself, called with the IR's ``ArrayOps``:
   the program *is* the core's transition. Paddle's fused ``update_loss_scaling``
   (plus a clip) moves the scale only where it is bit-equal to the rule
   (``native_update_is_exact``); the counters are always the core's.

The state lives in persistable vars (``state.py``); no host sync in the step.
"""
from __future__ import annotations

import math
import os
from typing import Optional

import numpy as np
import paddle

from amp_adapters import LossScale
from amp_adapters.rules.loss_scale import (FIELDS, SkipWindow, StateArrays, check_guard, count_step,
                                           update)
from amp_adapters.rules.loss_scale.checks import f32

from . import state as scope_state
from .ir import ScalingIR

__all__ = ["LossScaling", "resolve_ring_id", "native_update_is_exact"]


def resolve_ring_id(setting) -> Optional[int]:
    """The ring to all-reduce ``found_inf`` over, or None for no reduction.

    ``None`` (auto): ring 0 when this process is one of several data-parallel
    workers (``paddle.distributed.get_world_size() > 1`` or ``PADDLE_TRAINERS_NUM > 1``,
    as ``python -m paddle.distributed.launch`` sets), else no reduction. ``False``: never.
    ``True``: ring 0. An int >= 0: that ring (it must be initialised when the program runs;
    the communicator is the caller's: NCCL on GPU, gloo on CPU). Off suits one process, a
    program that all-reduces the gradients before the check, or parameter-server mode.
    """
    if setting is None:
        try:
            world = int(paddle.distributed.get_world_size())
        except Exception:  # noqa: BLE001 - a build without the distributed env: use the env var
            world = 1
        world = max(world, int(os.environ.get("PADDLE_TRAINERS_NUM", "1") or 1))
        return 0 if world > 1 else None
    if setting is False:
        return None
    if setting is True:
        return 0
    if isinstance(setting, (int, np.integer)) and setting >= 0:
        return int(setting)
    raise TypeError(f"found_inf_ring_id must be None (auto), False (off), True or a ring id "
                    f"(int >= 0), got {setting!r}")

def native_update_is_exact(config) -> bool:
    """True when Paddle's ``update_loss_scaling`` op followed by a clip to
    ``[min_scale, max_scale]`` computes exactly the core's scale/good/bad move for
    ``config``: both factors are float32 values (the op's attributes are float32 and it
    multiplies in float32, which then equals the double product rounded once), its floor
    of 1 is at or below ``min_scale``, and growth cannot overflow float32 before the
    ceiling (where the op would keep the old scale and the rule take ``max_scale``)."""
    if config.kind != "dynamic" or config.min_scale < 1:
        return False
    if f32(config.growth_factor) != config.growth_factor or \
            f32(config.backoff_factor) != config.backoff_factor:
        return False
    with np.errstate(over="ignore"):
        grown = np.float32(config.max_scale) * np.float32(config.growth_factor)
    return math.isinf(config.max_scale) or bool(np.isfinite(grown))


class LossScaling:
    """The in-program loss scale of one decorated program (in the IR ``ir``), starting from
    ``initial``.

    ``found_inf_ring_id``: see ``resolve_ring_id`` (None: auto, an int: that ring, False: off).
    """

    def __init__(self, ir: ScalingIR, initial: LossScale, found_inf_ring_id=None):
        self.ir = ir
        self.initial = initial
        self.config = initial.config
        self.found_inf_ring_id = found_inf_ring_id
        self.ring_id: Optional[int] = None  # the ring found_inf was reduced over, once built
        self.fields = scope_state.held_fields(self.config)
        self.vars: dict = {}
        self.param_names: tuple[str, ...] = ()
        self._window: Optional[SkipWindow] = None

    # -- building -----------------------------------------------------------------------------

    def create_vars(self) -> None:
        """The persistable state vars (under the caller's program_guard), at ``initial``; where
        nothing is scaled (bf16), a ``scale`` var too, at 1.0 and never written: the native
        API hands out the loss-scale var (``get_loss_scaling``) whatever the dtype."""
        state = self.initial.state
        for name in self.fields:
            self.vars[name] = self.ir.state_var(
                scope_state.DTYPE[name], [1], getattr(state, name),
                "loss_scaling" if name == "scale" else f"amp_{name}")
        if "scale" not in self.vars:
            self.vars["scale"] = self.ir.state_var("float32", [1], 1.0, "loss_scaling")

    def scale_loss(self, loss):
        """``loss * scale`` (loss itself when nothing is scaled)."""
        if not self.config.checks_overflow:
            return loss
        return self.ir.scale_loss(loss, self.vars["scale"])

    def apply(self, params_grads, optimizer) -> list:
        """Unscale and check ``params_grads``, apply ``optimizer`` on finite steps only, and
        advance the state. Returns the optimizer's ops."""
        ir = self.ir
        if not self.config.checks_overflow:
            ops = optimizer.apply_gradients(params_grads)
            with ir.optimizer_section():
                self._emit_update(None, None)
            return ops
        grads = [g for _, g in params_grads]
        self.param_names = tuple(p.name for p, _ in params_grads)
        with ir.optimizer_section():
            flags = self.vars["grad_finite"] = ir.state_var("bool", [len(grads)], True,
                                                            "amp_grad_finite")
            found_inf = ir.unscale(grads, self.vars["scale"])
            self.ring_id = resolve_ring_id(self.found_inf_ring_id)
            if self.ring_id is not None:  # before the scale update, the skip and the guard
                found_inf = ir.all_reduce_max(found_inf, self.ring_id)
            ir.record_nonfinite(found_inf, grads, flags)
        optimizer._set_auxiliary_var("found_inf", found_inf)  # kernels that skip themselves
        mark = ir.mark()
        ops = optimizer.apply_gradients(params_grads)
        with ir.optimizer_section():
            ops = ir.skip(optimizer, mark, found_inf, grads, self.vars) or ops
            self._emit_update(found_inf, grads[0])
        return ops

    def _emit_update(self, found_inf, carrier) -> None:
        """The core's ``update`` as ops at the end of the program; the fused op for the scale
        move where it is exact (it zeroes its ``X``, here just ``carrier``, on overflow:
        after every reader of the gradients)."""
        ops, v, c = self.ir.state_ops(), self.vars, self.config
        old = StateArrays(*(v.get(name) for name in FIELDS))
        if native_update_is_exact(c):
            self.ir.fused_update(carrier, found_inf, v, c)
            if c.min_scale > 1 or math.isfinite(c.max_scale):
                self.ir.clip(v["scale"], c.min_scale, c.max_scale)
            new = count_step(c, old, found_inf, ops)
        else:
            new = update(c, old, found_inf, ops)
        for name in self.fields:  # (unchanged or written by the fused op: nothing to store)
            ops.store(getattr(new, name), v[name])

    # -- state ----------------------------------------------------------------------------------

    def _names(self) -> dict[str, str]:
        return {f: self.vars[f].name for f in self.fields}

    def read(self, scope) -> LossScale:
        """The current state, from the scope: one small host read per var."""
        return scope_state.read(scope, self._names(), self.config)

    def write(self, scope, state_dict: dict, place) -> None:
        """Set the scope's state vars from a ``state_dict()``, all or nothing; its config must
        match the program's (the state machine's constants are baked into the ops)."""
        state = scope_state.write(scope, self._names(), self.config, state_dict, place)
        self._window = SkipWindow.at(state)  # the skip-fraction window restarts here

    def check_guard(self, scope) -> None:
        """``loss_scale.check_guard`` on the scope's state: raise ``OverflowGuardError``
        (naming the parameters with non-finite gradients) after ``max_consecutive_skips``
        overflows in a row, a collapsed scale, or too many skips in a window."""
        if not self.config.checks_overflow:
            return
        flags = self.vars.get("grad_finite")
        self._window = check_guard(
            self.config, scope_state.read_state(scope, self._names(), self.config),
            # `flags and flags.name` would call bool() on a PIR value, which raises
            lambda: scope_state.nonfinite_params(
                scope, None if flags is None else flags.name, self.param_names),
            self._window)
