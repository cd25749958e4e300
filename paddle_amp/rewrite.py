"""Program rewrite: ask the core planner about every forward op, insert what it says.

For each forward op of a legacy program block, ``plan_op`` gets the op type,
its input dtypes and slot names and its attributes, and answers with a run
dtype, per-input casts, the slots kept in fp32 and, for emulation, the inputs
and outputs to round. This module only carries that out, in one pass over the
block (each cast op goes in without re-syncing the whole block, which made a
rewrite quadratic in the program size):

- a cast goes in front of each input the plan names, reusing one cast var per
  (value, dtype) until the value is overwritten, so a weight is cast once per
  step however often it is used; a cast of a cast reads the original value;
- outputs of an op that runs in the low dtype are declared in that dtype
  (except the plan's ``kept_outputs``, statistics that stay fp32);
- an ``emulated`` op computes in fp32 on the inputs the plan rounds and
  rounds its outputs through the low dtype (two casts each, once per value),
  so values and, through the casts' gradients, gradients carry fp16 rounding,
  overflow and underflow;
- a control-flow op's sub-block is left in fp32: low-precision values it
  reads are cast back to fp32 (renamed inside the sub-block too).

The backward pass is generated afterwards by ``append_backward``, so gradient
casts come from the forward casts for free.
"""
from __future__ import annotations

import collections.abc
import contextlib
import dataclasses
from typing import AbstractSet, Any, Iterator, Optional

from paddle.base import core, framework, unique_name

from amp_adapters import CastReport, OpDecision, Policy, plan_op
from amp_adapters.dtypes import LOW_DTYPES as _LOW
from amp_adapters.dtypes import SHORT_NAMES as _SHORT
from amp_adapters.fallback import FallbackNotices

from .env import VARTYPE_OF, dtype_name

_DEVICE = "this device"  # the kernels set was probed on the place the program will run on

# The native fp16_guard name scope: code written for the native guard works unchanged.
GUARD_PATTERN = "__use_fp16__"
_ROLE = core.op_proto_and_checker_maker.kOpRoleAttrName()
_NOT_FORWARD = int(core.op_proto_and_checker_maker.OpRole.Backward) | int(
    core.op_proto_and_checker_maker.OpRole.Optimize) | int(
    core.op_proto_and_checker_maker.OpRole.LRSched)
_NAMESCOPE = core.op_proto_and_checker_maker.kOpNameScopeAttrName()
_IO_OPS = frozenset({"feed", "fetch", "fetch_v2", "read", "create_py_reader"})


@contextlib.contextmanager
def fp16_guard() -> Iterator[None]:
    """Ops built inside run in low precision when decorated with ``use_fp16_guard`` (O2)."""
    with framework.name_scope(prefix=GUARD_PATTERN):
        yield


def is_forward(op) -> bool:
    """True for an op of the forward pass (not backward, optimizer or LR schedule)."""
    return not op.has_attr(_ROLE) or not int(op.attr(_ROLE)) & _NOT_FORWARD


def _ops_within(op) -> list:
    """Every op in ``op``'s sub-block, and in theirs, recursively."""
    out = []
    for inner in op._block_attr("sub_block").ops:
        out.append(inner)
        if inner.has_attr("sub_block"):
            out.extend(_ops_within(inner))
    return out


class _OpAttrs(collections.abc.Mapping):
    """An op's attributes, read on demand: the planner looks only at those its rules name."""

    def __init__(self, op) -> None:
        self._op = op

    def __getitem__(self, name: str) -> Any:
        if not self._op.has_attr(name):
            raise KeyError(name)
        return self._op.attr(name)

    def __iter__(self) -> Iterator[str]:
        return iter(self._op.attr_names)

    def __len__(self) -> int:
        return len(self._op.attr_names)


def _insert_cast_op(block, i: int, src: str, out: str, in_dtype, out_dtype, role) -> None:
    """A ``cast`` op at position ``i`` of ``block``, written straight into the block's
    desc: no whole-block sync and no Python call-stack capture per op (what made
    ``Block._insert_op`` cost milliseconds a cast on big programs). The output var
    already exists with its dtype and shape, so no inference is needed."""
    desc = block.desc._insert_op(i)
    desc.set_type("cast")
    desc.set_input("X", [src])
    desc.set_output("Out", [out])
    desc._set_int32_attr("in_dtype", int(in_dtype))
    desc._set_int32_attr("out_dtype", int(out_dtype))
    desc._set_int32_attr(_ROLE, int(role))
    desc._set_attr(_NAMESCOPE, framework._full_name_scope())
    desc.check_attrs()  # the cast op's defaults (use_mkldnn, ...)
    block.ops.insert(i, framework.Operator(block, desc))


@dataclasses.dataclass
class Rewriter:
    """Rewrites the global block of programs under one policy on one device's kernels.

    ``use_guard``: only ops built inside ``fp16_guard()`` may leave fp32.
    ``black_varnames``: ops reading or writing these vars run in fp32.
    """

    policy: Policy
    kernels: Optional[AbstractSet[str]]  # ops with a low kernel on the device; None: all (GPU)
    use_guard: bool = False
    black_varnames: AbstractSet[str] = frozenset()

    def __post_init__(self) -> None:
        self._notices = FallbackNotices("paddle_amp")  # each op type warns once per decorate

    # -- decisions ---------------------------------------------------------------------------

    def _forced_fp32(self, op) -> Optional[str]:
        """Why ``op`` must run in fp32 whatever its category (outside the guard, black vars)."""
        if self.use_guard and GUARD_PATTERN not in (op.attr("op_namescope") or ""):
            return "outside fp16_guard"
        if self.black_varnames & set(op.input_arg_names + op.output_arg_names):
            return "uses a custom_black_varnames var"
        return None

    def plan(self, block, op, slots, force_fp32: Optional[str] = None) -> OpDecision:
        """The core's decision for ``op`` given the current dtypes of its input ``slots``."""
        dtypes = [dtype_name(block._find_var_recursive(name)) for _, name in slots]
        decision = plan_op(self.policy, "paddle", op.type, dtypes, lowp_kernels=self.kernels,
                           attrs=_OpAttrs(op), force_fp32=force_fp32 or self._forced_fp32(op),
                           input_names=[slot for slot, _ in slots])
        self._notices.note(op.type, _DEVICE, decision)
        return decision

    # -- rewrite ------------------------------------------------------------------------------

    def set_low_params(self, program, names: AbstractSet[str]) -> None:
        """Declare the parameters ``names`` in the low dtype (O2; ``amp_init`` converts values)."""
        block = program.global_block()
        for name in names:
            if block.has_var(name):
                block.var(name).desc.set_dtype(VARTYPE_OF[self.policy.dtype])

    def low_params(self, program, optimizer_type: str) -> frozenset[str]:
        """O2: the parameters every consumer would read in the low dtype, and the optimizer
        can update in it on this device (else they stay fp32 and are cast once per step)."""
        if self.policy.level != "O2" or (self.kernels is not None
                                          and optimizer_type not in self.kernels):
            return frozenset()
        block = program.global_block()
        low = {p.name for p in block.all_parameters()}
        for op in block.ops:
            if not is_forward(op) or op.type in _IO_OPS:
                continue
            forced = self._forced_fp32(op)
            for slot in op.input_names:
                for name in op.input(slot):
                    if name not in low:
                        continue
                    d = plan_op(self.policy, "paddle", op.type, ("float32",), force_fp32=forced,
                                lowp_kernels=self.kernels, attrs=_OpAttrs(op),
                                input_names=(slot,))
                    if d.kept[0] or op.has_attr("sub_block") or d.run_dtype != self.policy.dtype:
                        low.discard(name)
        return frozenset(low)

    def rewrite(self, program) -> CastReport:
        """Rewrite the forward ops of ``program``'s global block; return the decisions."""
        block = program.global_block()
        block._sync_with_cpp()  # once; every insert below keeps Python and C++ in step
        self._cast_of: dict[tuple[str, str], str] = {}
        self._origin: dict[str, str] = {}
        self._rounded: set[str] = set()
        decisions = []
        i = 0
        while i < len(block.ops):
            op = block.ops[i]
            if not is_forward(op) or op.type in _IO_OPS:
                i += 1
                continue
            if op.has_attr("sub_block"):
                i = self._control_flow(block, i, op, decisions) + 1
                continue
            slots = [(slot, name) for slot in op.input_names for name in op.input(slot)]
            d = self.plan(block, op, slots)
            decisions.append(d)
            role = op.attr(_ROLE) if op.has_attr(_ROLE) else 0
            if op.type == "cast":  # a cast before a cast is a chain: only fix the attribute
                op._set_attr("in_dtype", block._var_recursive(op.input("X")[0]).dtype)
            else:
                for (slot, name), target in zip(slots, d.casts):
                    if target is not None:
                        i = self._rename_in(block, i, op, name, self._cast(block, i, name, target,
                                                                           role))
                for (slot, name), rnd in zip(slots, d.round_inputs):
                    if rnd:
                        name = self._current(op, slot, name, slots)
                        i = self._rename_in(block, i, op, name, self._round(block, i, name, role))
            i = self._outputs(block, i, op, d, role)
            i += 1
        self._notices.summarize("paddle_amp: program", decisions, _DEVICE)
        return CastReport("paddle", tuple(decisions))

    def _control_flow(self, block, i: int, op, decisions: list) -> int:
        """A control-flow op (cond, while): its sub-block is not rewritten and runs in fp32,
        so low-precision values it reads are cast to fp32, in the op and its sub-blocks."""
        slots = [(slot, name) for slot in op.input_names for name in op.input(slot)]
        d = self.plan(block, op, slots, "control flow: its sub-block runs in float32")
        decisions.append(d)
        role = op.attr(_ROLE) if op.has_attr(_ROLE) else 0
        for (_, name), target in zip(slots, d.casts):
            if target is not None:
                new, inserted = self._cast(block, i, name, target, role)
                i += inserted
                for each in [op, *_ops_within(op)]:
                    each._rename_input(name, new)
        return i

    @staticmethod
    def _current(op, slot, name, slots) -> str:
        """The name input ``name`` of ``slot`` has now (a cast may have renamed it)."""
        names = op.input(slot)
        pos = [n for s, n in slots if s == slot].index(name)
        return names[pos]

    @staticmethod
    def _rename_in(block, i: int, op, old: str, new: tuple[str, int]) -> int:
        name, inserted = new
        if name != old:
            op._rename_input(old, name)
        return i + inserted

    def _cast(self, block, i: int, name: str, target: str, role) -> tuple[str, int]:
        """A var holding ``name`` in ``target`` and how many ops were inserted before ``i``."""
        src = self._origin.get(name, name)
        if dtype_name(block._var_recursive(src)) == target:
            return src, 0
        if (src, target) in self._cast_of:
            return self._cast_of[(src, target)], 0
        out = self._insert_cast(block, i, src, target, f"{src}.cast_{_SHORT[target]}", role)
        self._cast_of[(src, target)] = out
        self._origin[out] = src
        return out, 1

    def _round(self, block, i: int, name: str, role) -> tuple[str, int]:
        """``name`` rounded through the low dtype (emulation), as a float32 var."""
        low = self.policy.dtype
        src = self._origin.get(name, name)
        if name in self._rounded or dtype_name(block._var_recursive(src)) == low:
            return name, 0
        if (name, "round") in self._cast_of:
            return self._cast_of[(name, "round")], 0
        mid = self._insert_cast(block, i, name, low, f"{name}.emul_{_SHORT[low]}", role)
        out = self._insert_cast(block, i + 1, mid, "float32", f"{name}.emul", role)
        self._cast_of[(name, "round")] = out
        self._rounded.add(out)
        return out, 2

    @staticmethod
    def _insert_cast(block, i: int, src: str, target: str, stem: str, role) -> str:
        var = block._var_recursive(src)
        out = block.create_var(name=unique_name.generate(stem), dtype=VARTYPE_OF[target],
                               shape=var.shape, lod_level=var.lod_level, persistable=False,
                               stop_gradient=var.stop_gradient)
        _insert_cast_op(block, i, var.name, out.name, var.dtype, out.dtype, role)
        return out.name

    def _outputs(self, block, i: int, op, d: OpDecision, role) -> int:
        """Declare or round ``op``'s floating outputs; forget casts of overwritten values."""
        for name in op.output_arg_names:
            for key in [k for k in self._cast_of if k[0] == name]:
                del self._cast_of[key]
            for cast in [c for c, src in self._origin.items() if src == name]:
                del self._origin[cast]
            self._rounded.discard(name)
        if op.type == "cast" or d.run_dtype is None:
            return i
        for slot in (s for s in op.output_names if s not in d.kept_outputs):
            for name in op.output(slot):
                var = block._find_var_recursive(name)
                if dtype_name(var) != "float32":
                    continue
                if d.run_dtype in _LOW:
                    var.desc.set_dtype(VARTYPE_OF[d.run_dtype])
                elif d.round_outputs:
                    raw = block.create_var(name=unique_name.generate(f"{name}.raw"),
                                           dtype=var.dtype, shape=var.shape,
                                           lod_level=var.lod_level, persistable=False,
                                           stop_gradient=var.stop_gradient)
                    op._rename_output(name, raw.name)
                    mid = self._insert_cast(block, i + 1, raw.name, d.low_dtype,
                                            f"{name}.emul_{_SHORT[d.low_dtype]}", role)
                    _insert_cast_op(block, i + 2, mid, var.name, VARTYPE_OF[d.low_dtype],
                                    var.dtype, role)
                    self._rounded.add(name)
                    i += 2
        return i
