"""Program rewrite: ask the core planner about every forward op, insert what it says.

Written once, for both IRs, over ``ir.ProgramIR``. For each forward op ``plan_op``
gets its name, input dtypes, slot names (the legacy vocabulary), attributes and
which inputs are parameters (a promote op casts a small fp32 parameter down beside
a low activation, not the activation up),
and answers with a run dtype, per-input casts, the slots kept fp32 and, for
emulation, what to round. This module carries that out, in one pass:

- a cast goes in front of each input the plan names, reusing one cast per
  (value, dtype) until the value is overwritten, so a weight is cast once per
  step however often it is used; a cast of a cast reads the original value;
- outputs of an op that runs in the low dtype are declared in that dtype
  (except the plan's ``kept_outputs``, statistics that stay fp32);
- an ``emulated`` op computes in fp32 on the inputs the plan rounds and
  rounds its outputs through the low dtype (two casts each, once per value),
  so values and, through the casts' gradients, gradients carry fp16 rounding,
  overflow and underflow;
- an op lowered to a dtype whose kernel here is oneDNN's (bf16 on a CPU;
  ``DeviceProfile.route``) gets the attributes that send it there (``ProgramIR.use_onednn``), as
  natively; so do
  the casts between float32 and bf16 the program gets, where oneDNN casts here (its
  reorder is several times faster than Paddle's plain cast, which on 2.6.2 also
  truncates instead of rounding to nearest even);
- each op's operand shapes go to the planner (``ShapeClass``): the device profile's
  rules (a slow gradient of a broadcast operand, in training) and measured speed read
  them;
- the ops that write what a run fetches (the loss, a result no op reads) run in float32
  where the core says so (``output_fp32``: bfloat16, which numpy fetches as raw bits);
- a control-flow op's blocks are left in fp32: low-precision values it reads
  are cast back to fp32 (inside its blocks too).
"""
from __future__ import annotations

import contextlib
import dataclasses
from typing import AbstractSet, Any, Optional

from amp_adapters import (LOW_DTYPES, CastReport, DeviceProfile, OpCall, OpDecision, ParamPlan,
                          Policy, ShapeClass, output_fp32, plan_op, plan_params)
from amp_adapters.rules.layers import check_matched
from amp_adapters.rules.dtypes import FLOAT_DTYPES
from amp_adapters.services.fallback import FallbackNotices
from amp_adapters.rules.oplists import passes_through

from . import ir as program_ir
from .layer_paths import paths_of
from .ir import CONTROL_FLOW, ProgramIR, Slot

_DEVICE = "this device"  # the kernels set was probed on the place the program will run on


@dataclasses.dataclass
class Rewriter:
    """Rewrites the global block of programs (either IR) under one policy on one device.

    ``device``: what the device runs in the low dtype (``kernels.device_profile``, for the
    program's IR; None: every op has a kernel). An op lowered on the oneDNN route gets
    the oneDNN attributes; with ``cast`` on that route, so do the casts between float32
    and bf16 this rewrite inserts, but for those in front of an op of
    ``device.plain_casts_before``.
    ``use_guard``: only ops built inside ``fp16_guard()`` may leave fp32.
    ``black_varnames``: ops reading or writing these vars run in fp32.
    ``loss``: the loss the program is built to minimize; with the ops whose results nothing
    reads, it is a program output, float32 where the core says so (``output_fp32``: a
    fetched bfloat16 tensor is raw uint16 bits).
    """

    policy: Policy
    device: Optional[DeviceProfile]
    use_guard: bool = False
    black_varnames: AbstractSet[str] = frozenset()
    loss: Any = None  # the training program's loss (a var or a PIR value), a program output

    @property
    def kernels(self) -> Optional[AbstractSet[str]]:
        """The ops with a low kernel here (None: every op)."""
        return None if self.device is None else self.device.kernels

    def __post_init__(self) -> None:
        self._notices = FallbackNotices("paddle_amp")  # each op type warns once per decorate

    def _ir(self, program) -> ProgramIR:
        ir = program_ir.of(program)
        ir.prepare(self.use_guard, self.black_varnames)
        if self.device is not None and self.device.route("cast") == "onednn":
            # faster, and rounds to nearest even where 2.6.2's does not
            ir.use_onednn_casts(self.device.plain_casts_before)
        return ir

    # -- decisions ---------------------------------------------------------------------------

    def _forced_fp32(self, ir: ProgramIR, op) -> Optional[str]:
        """Why ``op`` must run in fp32 whatever its category (outside the guard, black vars)."""
        if self.use_guard and not ir.in_guard(op):
            return "outside fp16_guard"
        if self.black_varnames and self.black_varnames & ir.var_names(op):
            return "uses a custom_black_varnames var"
        why = output_fp32(self.policy)
        if why and ir.is_output(op, self.loss):
            return why
        return None

    def plan(self, ir: ProgramIR, op, slots: list[Slot],
             force_fp32: Optional[str] = None) -> OpDecision:
        """The core's decision for ``op`` given the current dtypes of its input ``slots``."""
        op_type = ir.op_type(op)
        dtypes = [ir.dtype(s.value) if s.cast else None for s in slots]
        decision = plan_op(self.policy, "paddle", OpCall(
            op_type, dtypes, shape=self._shape(ir, op, slots), attrs=ir.attrs(op),
            force_fp32=force_fp32 or self._forced_fp32(ir, op),
            input_names=[s.name for s in slots],
            param_inputs=[self._is_param(ir, s.value) for s in slots],
            readers=self._readers(ir, op), instance=self._instance(ir, op)), device=self.device)
        self._notices.note(op_type, _DEVICE, decision)
        return decision

    def _readers(self, ir: ProgramIR, op) -> Optional[tuple]:
        """O2: the forward readers of ``op``'s results (an op O2 lowers for being O2 alone
        is lowered only where one of them computes low, ``plan_op``'s ``readers``)."""
        if self.policy.level != "O2" or not self.policy.enabled:
            return None
        return ir.result_uses(op, lambda o: self._forced_fp32(ir, o),
                              lambda o: self._shape(ir, o), lambda o: self._instance(ir, o))

    def _instance(self, ir: ProgramIR, op) -> Optional[tuple[str, ...]]:
        """``op``'s instance names for the policy's layer rules: the paths of the layers whose
        parameters it reads (``layer_paths``: ``2``, ``encoder.layers.3.ffn``), then the
        names the IR gives (``ProgramIR.instance_names``); None (nothing to match) without
        layer rules."""
        if not self.policy.layer_patterns("paddle"):
            return None
        names = ir.instance_names(op)
        return (*paths_of(ir.program, names), *names)

    def check_layers(self, program) -> None:
        """Raise ``AmpConfigError`` if a layer rule of the policy matches no op of ``program``
        (by layer path, parameter, variable or name scope), naming the closest: before
        anything of the program changes (a rule that does not apply is a fix that silently
        is not there)."""
        patterns = self.policy.layer_patterns("paddle") if self.policy.enabled else ()
        if not patterns:
            return
        ir = self._ir(program)
        names: set = set()
        with contextlib.closing(ir.forward_ops()) as ops:
            for op in ops:
                names.update(self._instance(ir, op) or (), ir.var_names(op))
        check_matched(patterns, names, "the program")

    def _shape(self, ir: ProgramIR, op, slots: Optional[list[Slot]] = None
               ) -> Optional[ShapeClass]:
        """The shape class of ``op``'s floating operands and the rank of its result, for the
        device profile (its broadcast-gradient rule, measured speed); None without a device
        that reads it. O2's parameter plan asks the same (``ParamUse.shape``)."""
        if self.device is None or (not self.device.slow_broadcast_grads
                                   and self.policy.speed != "measured"):
            return None
        result = max((ir.rank(v) or 0 for v in ir.float_outputs(op, ())), default=0)
        slots = ir.slots(op) if slots is None else slots
        return ShapeClass.of([ir.shape(s.value) for s in _floating(ir, slots)], result or None)

    def _is_param(self, ir: ProgramIR, value) -> bool:
        """A parameter, or a parameter's values moved by ops that only move values (a conv
        bias reshaped for its add is still the small float32 operand the planner casts
        down beside a low activation)."""
        return ir.is_param(value) or (ir.dtype(value) == "float32"  # (an empty operand: no key)
                                      and ir.key(value) in self._moved_params)

    def _note_moved_params(self, ir: ProgramIR, op, slots: list[Slot]) -> None:
        floats = [s.value for s in _floating(ir, slots)]
        if floats and passes_through("paddle", ir.op_type(op), ir.attrs(op)) and \
                all(self._is_param(ir, v) for v in floats):
            self._moved_params.update(ir.key(v) for v in ir.float_outputs(op, ()))

    # -- O2 parameters -------------------------------------------------------------------------

    def param_plan(self, program) -> ParamPlan:
        """O2: the storage dtype of every parameter, decided by the core (``plan_params``) from
        its forward readers; an op in a control-flow block runs in float32."""
        ir = self._ir(program)
        uses = ir.param_uses(lambda op: self._forced_fp32(ir, op),
                             lambda op: self._shape(ir, op), lambda op: self._instance(ir, op))
        return plan_params(self.policy, "paddle", uses, device=self.device)

    def low_params(self, program, optimizer_type: Optional[str] = None) -> frozenset[str]:
        """O2: the parameters stored in the low dtype (see ``param_plan``); none when
        ``optimizer_type`` has no low kernel here."""
        if optimizer_type is not None and self.kernels is not None \
                and optimizer_type not in self.kernels:
            return frozenset()
        return self.param_plan(program).low

    def set_low_params(self, program, names: AbstractSet[str]) -> None:
        """Declare the parameters ``names`` in the low dtype (O2; ``amp_init`` converts values)."""
        program_ir.of(program).set_param_dtype(names, self.policy.dtype)

    # -- rewrite ------------------------------------------------------------------------------

    def rewrite(self, program, check: bool = True) -> CastReport:
        """Rewrite the forward ops of ``program``'s global block; return the decisions. A layer
        rule matching no op raises first (``check_layers``; ``check=False``: checked on the
        program this one derives from), the program untouched."""
        if check:
            self.check_layers(program)
        ir = self._ir(program)
        self._cast_of: dict[tuple, Any] = {}
        self._origin: dict = {}  # key of a cast's output -> the value it casts
        self._rounded: set = set()
        # key of a value -> (its ``_cast_of`` key, the cast's output key or None) for each
        # cast or round of it cached, so ``_forget`` touches only what a write made stale
        self._cached_from: dict = {}
        self._moved_params: set = set()  # keys of parameters' values moved by reshape & co.
        decisions = []
        with contextlib.closing(ir.forward_ops()) as ops:
            for op in ops:
                if ir.is_control_flow(op):
                    decisions.append(self._control_flow(ir, op))
                    continue
                slots = ir.slots(op)
                d = self.plan(ir, op, slots)
                decisions.append(d)
                if ir.is_cast(op):  # a cast after a cast is a chain: nothing to insert
                    ir.chain_cast(op)
                else:
                    self._inputs(ir, op, slots, d)
                self._forget(ir, ir.overwritten(op))  # casts of the values it wrote are stale
                if not ir.is_cast(op):
                    self._outputs(ir, op, slots, d)
                    self._note_moved_params(ir, op, slots)
        self._notices.summarize("paddle_amp: program", decisions, _DEVICE)
        return CastReport("paddle", tuple(decisions))

    def _inputs(self, ir: ProgramIR, op, slots: list[Slot], d: OpDecision) -> None:
        for slot, target in zip(slots, d.casts):
            if target is not None:
                self._set(ir, slot, slot.value, self._cast(ir, slot.owner, slot.value, target))
        for slot, rnd in zip(slots, d.round_inputs):
            if rnd:
                current = ir.current(slot)
                self._set(ir, slot, current, self._round(ir, slot.owner, current))

    @staticmethod
    def _set(ir: ProgramIR, slot: Slot, old, new) -> None:
        if ir.key(new) != ir.key(old):
            ir.set_input(slot, old, new)

    def _cast(self, ir: ProgramIR, before, value, target: str):
        """``value`` in ``target``, inserted before the op ``before`` (cached; a plain cast
        for an op of ``plain_casts_before`` apart)."""
        src = self._origin.get(ir.key(value), value)
        if ir.dtype(src) == target:
            return src
        plain = self.device is not None and ir.op_type(before) in self.device.plain_casts_before
        key = (ir.key(src), target, plain)
        if key not in self._cast_of:
            out = self._cast_of[key] = ir.cast(before, src, target, plain)
            self._origin[ir.key(out)] = src
            self._cached_from.setdefault(key[0], []).append((key, ir.key(out)))
        return self._cast_of[key]

    def _round(self, ir: ProgramIR, before, value):
        """``value`` rounded through the low dtype (emulation), as a float32 value."""
        k = ir.key(value)
        src = self._origin.get(k, value)
        if k in self._rounded or ir.dtype(value) != "float32" \
                or ir.dtype(src) == self.policy.dtype:
            return value
        if (k, "round") not in self._cast_of:
            out = self._cast_of[(k, "round")] = ir.round(before, value, self.policy.dtype)
            self._rounded.add(ir.key(out))
            self._cached_from.setdefault(k, []).append(((k, "round"), None))
        return self._cast_of[(k, "round")]

    def _forget(self, ir: ProgramIR, keys: AbstractSet) -> None:
        """Drop cached casts of values that were overwritten (through ``_cached_from``: a
        scan of every cache per op made the walk quadratic)."""
        for key in keys:
            for cached, out in self._cached_from.pop(key, ()):
                self._cast_of.pop(cached, None)
                if out is not None:
                    self._origin.pop(out, None)
        self._rounded -= set(keys)

    def _outputs(self, ir: ProgramIR, op, slots: list[Slot], d: OpDecision) -> None:
        """Declare (low) or round (emulated) ``op``'s float32 outputs; send a low op whose
        kernel here is oneDNN's there."""
        if d.run_dtype is None:
            return
        if d.run_dtype in LOW_DTYPES and self.device is not None and \
                self.device.route(ir.op_type(op)) == "onednn":
            ir.use_onednn(op)
            # oneDNN's bf16 matmul_grad (Paddle 2.6.2 and 3.3.1) dies (SIGSEGV) when an input
            # needs no gradient (a data input, a frozen weight): the casts this rewrite put
            # in front of the op have theirs computed. It costs that input's gradient GEMM
            # and stops at the cast (what the user froze stays frozen).
            for slot in slots:
                current = ir.current(slot)
                if ir.key(current) in self._origin:
                    ir.require_grad(current)
        for value in ir.float_outputs(op, d.kept_outputs):
            if d.run_dtype in LOW_DTYPES:
                ir.retype(op, value, d.run_dtype)
            elif d.round_outputs:
                self._rounded.add(ir.key(ir.round_output(op, value, d.low_dtype)))

    def _control_flow(self, ir: ProgramIR, op) -> OpDecision:
        """A control-flow op (cond, while): its blocks are not rewritten and run in fp32, so
        low-precision values it reads are cast to fp32, in the op and its blocks."""
        slots = ir.control_flow_slots(op)
        d = self.plan(ir, op, slots, CONTROL_FLOW)
        for slot, target in zip(slots, d.casts):
            if target is not None:
                ir.rewire_within(op, slot.value, self._cast(ir, op, slot.value, target))
        return d


def _floating(ir: ProgramIR, slots: list[Slot]) -> list[Slot]:
    """The slots of floating tensors an op reads (not a PIR attribute turned operand)."""
    return [s for s in slots if s.cast and ir.dtype(s.value) in FLOAT_DTYPES]
