"""Loss scaling as program ops: the core state machine, run on the device each step.

The state of the core loss scale (``scale``, ``good_steps``, ``bad_steps``,
``total_steps``, ``skipped_steps``, ``consecutive_skips``) lives in persistable
vars, so ``paddle.static.save``/``load`` checkpoint it with the parameters.
After the backward pass:

1. ``check_finite_and_unscale`` over every gradient (one op per gradient
   dtype) divides by ``scale`` and sets ``found_inf``;
2. an overflow step leaves parameters and all optimizer state bit-identical
   (a true skip, for every optimizer; the native zeroes the grads and still
   runs SGD and Momentum). Ops whose kernel skips itself on ``found_inf``
   (Adam, AdamW, Lamb: ``SkipUpdate``) stay where they are; if any other op
   of the optimizer writes a parameter or state, all its ops (clipping,
   weight decay, update, accumulators) move into a ``conditional_block`` on
   ``not found_inf`` (its sub-executor costs ~0.1 ms a step on CPU);
3. the state update equals ``DynamicLossScale.adjust``: Paddle's fused
   ``update_loss_scaling`` op (plus a clip) where that is exact, else
   elementary ops in the two branches, for floors below 1 and ceilings the
   native op cannot express;
4. on overflow, each parameter's "gradient was finite" flag is recorded, so
   the guard (``check_guard``) can name the culprits without an extra pass.

Data parallel: when each worker checks its *local* gradients (the check runs
before the gradient all-reduce), one worker's inf would make only that worker
skip and back off, and the workers' parameters and scales would drift apart.
So ``found_inf`` is all-reduced (max) over the ring right after
``check_finite_and_unscale`` and before everything that reads it (see
``reduce_found_inf``): every worker then takes the same decision and keeps a
bit-identical scale state.

No host sync happens in the step; reading the state back is a scope read.
"""
from __future__ import annotations

import dataclasses
import math
import os
from typing import Callable, Optional

import numpy as np
import paddle
from paddle.base import framework, unique_name

from amp_adapters import (AmpConfigError, DynamicLossScale, LossScale, OverflowGuardError,
                          loss_scale_from_state_dict)

from .env import VarType

_COUNTERS = ("good_steps", "bad_steps", "total_steps", "skipped_steps", "consecutive_skips")
_COUNTER_DTYPE = {"good_steps": "int32", "bad_steps": "int32", "total_steps": "int64",
                  "skipped_steps": "int64", "consecutive_skips": "int64"}
_BOOL = VarType.BOOL
_INT64 = VarType.INT64
_INT32 = VarType.INT32


class LossScaling:
    """The in-program loss scale of one decorated program, starting from ``initial``.

    ``found_inf_ring_id``: see ``resolve_ring_id`` (None: auto, an int: that ring, False: off).
    """

    def __init__(self, initial: LossScale, found_inf_ring_id=None):
        self.initial = initial
        self.found_inf_ring_id = found_inf_ring_id
        self.ring_id: Optional[int] = None  # the ring found_inf was reduced over, once built
        self.fields = tuple(f.name for f in dataclasses.fields(initial))  # type: ignore[arg-type]
        self.counters = tuple(c for c in _COUNTERS if c in self.fields)
        self.vars: dict[str, framework.Variable] = {}
        self.param_names: tuple[str, ...] = ()

    # -- building -----------------------------------------------------------------------------

    def create_vars(self) -> None:
        """The persistable state vars (under the caller's program_guard), at ``initial``."""
        self.vars["scale"] = paddle.static.create_global_var(
            shape=[1], value=float(self.initial.scale), dtype="float32", persistable=True,
            name=unique_name.generate("loss_scaling"))
        for name in self.counters:  # int32 for good/bad, as update_loss_scaling takes them
            self.vars[name] = paddle.static.create_global_var(
                shape=[1], value=int(getattr(self.initial, name)), dtype=_COUNTER_DTYPE[name],
                persistable=True, name=unique_name.generate(f"amp_{name}"))

    def scale_loss(self, block, loss):
        """``loss * scale`` (loss itself when nothing is scaled)."""
        if not self.initial.checks_overflow:
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
        if not self.initial.checks_overflow:
            ops = optimizer.apply_gradients(params_grads)
            with program._optimized_guard([]):
                _Ops(block).increment(self.vars["total_steps"])
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
            _cond_block(program, block, found_inf, lambda sub: self._overflow_branch(sub, grads))
        if hasattr(optimizer, "_set_auxiliary_var"):  # Adam-family kernels then skip themselves
            optimizer._set_auxiliary_var("found_inf", found_inf)
        start = len(block.ops)
        ops = optimizer.apply_gradients(params_grads)
        with program._optimized_guard([]):
            unguarded = [op for op in block.ops[start:] if _writes_state(block, op)
                         and not _skips_on(op, found_inf)]
            if unguarded or self.elementary_update:
                ops = self._guard(program, block, start, found_inf)
            if self.native_update:
                self._native_update(block, found_inf, grads[0])
            ops_ = _Ops(block)  # consecutive_skips: +1 in the overflow branch, * found_inf here
            block.append_op(type="elementwise_mul",
                            inputs={"X": [self.vars["consecutive_skips"]],
                                    "Y": [ops_.unary("cast", found_inf, _INT64,
                                                     in_dtype=_BOOL, out_dtype=_INT64)]},
                            outputs={"Out": [self.vars["consecutive_skips"]]}, attrs={"axis": -1})
            ops_.increment(self.vars["total_steps"])
        return ops

    def _guard(self, program, block, start: int, found_inf) -> list:
        """Move the ops from ``start`` on into ``if not found_inf:`` (with the clean-step half of
        the state update); returns the moved ops."""
        finite = _Ops(block).tmp(_BOOL)
        block._insert_op(start, type="logical_not", inputs={"X": [found_inf]},
                         outputs={"Out": [finite]})
        moved = _cond_block(program, block, finite,
                            lambda sub: self._finite_branch(sub, block.ops[start + 1:]))
        for _ in range(len(block.ops) - start - 2):  # keep logical_not and the cond op
            block._remove_op(start + 1)
        return moved

    @property
    def elementary_update(self) -> bool:
        """True for a dynamic scale that ``update_loss_scaling`` cannot compute exactly."""
        return isinstance(self.initial, DynamicLossScale) and not self.native_update

    @property
    def native_update(self) -> bool:
        """True when Paddle's ``update_loss_scaling`` op, followed by a clip to
        [min_scale, max_scale], computes exactly ``DynamicLossScale.adjust``: its floor
        of 1 is below ``min_scale``, and growth cannot overflow before the ceiling."""
        s = self.initial
        if not isinstance(s, DynamicLossScale) or s.min_scale < 1:
            return False
        with np.errstate(over="ignore"):
            grown = np.float32(s.max_scale) * np.float32(s.growth_factor)
        return math.isinf(s.max_scale) or bool(np.isfinite(grown))

    def _native_update(self, block, found_inf, carrier) -> None:
        """One fused op for scale, good_steps and bad_steps (after the overflow branch has
        read the gradients: the op zeroes its ``X``, here just ``carrier``, on overflow)."""
        v, s = self.vars, self.initial
        block.append_op(
            type="update_loss_scaling",
            inputs={"X": [carrier], "FoundInfinite": [found_inf], "PrevLossScaling": [v["scale"]],
                    "InGoodSteps": [v["good_steps"]], "InBadSteps": [v["bad_steps"]]},
            outputs={"Out": [carrier], "LossScaling": [v["scale"]],
                     "OutGoodSteps": [v["good_steps"]], "OutBadSteps": [v["bad_steps"]]},
            attrs={"incr_every_n_steps": s.growth_interval,
                   "decr_every_n_nan_or_inf": s.hysteresis, "incr_ratio": float(s.growth_factor),
                   "decr_ratio": float(s.backoff_factor), "stop_update": False})
        if s.min_scale > 1 or math.isfinite(s.max_scale):
            block.append_op(type="clip", inputs={"X": [v["scale"]]}, outputs={"Out": [v["scale"]]},
                            attrs={"min": float(s.min_scale), "max": float(s.max_scale)})

    def _unscale(self, block, grads):
        """``found_inf`` over all ``grads`` (one check per dtype: the kernel takes one)."""
        by_dtype: dict = {}
        for g in grads:
            by_dtype.setdefault(g.dtype, []).append(g)
        found = []
        for group in by_dtype.values():
            f = _Ops(block).tmp(_BOOL)
            block.append_op(type="check_finite_and_unscale",
                            inputs={"X": group, "Scale": [self.vars["scale"]]},
                            outputs={"Out": group, "FoundInfinite": [f]})
            found.append(f)
        for f in found[1:]:
            found[0] = _Ops(block).binary("logical_or", found[0], f, _BOOL)
        return found[0]

    def _finite_branch(self, sub, optimizer_ops) -> list:
        """The optimizer's ops, then the clean-step half of ``adjust``."""
        for op in optimizer_ops:
            sub.desc.append_op().copy_from(op.desc)
        sub._sync_with_cpp()
        moved = list(sub.ops)
        ops, v, s = _Ops(sub), self.vars, self.initial
        if self.elementary_update:  # good += 1; grow at growth_interval
            ops.fill(v["bad_steps"], 0)
            ops.increment(v["good_steps"])
            hit = ops.equal(v["good_steps"], s.growth_interval)
            _cond_block(sub.program, sub, hit, lambda b: self._resize(
                b, s.growth_factor, reset="good_steps", keep_if_not_finite=True))
        return moved

    def _overflow_branch(self, sub, grads) -> None:
        """The overflow half of ``adjust``, and which gradients were not finite."""
        ops, v, s = _Ops(sub), self.vars, self.initial
        if self.elementary_update:  # bad += 1; back off at hysteresis
            ops.fill(v["good_steps"], 0)
            ops.increment(v["bad_steps"])
            hit = ops.equal(v["bad_steps"], s.hysteresis)
            _cond_block(sub.program, sub, hit, lambda b: self._resize(
                b, s.backoff_factor, reset="bad_steps", keep_if_not_finite=False))
        ops.increment(v["skipped_steps"])
        ops.increment(v["consecutive_skips"])
        flags = []
        for g in grads:
            each = ops.unary("isfinite_v2", g, _BOOL)
            flag = ops.tmp(_BOOL)
            sub.append_op(type="reduce_all", inputs={"X": [each]}, outputs={"Out": [flag]},
                          attrs={"reduce_all": True, "dim": [0], "keep_dim": False})
            flags.append(flag)
        stacked = ops.tmp(_BOOL)
        sub.append_op(type="stack", inputs={"X": flags}, outputs={"Y": [stacked]},
                      attrs={"axis": 0})
        ops.assign(stacked, v["grad_finite"])

    def _resize(self, sub, factor: float, reset: str, keep_if_not_finite: bool) -> None:
        """scale = clip(scale * factor, min_scale, max_scale); ``reset`` = 0. Growth keeps the
        old scale when the product is not finite (``max_scale`` = inf)."""
        ops, scale, s = _Ops(sub), self.vars["scale"], self.initial
        new = ops.tmp(VarType.FP32)
        sub.append_op(type="scale", inputs={"X": [scale]}, outputs={"Out": [new]},
                      attrs={"scale": float(factor), "bias": 0.0, "bias_after_scale": True})
        clipped = ops.tmp(VarType.FP32)
        sub.append_op(type="clip", inputs={"X": [new]}, outputs={"Out": [clipped]},
                      attrs={"min": float(s.min_scale), "max": float(s.max_scale)})
        if keep_if_not_finite:
            ok = ops.unary("isfinite_v2", clipped, _BOOL)
            kept = ops.tmp(VarType.FP32)
            sub.append_op(type="where", inputs={"Condition": [ok], "X": [clipped], "Y": [scale]},
                          outputs={"Out": [kept]})
            clipped = kept
        ops.assign(clipped, scale)
        ops.fill(self.vars[reset], 0)

    # -- state ----------------------------------------------------------------------------------

    def read(self, scope) -> LossScale:
        """The current state, from the scope: one small host read per var."""
        values = {name: _get(scope, self.vars[name]) for name in self.counters}
        if "scale" in self.fields:
            values["scale"] = _get(scope, self.vars["scale"])
        values = {k: (float(v) if k == "scale" else int(v)) for k, v in values.items()}
        return dataclasses.replace(self.initial, **values)

    def write(self, scope, state_dict: dict, place) -> None:
        """Set the scope's state vars from a ``state_dict()``; its config must match the
        program's (the state machine's constants are baked into the ops)."""
        state = loss_scale_from_state_dict(state_dict)
        if type(state) is not type(self.initial):
            raise AmpConfigError(f"state_dict is for a {state.kind!r} loss scale, but this "
                                 f"program was built for a {self.initial.kind!r} one")
        config = [f for f in self.fields if f not in self.counters and f != "scale"]
        differ = {f: getattr(state, f) for f in config
                  if getattr(state, f) != getattr(self.initial, f)}
        if differ:
            raise AmpConfigError(
                f"state_dict has {differ}, but this program was built for {self.initial!r}; "
                f"build the program with the same policy (the constants are in its ops)")
        if "scale" in self.fields:
            _set(scope, self.vars["scale"], np.float32(state.scale), place)
        for name in self.counters:
            _set(scope, self.vars[name], np.dtype(_COUNTER_DTYPE[name]).type(getattr(state, name)),
                 place)

    def check_guard(self, scope) -> None:
        """Raise ``OverflowGuardError`` after ``max_consecutive_skips`` overflows in a row."""
        if not self.initial.checks_overflow:
            return
        state = self.read(scope)
        if state.exhausted:
            finite = np.asarray(_tensor(scope, self.vars["grad_finite"])).ravel()
            bad = [n for n, ok in zip(self.param_names, finite) if not ok]
            raise OverflowGuardError(state.consecutive_skips, state.scale, bad)


def resolve_ring_id(setting) -> Optional[int]:
    """The ring to all-reduce ``found_inf`` over, or None for no reduction.

    ``None`` (auto): ring 0 when this process is one of several data-parallel
    workers (``paddle.distributed.get_world_size() > 1`` or ``PADDLE_TRAINERS_NUM > 1``,
    as ``python -m paddle.distributed.launch`` sets), else no reduction. ``False``: never.
    ``True``: ring 0. An int >= 0: that ring (it must be initialised when the program runs).
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


def reduce_found_inf(block, found_inf, ring_id: int):
    """``found_inf`` (bool[1]) OR-ed over every worker of ``ring_id``: a new bool[1] var.

    One in-graph all-reduce (max) of an int32 cast of the flag (the CPU/gloo kernels
    have no bool), appended to ``block``: no host sync, 4 bytes per step. The op is
    ``c_allreduce_max`` where registered (Paddle 2.6), else ``all_reduce`` with
    ``reduce_type`` 1 = max (Paddle 3.x, which dropped ``c_allreduce_*``); like any
    collective it needs the ring's communicator (NCCL on GPU, gloo on CPU) at run time.
    """
    ops = _Ops(block)
    as_int = ops.unary("cast", found_inf, _INT32, in_dtype=_BOOL, out_dtype=_INT32)
    if "c_allreduce_max" in framework.OpProtoHolder.instance().op_proto_map:
        block.append_op(type="c_allreduce_max", inputs={"X": [as_int]}, outputs={"Out": [as_int]},
                        attrs={"ring_id": ring_id, "use_calc_stream": True})
    else:
        block.append_op(type="all_reduce", inputs={"x": [as_int]}, outputs={"out": [as_int]},
                        attrs={"ring_id": ring_id, "reduce_type": 1})
    return ops.unary("cast", as_int, _BOOL, in_dtype=_INT32, out_dtype=_BOOL)


def _writes_state(block, op) -> bool:
    """True if ``op`` writes a persistable var (a parameter or optimizer state)."""
    return any(getattr(block._find_var_recursive(n), "persistable", False)
               for n in op.output_arg_names)


def _skips_on(op, found_inf) -> bool:
    """True if ``op``'s kernel leaves all its outputs unchanged when ``found_inf`` is set."""
    return "SkipUpdate" in op.input_names and op.input("SkipUpdate") == [found_inf.name]


def _tensor(scope, var):
    found = scope.find_var(var.name)
    if found is None:
        raise RuntimeError(f"{var.name!r} is not in the scope: run the startup program first "
                           f"(or pass the scope the program runs in)")
    return found.get_tensor()


def _get(scope, var):
    return np.asarray(_tensor(scope, var)).reshape(-1)[0]


def _set(scope, var, value, place) -> None:
    _tensor(scope, var).set(np.array([value], dtype=value.dtype), place)


class _Ops:
    """Appends elementary ops to one block; temporaries live in that block."""

    def __init__(self, block):
        self.block = block

    def tmp(self, dtype, shape: Optional[list] = None):
        return self.block.create_var(name=unique_name.generate("amp_tmp"), dtype=dtype,
                                     shape=shape or [1])

    def unary(self, op_type: str, x, dtype, **attrs):
        out = self.tmp(dtype, list(x.shape))
        self.block.append_op(type=op_type, inputs={"X": [x]}, outputs={"Out": [out]},
                             attrs=attrs)
        return out

    def binary(self, op_type: str, x, y, dtype):
        out = self.tmp(dtype)
        self.block.append_op(type=op_type, inputs={"X": [x], "Y": [y]}, outputs={"Out": [out]})
        return out

    def fill(self, var, value) -> None:
        self.block.append_op(type="fill_constant", outputs={"Out": [var]},
                             attrs={"shape": [1], "dtype": var.dtype, "value": float(value)})

    def increment(self, var) -> None:
        self.block.append_op(type="increment", inputs={"X": [var]}, outputs={"Out": [var]},
                             attrs={"step": 1.0})

    def equal(self, var, value: int):
        const = self.tmp(var.dtype)
        self.fill(const, value)
        return self.binary("equal", var, const, _BOOL)

    def assign(self, src, dst) -> None:
        self.block.append_op(type="assign", inputs={"X": [src]}, outputs={"Out": [dst]})


def _cond_block(program, parent, cond, build: Callable) -> list:
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
