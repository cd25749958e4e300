"""O2 parameter storage: which parameters are stored in the low dtype, for both frameworks.

Under O2 a parameter is stored in ``policy.dtype`` (with a float32 master copy
the optimizer updates) when every op that reads it computes with low-precision
numerics: in the low dtype, or EMULATED in float32 on values rounded through
it. A parameter read by any float32 op (layer_norm's scale and bias, batch-norm
statistics, an op outside ``fp16_guard``, a control-flow block, an op with no
low kernel here and no emulation) stays float32, so that op never sees a
rounded weight. An op that only moves values (reshape, transpose: the
canonical ``[pass_through]`` ops) is judged by the ops reading its result
(``ParamUse.then``): a conv bias reshaped for a float32 add stays float32, as
natively, instead of being stored low and cast back before the add. Every decision comes from
``plan_op``: a backend only lists
each parameter's consumers (``ParamUse``) and applies the answer, so MXNet and
Paddle store the same kinds of parameters low. Pure functions, no host sync.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping, Optional

from .device import DeviceProfile, ShapeClass
from .oplists import passes_through
from .planner import plan_reader
from .policy import Policy


@dataclass(frozen=True)
class ParamUse:
    """One op reading a parameter in the forward pass (or, for ``plan_op``'s ``readers``,
    the result of an op that only moves values).

    ``op``: the framework's op name; ``attrs``: its attributes (for conditional
    rules); ``slot``: the name of the input slot the parameter feeds (a slot
    the op table keeps in float32, such as batch-norm statistics, keeps the
    parameter float32); ``force_fp32``: a reason the
    backend runs this op in float32 whatever its category (outside
    ``fp16_guard``, a control-flow block, a black-listed variable); ``then``:
    for an op that only moves values (``oplists.passes_through``), the ops
    reading its result (None: not listed; the op is judged itself);
    ``instance``: the op instance's names, for the policy's layer rules (a layer kept in
    float32 keeps the parameters only it reads in float32). ``shape``: the shape class of
    the op's operands (``DeviceProfile`` rules and measured
    speed read it), so a parameter only a refused op reads is stored as that op runs.
    """

    op: str
    attrs: Optional[Mapping[str, object]] = None
    slot: Optional[str] = None
    force_fp32: Optional[str] = None
    then: Optional[tuple["ParamUse", ...]] = None
    shape: Optional[ShapeClass] = None
    instance: Optional[tuple[str, ...]] = None


@dataclass(frozen=True)
class ParamPlan:
    """The storage dtype of every parameter, and why (``reasons[name]``)."""

    dtypes: Mapping[str, str]
    reasons: Mapping[str, str]

    @property
    def low(self) -> frozenset[str]:
        """The parameters stored in the low dtype (each with a float32 master)."""
        return frozenset(n for n, d in self.dtypes.items() if d != "float32")

    @property
    def fp32(self) -> frozenset[str]:
        """The parameters stored in float32 (no master copy needed)."""
        return frozenset(n for n, d in self.dtypes.items() if d == "float32")

    def format(self) -> str:
        """One line per parameter: name, storage dtype, reason."""
        width = max((len(n) for n in self.dtypes), default=0)
        return "\n".join(f"{n.ljust(width)}  {self.dtypes[n]:8s}  {self.reasons[n]}"
                         for n in sorted(self.dtypes))


def plan_params(policy: Policy, framework: str, uses: Mapping[str, Iterable[ParamUse]], *,
                device: Optional[DeviceProfile] = None) -> ParamPlan:
    """Decide the storage dtype of each parameter in ``uses`` ({name: its forward consumers}).

    Only level O2 stores parameters low; ``device`` as for ``plan_op`` (None: every op
    has a low kernel, as in a device-free transform).
    """
    dtypes: dict[str, str] = {}
    reasons: dict[str, str] = {}
    for name, consumers in uses.items():
        dtypes[name], reasons[name] = _decide(policy, framework, tuple(consumers), device)
    return ParamPlan(dtypes, reasons)


def _decide(policy: Policy, framework: str, consumers: tuple[ParamUse, ...],
            device: Optional[DeviceProfile]) -> tuple[str, str]:
    if policy.level != "O2":
        return "float32", f"level {policy.level}: parameters are stored in float32"
    if not consumers:
        return "float32", "no forward op reads it"
    emulated = False
    for use, via in _readers(framework, consumers, ()):
        d = plan_reader(policy, framework, use, device)
        through = f" through {', '.join(via)}" if via else ""
        if d.kept and d.kept[0]:
            return "float32", f"{use.op} keeps its {use.slot} input{through} in float32"
        if d.precision != policy.dtype:
            return "float32", f"read{through} by {use.op}, which runs in float32: {d.reason}"
        emulated |= d.emulated
    ops = ", ".join(sorted({u.op for u in consumers}))
    how = " (some EMULATED on this device)" if emulated else ""
    return policy.dtype, f"every reader runs in {policy.dtype}{how}: {ops}"


def _readers(framework: str, consumers: Iterable[ParamUse], via: tuple[str, ...]):
    """(reader, the pass-through ops on the way) for each op that reads the parameter's
    values: a pass-through op whose readers are listed is judged with them (it runs in the
    parameter's dtype too, so it needs its own low kernel)."""
    for use in consumers:
        yield use, via
        if use.then and use.force_fp32 is None and passes_through(framework, use.op, use.attrs):
            yield from _readers(framework, use.then, via + (use.op,))
