"""``ProgramIR``: what differs between Paddle's two program IRs, declared once.

The op walk (``rewrite.Rewriter``) and the loss-scaling sequence
(``scaling.LossScaling``) are written once over this protocol, as the core's
loss-scale rule is written once over ``ArrayOps``. It is split by concern (``ValuesIR``:
values and the walk, ``WritingIR``, ``MastersIR``: O2's masters, ``ScalingIR``: loss
scaling, ``DoctorIR``, ``RecomputeIR``: casts made again in the backward), each user typed against its part; ``ProgramIR`` is all of them. One
implementation per IR,
each bound to one program: ``ir.legacy.LegacyProgram`` (Paddle 2.6's program
IR, and Paddle 3 under ``FLAGS_enable_pir_api=0``) and ``ir.pir.PirProgram``
(Paddle 3's default); ``ir.of(program)`` picks it once per program. A feature
written for one IR only is a gap: write it here, for both.

A value is a var name (legacy) or a ``pir.Value``; ``key`` is the identity the
walk caches by (never ``==`` or ``hash`` on a PIR value: the first builds an
op, the second is per wrapper).

oneDNN (the only bf16 kernels on a CPU): ``use_onednn`` sends one lowered op to oneDNN's
kernel (``kernels.onednn_kernels``: the ones that run here, by the IR's ``probe``). The legacy IR
does it by the op attributes the native bf16 rewrite sets (``use_mkldnn``/
``mkldnn_data_type``; Paddle 3 also ``use_onednn``/``onednn_data_type``). Under PIR
the executor lowers a bf16 op to oneDNN's kernel by itself (Paddle 3.3.1 registers no
other bf16 GEMM on a CPU), so ``use_onednn`` has nothing to set.
"""
from __future__ import annotations

import collections.abc
import dataclasses
from typing import (AbstractSet, Any, Callable, ContextManager, Hashable, Iterable, Iterator,
                    Mapping, Optional, Protocol, runtime_checkable)

from amp_adapters import LossScaleConfig, ParamUse, ShapeClass
from amp_adapters.rules.loss_scale import ArrayOps
from amp_adapters.services.report import GraphCasts

# The reason a control-flow op (cond, while) and what it reads stay float32, in both IRs.
CONTROL_FLOW = "control flow: its blocks run in float32"

# The native guards' name scopes (``fp16_guard``, ``bf16_guard``): code written for the native
# guards works unchanged; what a program keeps of them is its IR's (``ProgramIR.guarding``).
FP16_GUARD_SCOPE = "__use_fp16__"
BF16_GUARD_SCOPE = "__use_bf16__"
GUARD_SCOPES = (FP16_GUARD_SCOPE, BF16_GUARD_SCOPE)


class OpAttrs(collections.abc.Mapping):
    """An op's attributes, read on demand: the core reads only those its rules name (so the
    walk keeps no copy of which ops have conditional rules)."""

    def __init__(self, names: Callable[[], Iterable[str]], get: Callable[[str], Any]) -> None:
        self._names, self._get = names, get

    def __getitem__(self, name: str) -> Any:
        if name not in self._names():
            raise KeyError(name)
        return self._get(name)

    def __iter__(self) -> Iterator[str]:
        return iter(self._names())

    def __len__(self) -> int:
        return len(list(self._names()))


@dataclasses.dataclass(frozen=True)
class Slot:
    """One tensor input of an op: ``owner`` reads ``value`` at position ``index`` (the op
    itself, or under PIR the ``builtin.combine`` that packs a list operand such as concat's).
    ``name`` is the legacy CamelCase slot name the op tables use; ``cast``: False for a PIR
    attribute turned operand (no gradient semantics), never cast."""

    owner: Any
    index: int
    name: str
    value: Any
    cast: bool = True


class StateOps(ArrayOps[Any], Protocol):
    """The core's ``ArrayOps`` vocabulary as ops of one program, plus storing a result."""

    def store(self, new: Any, dst: Any) -> None:
        """Make the state var ``dst`` hold ``new`` (nothing when ``new`` is ``dst``)."""


ONEDNN_DTYPE = "bfloat16"  # the one low dtype oneDNN runs on a CPU (what a probe tries)


class Probe(Protocol):
    """One IR's device probe: tiny programs of that IR, built and run once on the CPU, that
    answer ``kernels``' questions (the recipes and the assembly live there; only the
    building lives here) and time one op for measured speed (``speed``). One object per
    IR and process (``ProgramIR.probe``), hashable, so the answers are cached per IR.
    Every run is a host sync (a fetch)."""

    name: str  # "legacy" or "pir"
    onednn_casts: bool  # a cast can be sent to oneDNN by itself in this IR

    def available(self) -> bool: ...  # this IR exists in the installed Paddle

    def runs(self, op: str, recipe: Any, backward: bool,
             cast_in: Optional[str] = None) -> bool:
        """Whether ``op`` built by ``kernels``' ``recipe`` ((inputs {slot: (shape, in
        bf16?)}, output slots, attrs)) runs in bf16 on oneDNN, forward and with
        ``backward`` backward, its results finite; ``cast_in`` ("onednn", "plain"): between
        such casts (where ``onednn_casts``). A failure is False, never raised."""

    def casts_round_trip(self, x: Any) -> Optional[tuple[AbstractSet[str], Any]]:
        """``x`` through bf16 by two oneDNN casts: (the primitive kinds oneDNN's log shows,
        the float32 values back), or None (it failed, or ``onednn_casts`` is False)."""

    def time(self, op: str, inputs: Mapping[str, tuple[int, ...]], attrs: Mapping[str, Any],
             training: bool, dtype: str, onednn: bool, cast_in: Optional[str],
             place: Any = None) -> Optional[Any]:
        """``amp_adapters.rules.device.Cost`` of ``op`` on float32 parameters of the shapes
        ``inputs``, in ``dtype`` behind casts (route ``cast_in``), the op on oneDNN with
        ``onednn``, its result cast to float32, against the op in float32 (forward; with
        ``training`` forward and backward too), on ``place`` (default the CPU). None: an op it
        cannot build; a failure
        raises (the caller records it as no kernel)."""


class ValuesIR(Protocol):
    """Values and the op walk (reading): what a value is, which ops the rewrite visits and
    what they read (names, slots and types in the legacy vocabulary). ``name``: "legacy"
    or "pir"; a dtype is 'float16'..., None unless a floating dense tensor."""

    name: str
    program: Any

    def dtype(self, value: Any) -> Optional[str]: ...
    def rank(self, value: Any) -> Optional[int]: ...  # its number of dimensions, if known
    def shape(self, value: Any) -> Optional[tuple[Optional[int], ...]]: ...  # -1: None
    def key(self, value: Any) -> Hashable: ...
    def holds_var(self, name: str) -> bool: ...  # a persistable ``name`` (a clone's state)
    def is_param(self, value: Any) -> bool: ...  # a parameter (weights, biases)
    def persistables(self) -> list[str]: ...  # the tensors a checkpoint holds, by name
    def reached_params(self, loss: Any) -> set[str]:
        """The trainable parameters the backward from ``loss`` reaches: through the values
        that carry a gradient (``stop_gradient`` and non-differentiable ops cut the path).
        Reads the program, changes nothing (minimize checks this before it builds)."""

    # -- the op walk: reading
    def prepare(self, use_guard: bool, black_varnames: AbstractSet[str]) -> None: ...
    def forward_ops(self) -> Iterator[Any]: ...  # inserted casts unseen; close it when done
    def op_type(self, op: Any) -> str: ...
    def attrs(self, op: Any) -> Mapping[str, Any]: ...  # read on demand
    def slots(self, op: Any) -> list[Slot]: ...
    def guarding(self) -> ContextManager: ...  # entered with a guard's scope (``guard``)
    def in_guard(self, op: Any) -> bool: ...  # built inside fp16_guard or bf16_guard
    def var_names(self, op: Any) -> AbstractSet[str]: ...  # what it reads and writes
    def instance_names(self, op: Any) -> tuple[str, ...]: ...  # what layer rules match
    def is_control_flow(self, op: Any) -> bool: ...
    def control_flow_slots(self, op: Any) -> list[Slot]: ...  # its inputs, what its blocks read
    def is_cast(self, op: Any) -> bool: ...
    def is_output(self, op: Any, loss: Any) -> bool:
        """``op`` writes ``loss`` (None: no loss), or has a floating result and no op of the
        program reads any of its results: what a run fetches (``planner.output_fp32``)."""
    def param_uses(self, forced: Callable[[Any], Optional[str]],
                   shape_of: Callable[[Any], Optional[ShapeClass]],
                   instance_of: Callable[[Any], Any] = ...
                   ) -> dict[str, list[ParamUse]]:
        """O2: how the forward ops read each parameter (``forced``: why an op runs fp32;
        ``shape_of``: the shape class of its operands, ``ParamUse.shape``; ``instance_of``:
        its names for the policy's layer rules, ``ParamUse.instance``)."""

    def result_uses(self, op: Any, forced: Callable[[Any], Optional[str]],
                    shape_of: Callable[[Any], Optional[ShapeClass]],
                    instance_of: Callable[[Any], Any] = ...
                    ) -> tuple[ParamUse, ...]:
        """How the forward ops after ``op`` read its results, as ``param_uses`` lists a
        parameter's readers (O2: an op that only moves values is judged with them)."""

    def end_forward(self) -> None: ...  # the ops built so far are the forward pass
    def graph_casts(self) -> Optional[GraphCasts]: ...  # the forward pass's cast ops


class WritingIR(Protocol):
    """The op walk's writing: casts, rewired inputs, retyped and rounded results, oneDNN.
    ``before``: the op a new op goes in front of (the walk's current op)."""

    def cast(self, before: Any, value: Any, dtype: str, plain: bool = False) -> Any: ...
    # (plain: off oneDNN, where ``use_onednn_casts`` sends the others there)
    def round(self, before: Any, value: Any, low: str) -> Any: ...  # through low, as float32
    def set_input(self, slot: Slot, old: Any, new: Any) -> None: ...
    def current(self, slot: Slot) -> Any: ...
    def rewire_within(self, op: Any, old: Any, new: Any) -> None: ...  # op and its blocks
    def chain_cast(self, op: Any) -> None: ...  # a user's cast after its input's retype
    def overwritten(self, op: Any) -> AbstractSet[Hashable]: ...  # their casts are stale
    def float_outputs(self, op: Any, kept: AbstractSet[str]) -> list: ...  # data, not kept
    def retype(self, op: Any, value: Any, dtype: str) -> None: ...
    def round_output(self, op: Any, value: Any, low: str) -> Any: ...  # what readers now read
    def set_param_dtype(self, names: AbstractSet[str], dtype: str) -> None: ...
    probe: "Probe"  # the IR's device probe (``kernels.device_profile``), a class attribute
    def use_onednn(self, op: Any) -> None: ...  # send a lowered op there
    # from now on, casts float32<->bf16 built go there, but those reading the gradient of an
    # op of ``plain_readers`` (O2's master gradients; the rewrite passes ``cast(plain=True)``
    # in front of such an op)
    def use_onednn_casts(self, plain_readers: AbstractSet[str] = frozenset()) -> None: ...
    def require_grad(self, value: Any) -> None: ...  # a cast's output: its gradient computed


class MastersIR(Protocol):
    """O2's emulated float32 masters (``masters.MasterWeights``)."""

    def new_master(self, param: Any, name: str) -> Any: ...  # float32, trainable, param's shape
    def master_grad(self, grad: Any) -> Any: ...  # grad cast to float32, after the backward
    def write_cast(self, src: Any, dst: Any) -> None: ...  # dst = cast(src), at the end


class ScalingIR(Protocol):
    """Loss scaling (``scaling.LossScaling``): state vars and the ops of one step's check,
    skip and update, built at the end of the program."""

    def optimizer_section(self) -> ContextManager: ...  # ops built inside: optimizer role
    def state_var(self, dtype: str, shape: list, value: Any, stem: str) -> Any: ...
    def scale_loss(self, loss: Any, scale: Any) -> Any: ...
    def unscale(self, grads: list, scale: Any) -> Any: ...  # in place; bool[1] "not finite"
    def all_reduce_max(self, flag: Any, ring_id: int) -> Any: ...  # OR over the workers
    def record_nonfinite(self, found_inf: Any, grads: list, dst: Any) -> None: ...
    def state_ops(self) -> StateOps: ...
    def fused_update(self, carrier: Any, found_inf: Any, state: dict,
                     config: LossScaleConfig) -> None: ...  # update_loss_scaling
    def clip(self, var: Any, lo: float, hi: float) -> None: ...  # in place
    def mark(self) -> Any: ...  # where the ops built from now on start
    def skip(self, optimizer: Any, mark: Any, found_inf: Any, grads: list,
             state: dict) -> Optional[list]:
        """Make the optimizer ops built since ``mark`` a true skip on ``found_inf`` by the IR's
        skip table, consulted once; the optimizer's ops if they moved, else None."""


class DoctorIR(Protocol):
    """The numerics doctor (``paddle_amp.doctor``), on the rewritten, trained program."""

    def doctor_ops(self) -> tuple:
        """(a runnable clone with only the forward and backward ops, [its forward ops],
        [its backward ops], in execution order): running it changes no persistable."""

    def end_backward(self, params_grads: list) -> None: ...  # the backward built them
    def float32_twin(self, clone: Any) -> Any: ...  # clone's ops, AMP casts made identities
    def inserted_cast(self, op: Any) -> bool: ...  # a cast the rewrite inserted (not the user's)
    def fetchable(self, clone: Any, name: str) -> bool: ...  # a floating tensor a run can fetch
    def fetch_list(self, clone: Any, names: list) -> list: ...  # what exe.run fetches by
    def copy_with(self, loss: Any) -> tuple: ...  # (a copy of the program, loss in it)
    def replaying(self) -> ContextManager: ...  # static mode in this IR, for building a copy


class RecomputeIR(Protocol):
    """The casts the backward makes again rather than keeping their results
    (``amp_adapters.rules.recompute``): the program as the core's ``OpUse``, the core's
    ``Recast`` written back. Called once the backward is built."""

    def op_uses(self) -> list: ...  # [OpUse] of the block's ops, in execution order
    def recast(self, plan: tuple) -> None: ...  # the Recasts of the last ``op_uses``


@runtime_checkable
class ProgramIR(ValuesIR, WritingIR, MastersIR, ScalingIR, DoctorIR, RecomputeIR, Protocol):
    """One program, seen through its IR: every concern (``ir.of(program)`` gives one). A
    user of one concern is typed against its part (``scaling.LossScaling``: ``ScalingIR``)."""
