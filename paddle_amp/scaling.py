"""Loss scaling as program ops: the core's ``update``, emitted into the program.

After the backward pass:

1. ``check_finite_and_unscale`` over every gradient (one op per gradient
   dtype) divides by ``scale`` and sets ``found_inf``; with several data-parallel
   workers it is all-reduced (``collective.py``);
2. the optimizer runs only on finite steps (a true skip, ``skip.py``);
3. the state moves by ``amp_adapters.loss_scale.update`` itself, called with a
   ``BlockOps`` vocabulary (``legacy_ops.py``): the program *is* the core's
   transition, not a copy of it. Paddle's fused ``update_loss_scaling`` op (plus
   a clip) replaces the scale/good/bad part only where it is bit-equal to the
   rule (``native_update``: factors exact in float32, floor >= 1, growth that
   cannot overflow below the ceiling; tested against the core); the counters
   always come from the core's ``count_step``;
4. on overflow, each parameter's "gradient was finite" flag is recorded, so the
   guard (``check_guard``) can name the culprits without an extra pass.

The state lives in persistable vars (``state.py``). No host sync happens in the
step; reading the state back is a scope read.
"""
from __future__ import annotations

import math
from typing import Optional

import numpy as np
import paddle
from paddle.base import framework, unique_name

from amp_adapters import LossScale
from amp_adapters.loss_scale import SkipWindow, StateArrays, count_step, update
from amp_adapters.loss_scale.checks import f32

from . import state as scope_state
from .collective import reduce_found_inf, resolve_ring_id
from .env import VarType
from .legacy_ops import BlockOps
from .skip import cond_block, fold_sgd, guard_ops, needs_guard, use_folded_lr
from .state import COUNTER_DTYPE as _COUNTER_DTYPE  # noqa: F401 - the PIR backend imports it

__all__ = ["LossScaling", "resolve_ring_id", "reduce_found_inf", "native_update_is_exact"]


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
    """The in-program loss scale of one decorated program, starting from ``initial``.

    ``found_inf_ring_id``: see ``resolve_ring_id`` (None: auto, an int: that ring, False: off).
    """

    def __init__(self, initial: LossScale, found_inf_ring_id=None):
        self.initial = initial
        self.config = initial.config
        self.found_inf_ring_id = found_inf_ring_id
        self.ring_id: Optional[int] = None  # the ring found_inf was reduced over, once built
        self.fields = scope_state.held_fields(self.config)
        self.counters = tuple(f for f in self.fields if f != "scale")
        self.vars: dict[str, framework.Variable] = {}
        self.param_names: tuple[str, ...] = ()
        self._window: Optional[SkipWindow] = None
        self._startup_block = None  # where the update's constants are filled (create_vars)

    @property
    def native_update(self) -> bool:
        """True when the fused ``update_loss_scaling`` op is used (see
        ``native_update_is_exact``)."""
        return native_update_is_exact(self.config)

    @property
    def elementary_update(self) -> bool:
        """True for a dynamic scale whose move is emitted as the core's elementary ops."""
        return self.config.kind == "dynamic" and not self.native_update

    # -- building -----------------------------------------------------------------------------

    def create_vars(self) -> None:
        """The persistable state vars (under the caller's program_guard), at ``initial``."""
        self._startup_block = paddle.static.default_startup_program().global_block()
        state = self.initial.state
        for name in self.fields:
            dtype = "float32" if name == "scale" else _COUNTER_DTYPE[name]
            stem = "loss_scaling" if name == "scale" else f"amp_{name}"
            self.vars[name] = paddle.static.create_global_var(
                shape=[1], value=getattr(state, name), dtype=dtype, persistable=True,
                name=unique_name.generate(stem))

    def scale_loss(self, block, loss):
        """``loss * scale`` (loss itself when nothing is scaled)."""
        if not self.config.checks_overflow:
            return loss
        out = block.create_var(name=unique_name.generate("scaled_loss"), dtype=loss.dtype,
                               shape=loss.shape)
        block.append_op(type="elementwise_mul", inputs={"X": [loss], "Y": [self.vars["scale"]]},
                        outputs={"Out": [out]}, attrs={"axis": -1})
        return out

    def apply(self, program, params_grads, optimizer) -> list:
        """Unscale and check ``params_grads``, apply ``optimizer`` on finite steps only, and
        advance the state. Returns the optimizer's ops."""
        block = program.global_block()
        if not self.config.checks_overflow:
            ops = optimizer.apply_gradients(params_grads)
            with program._optimized_guard([]):
                self._emit_update(block, None, None)
            return ops
        grads = [g for _, g in params_grads]
        self.param_names = tuple(p.name for p, _ in params_grads)
        with program._optimized_guard([]):
            self.vars["grad_finite"] = paddle.static.create_global_var(
                shape=[len(grads)], value=True, dtype="bool", persistable=True,
                name=unique_name.generate("amp_grad_finite"))
            found_inf = self._unscale(block, grads)
            self.ring_id = resolve_ring_id(self.found_inf_ring_id)
            if self.ring_id is not None:  # before the scale update, SkipUpdate and the guard
                found_inf = reduce_found_inf(block, found_inf, self.ring_id)
            cond_block(program, block, found_inf, lambda sub: self._record_nonfinite(sub, grads))
            folded = None
            if getattr(optimizer, "type", None) == "sgd":  # skip folded into the update
                v = self.vars
                folded = fold_sgd(block, optimizer, found_inf, grads,
                                  {"scale": v["scale"], "good": v["good_steps"],
                                   "bad": v["bad_steps"]})
        if hasattr(optimizer, "_set_auxiliary_var"):  # Adam-family kernels then skip themselves
            optimizer._set_auxiliary_var("found_inf", found_inf)
        start = len(block.ops)
        ops = optimizer.apply_gradients(params_grads)
        with program._optimized_guard([]):
            if folded is not None:
                use_folded_lr(block.ops[start:], optimizer._global_learning_rate(), folded)
            if needs_guard(block, block.ops[start:], found_inf, folded):
                ops = guard_ops(program, block, start, found_inf)
            self._emit_update(block, found_inf, grads[0])
        return ops

    def _emit_update(self, block, found_inf, carrier) -> None:
        """The core's ``update`` as ops at the end of ``block``; the fused op for the scale
        move where it is exact (it zeroes its ``X``, here just ``carrier``, on overflow:
        after every reader of the gradients)."""
        ops, v = BlockOps(block, self._startup_block), self.vars
        old = StateArrays(*(v.get(name) for name in ("scale", "good_steps", "bad_steps",
                                                     "total_steps", "skipped_steps",
                                                     "consecutive_skips")))
        if self.native_update:
            self._native_update(block, found_inf, carrier)
            new = count_step(self.config, old, found_inf, ops)
        else:
            new = update(self.config, old, found_inf, ops)
        for name in self.fields:  # (unchanged or written by the fused op: nothing to store)
            ops.store(getattr(new, name), v[name])

    def _native_update(self, block, found_inf, carrier) -> None:
        """One fused op for scale, good_steps and bad_steps, then the clip to the bounds."""
        v, c = self.vars, self.config
        block.append_op(
            type="update_loss_scaling",
            inputs={"X": [carrier], "FoundInfinite": [found_inf], "PrevLossScaling": [v["scale"]],
                    "InGoodSteps": [v["good_steps"]], "InBadSteps": [v["bad_steps"]]},
            outputs={"Out": [carrier], "LossScaling": [v["scale"]],
                     "OutGoodSteps": [v["good_steps"]], "OutBadSteps": [v["bad_steps"]]},
            attrs={"incr_every_n_steps": c.growth_interval,
                   "decr_every_n_nan_or_inf": c.hysteresis, "incr_ratio": c.growth_factor,
                   "decr_ratio": c.backoff_factor, "stop_update": False})
        if c.min_scale > 1 or math.isfinite(c.max_scale):
            block.append_op(type="clip", inputs={"X": [v["scale"]]}, outputs={"Out": [v["scale"]]},
                            attrs={"min": c.min_scale, "max": c.max_scale})

    def _unscale(self, block, grads):
        """``found_inf`` over all ``grads`` (one check per dtype: the kernel takes one)."""
        by_dtype: dict = {}
        for g in grads:
            by_dtype.setdefault(g.dtype, []).append(g)
        ops, found = BlockOps(block), []
        for group in by_dtype.values():
            f = ops.tmp(VarType.BOOL)
            block.append_op(type="check_finite_and_unscale",
                            inputs={"X": group, "Scale": [self.vars["scale"]]},
                            outputs={"Out": group, "FoundInfinite": [f]})
            found.append(f)
        for f in found[1:]:
            found[0] = ops.binary("logical_or", found[0], f, VarType.BOOL)
        return found[0]

    def _record_nonfinite(self, sub, grads) -> None:
        """On overflow: which gradients were not finite (for the guard's message)."""
        ops, flags = BlockOps(sub), []
        for g in grads:
            each = ops.unary("isfinite_v2", g, VarType.BOOL)
            flag = ops.tmp(VarType.BOOL)
            sub.append_op(type="reduce_all", inputs={"X": [each]}, outputs={"Out": [flag]},
                          attrs={"reduce_all": True, "dim": [0], "keep_dim": False})
            flags.append(flag)
        stacked = ops.tmp(VarType.BOOL)
        sub.append_op(type="stack", inputs={"X": flags}, outputs={"Y": [stacked]},
                      attrs={"axis": 0})
        ops.assign(stacked, self.vars["grad_finite"])

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
        self._window = scope_state.guard(
            scope, self._names(), self.config,
            # `flags and flags.name` would call bool() on a PIR value, which raises
            lambda: scope_state.nonfinite_params(
                scope, None if flags is None else flags.name, self.param_names),
            self._window)
