"""``ProgramIR``: what differs between Paddle's two program IRs, declared once.

The op walk (``rewrite.Rewriter``) and the loss-scaling sequence
(``scaling.LossScaling``) are written once over this protocol, as the core's
loss-scale rule is written once over ``ArrayOps``. One implementation per IR,
each bound to one program: ``ir.legacy.LegacyProgram`` (Paddle 2.6's program
IR, and Paddle 3 under ``FLAGS_enable_pir_api=0``) and ``ir.pir.PirProgram``
(Paddle 3's default); ``ir.of(program)`` picks it once per program. A feature
written for one IR only is a gap: write it here, for both.

A value is a var name (legacy) or a ``pir.Value``; ``key`` is the identity the
walk caches by (never ``==`` or ``hash`` on a PIR value: the first builds an
op, the second is per wrapper).

Not declared: the oneDNN kernel attributes (``use_mkldnn``/``mkldnn_data_type``)
the bf16 work needs: the legacy IR sets them as op attributes, PIR selects
oneDNN kernels by a pass over ``onednn_op`` dialect ops, and neither is probed
here yet; the bf16 work adds the method to both implementations.
"""
from __future__ import annotations

import dataclasses
from typing import (AbstractSet, Any, Callable, ContextManager, Hashable, Iterator, Mapping,
                    Optional, Protocol, runtime_checkable)

from amp_adapters import ParamUse
from amp_adapters.loss_scale import ArrayOps, LossScaleConfig
from amp_adapters.report import GraphCasts

# The reason a control-flow op (cond, while) and what it reads stay float32, in both IRs.
CONTROL_FLOW = "control flow: its blocks run in float32"


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


@runtime_checkable
class ProgramIR(Protocol):
    """One program, seen through its IR (``name``: "legacy" or "pir")."""

    name: str
    program: Any

    # -- values: dtype ('float16'..., None unless a floating dense tensor), identity, state --
    def dtype(self, value: Any) -> Optional[str]: ...
    def key(self, value: Any) -> Hashable: ...
    def holds_var(self, name: str) -> bool:
        """True if the program holds the persistable ``name`` (a clone holds the state)."""

    # -- the op walk: reading ----------------------------------------------------------------
    def prepare(self, use_guard: bool, black_varnames: AbstractSet[str]) -> None:
        """Check the guard and the black var names mean something here, before a walk."""

    def forward_ops(self) -> Iterator[Any]:
        """The forward ops to plan, in order; casts inserted meanwhile are not seen (close it:
        ``contextlib.closing``)."""

    def op_type(self, op: Any) -> str:
        """The op's name in the legacy vocabulary the op tables and policies use."""

    def attrs(self, op: Any) -> Mapping[str, Any]: ...
    def slots(self, op: Any) -> list[Slot]: ...
    def in_guard(self, op: Any) -> bool: ...
    def var_names(self, op: Any) -> AbstractSet[str]: ...
    def is_control_flow(self, op: Any) -> bool: ...
    def control_flow_slots(self, op: Any) -> list[Slot]:
        """What a control-flow op reads: its inputs and the outer values its blocks read."""

    def is_cast(self, op: Any) -> bool: ...
    def param_uses(self, forced: Callable[[Any], Optional[str]]) -> dict[str, list[ParamUse]]:
        """O2: how the forward ops read each parameter (``forced``: why an op runs fp32)."""

    def graph_casts(self) -> Optional[GraphCasts]:
        """The forward casts in the program now (None: the IR cannot tell yet)."""

    # -- the op walk: writing (``before``: the op a new op goes in front of) ----------------
    def cast(self, before: Any, value: Any, dtype: str) -> Any: ...
    def round(self, before: Any, value: Any, low: str) -> Any:
        """``value`` rounded through ``low`` (two casts), as float32."""

    def set_input(self, slot: Slot, old: Any, new: Any) -> None: ...
    def current(self, slot: Slot) -> Any: ...
    def rewire_within(self, op: Any, old: Any, new: Any) -> None:
        """A control-flow op and every op in its blocks read ``new`` for ``old``."""

    def chain_cast(self, op: Any) -> None:
        """A user's cast whose input may have changed dtype: keep it consistent."""

    def overwritten(self, op: Any) -> AbstractSet[Hashable]:
        """The keys of the values ``op`` overwrites (their casts are stale after it)."""

    def float_outputs(self, op: Any, kept: AbstractSet[str]) -> list:
        """``op``'s float32 outputs outside the ``kept`` slots and shape-only outputs."""

    def retype(self, op: Any, value: Any, dtype: str) -> None: ...
    def round_output(self, op: Any, value: Any, low: str) -> Any:
        """Round ``op``'s output through ``low`` for its readers; the rounded value."""

    def set_param_dtype(self, names: AbstractSet[str], dtype: str) -> None: ...

    # -- loss scaling ------------------------------------------------------------------------
    def optimizer_section(self) -> ContextManager:
        """Ops built inside carry the optimizer's role."""

    def state_var(self, dtype: str, shape: list, value: Any, stem: str) -> Any:
        """A persistable var at ``value`` (set by the startup program), named from ``stem``."""

    def scale_loss(self, loss: Any, scale: Any) -> Any: ...
    def unscale(self, grads: list, scale: Any) -> Any:
        """Divide ``grads`` by ``scale`` in place; the bool[1] "a gradient is not finite"."""

    def all_reduce_max(self, flag: Any, ring_id: int) -> Any:
        """``flag`` OR-ed over the workers of ``ring_id`` (one in-graph all-reduce)."""

    def record_nonfinite(self, found_inf: Any, grads: list, dst: Any) -> None:
        """On overflow only: ``dst[i]`` = gradient ``i`` was finite (for the guard)."""

    def state_ops(self) -> StateOps: ...
    def fused_update(self, carrier: Any, found_inf: Any, state: dict,
                     config: LossScaleConfig) -> None:
        """Paddle's ``update_loss_scaling`` on the state (it zeroes ``carrier`` on overflow)."""

    def clip(self, var: Any, lo: float, hi: float) -> None: ...
    def mark(self) -> Any:
        """Where the ops built from now on start (for ``skip``)."""

    def skip(self, optimizer: Any, mark: Any, found_inf: Any, grads: list,
             state: dict) -> Optional[list]:
        """Make the optimizer ops built since ``mark`` a true skip on ``found_inf`` by the IR's
        skip table, consulted once; the optimizer's ops if they moved, else None."""
