"""The regions' state, shared by the region lifecycle (``dispatch``) and the wrappers
(``wrappers``): one ``Frame`` per open ``auto_cast`` region (its policy, device truth and
plans), each thread's stack of them, the decisions kept across regions, and the wrappers'
fast-path flags, which only region events open and close (see "The fast path" below)."""
from __future__ import annotations

import contextlib
import dataclasses
import threading
from dataclasses import dataclass, field
from typing import Any, Iterator, Optional

from amp_adapters import DeviceProfile, OpCall, OpDecision, Policy, ShapeClass, plan_op
from amp_adapters.services.fallback import FallbackNotices

from . import kernels

@dataclass(eq=False)  # a region is itself: pop() finds it by identity
class Frame:
    """One active ``auto_cast`` region: its policy, the device truth, and the plan of each
    (program op, input dtypes) met in it (``plans``: None where the op runs as it is,
    else its ``OpDecision``, keyed by (op, dtypes..., and the ranks where they matter));
    ``decisions``: the same keys -> every decision made (those with nothing to do too);
    ``ran``: program op -> the latest decision planned for it in this region, for
    ``cast_report``-style checks."""

    policy: Policy
    device: Optional[DeviceProfile]
    plans: dict = field(default_factory=dict)
    ran: dict = field(default_factory=dict)
    decisions: dict = field(default_factory=dict)
    log: Optional[list] = None  # when a list: every call's decision, in call order (report)
    # (op, element sizes) -> (plan, its decision): _planned
    fast: dict = field(default_factory=dict)
    on: bool = False  # policy.enabled, a plain field (to_static's SOT reads no property)
    layered: bool = False  # the policy has layer rules: ops are planned per Layer path
    # measured speed: decisions per shape class (``_by_shape``), from the device's costs
    measured: bool = False
    # in a legacy program being built: (its block, the op count at entry, ids of the ops an
    # inner region wrote): the ops appended in between are written at exit (``legacy``)
    legacy: Optional[tuple] = None
    # program op -> its decision, for the ops a float32 call of runs as it is here (the
    # wrappers' fast path: ``quiet``); counted: whether it keeps the wrappers installed
    quiet: dict = field(default_factory=dict)
    counted: bool = False
    # shares: whether it keeps the step's cast sharing installed (``stepcasts``: it wraps
    # ``Layer.__call__``, which costs tens of microseconds a step to put in and take out): a
    # region whose wrapped ops all run float32 calls as they are casts nothing to share
    shares: bool = False
    # a region with layer rules opened inside a forward: the Layer calls it found running
    # (``layer_paths.adopt``), put back when it closes
    adopted: Optional[tuple] = None
    # when a list: each wrapped call, (its decision: the log's, None where the region
    # planned nothing; its inputs; its result; the path of the Layer running it), for a
    # caller that examines every op (the doctor: ``_watched``)
    watched: Optional[list] = None
    # a doctor's region: a region opened inside it that runs mixed precision runs under its
    # policy (``push``); training: what the region's device truth was picked for
    governs: bool = False
    training: Optional[bool] = None

    def __post_init__(self) -> None:
        self.on = self.policy.enabled
        self.layered = self.on and _has_layer_rules(self.policy)
        self.measured = self.device is not None and self.device.costs is not None

    def note(self, op: str, decision: OpDecision) -> None:
        """Record ``decision`` as the latest of ``op`` in this region (``ran``). A decision
        other than the op's quiet one closes the op's fast path (a float32 call must record
        its decision again: ``_quiet_here``)."""
        self.ran[op] = decision
        quiet_one = self.quiet.get(op)
        if quiet_one is not None and decision is not quiet_one:
            with _lock:
                set_quick(op, False)

    def plan(self, key: tuple, ranks: Optional[tuple] = None,
             instance: Optional[str] = None, shape: Optional[ShapeClass] = None) -> Any:
        """Decide ``key`` = (program op, *input dtypes) once in this region (with ``ranks``,
        its inputs' ranks, for an op the device refuses by shape; ``instance``: the path of
        the Layer running it, for the policy's layer rules; with ``shape``, its inputs'
        shape class, under measured speed): the decision, None when
        the op has nothing to do (no cast, no rounding, not run low), or ``BY_RANK`` when
        the decision depends on the inputs' ranks (``DeviceProfile.refusal``: a broadcast
        operand's gradient on a reference implementation); then ask again with them.
        Kept in ``plans`` and ``decisions`` under ``_slot``."""
        full = key if ranks is None else key + ranks
        if shape is not None:
            full = key + (shape,)
        op = key[0]
        if ranks is None and shape is None and self.device is not None and op in \
                self.device.slow_broadcast_grads:
            free = self._decide(key, None, instance)
            if free.run_dtype is not None and free.run_dtype == free.low_dtype:
                self.plans[_slot(key, instance)] = BY_RANK
                return BY_RANK
        d = self._decide(full, shape if shape is not None else _shape(ranks), instance)
        slot = _slot(full, instance)
        if all(t is None for t in d.input_dtypes):
            # no floating input: nothing to cast or round (plan_op still plans a lower op's
            # emulation for it: rounding an integer result through float16 would be wrong),
            # and so recorded: the op runs as it is
            self.decisions[slot] = _as_it_is(d)
            self.note(op, self.decisions[slot])
            self.plans[slot] = None
            return None
        self.decisions[slot] = d
        self.note(op, d)
        if (d.fell_back or d.emulated) and not _notices.noted(op, "CPU", d.low_dtype):
            route = kernels.missing_routes(d.low_dtype).get(op) if d.lacks_kernel else None
            _notices.note(op, "CPU", d, f"its oneDNN route fails in eager mode: {route}"
                          if route else "")
        acts = d.needs_action or (d.run_dtype is not None and d.run_dtype == d.low_dtype)
        self.plans[slot] = d if acts else None
        return self.plans[slot]

    def plan_shaped(self, key: tuple, shapes: list, instance: Optional[str] = None
                    ) -> tuple:
        """(plan, decision) of ``key`` on operands of ``shapes`` (a -1 dimension: unknown, a
        batch a program leaves open, as the static runtime takes it) run by the Layer at
        ``instance``: as ``_noted`` and ``_by_shape`` decide a call on tensors of those shapes,
        the ranks asked only where the decision depends on them (``BY_RANK``), the shape
        class only under measured speed. ``legacy``'s route, which sees a program's ops."""
        if self.measured:
            shape = ShapeClass.of(shapes, _result_rank(*map(len, shapes)))
            slot = _slot(key + (shape,), instance)
            d = self.plans[slot] if slot in self.plans else self.plan(key, None, instance, shape)
            return d, self.decisions[slot]
        slot = _slot(key, instance)
        d = self.plans[slot] if slot in self.plans else self.plan(key, None, instance)
        if d is BY_RANK:
            ranks = tuple(map(len, shapes))
            slot = _slot(key + ranks, instance)
            d = self.plans[slot] if slot in self.plans else self.plan(key, ranks, instance)
        return d, self.decisions[slot]

    def _decide(self, full: tuple, shape, instance: Optional[str] = None) -> OpDecision:
        """``plan_op`` for ``full`` (op, dtypes..., [ranks...]) run by the Layer at path
        ``instance``, kept across regions."""
        slot = (self.policy, self.device, _slot(full, instance))
        cached = _decided.get(slot)
        if cached is not None:
            return cached
        op, dtypes = full[0], full[1:3] if shape is not None else full[1:]
        d = plan_op(self.policy, "paddle",
                    OpCall(op, tuple(_name(t) for t in dtypes), shape=shape, instance=instance),
                    device=self.device)
        if len(_decided) > 4096:
            _decided.clear()
        _decided[slot] = d
        return d


def _has_layer_rules(policy: Policy) -> bool:
    """Whether ``policy`` has layer rules for Paddle, kept per policy object (a training loop
    enters a region per step with the same cached policy)."""
    kept = _layered.get(id(policy))
    if kept is None or kept[0] is not policy:
        if len(_layered) > 256:
            _layered.clear()
        kept = _layered[id(policy)] = (policy, bool(policy.layer_patterns("paddle")))
    return kept[1]


_layered: dict = {}  # id(policy) -> (policy, whether it has layer rules)


def _as_it_is(d: OpDecision) -> OpDecision:
    """``d`` (an op on inputs none of which is floating) as it runs: as it is, no cast, no
    rounding, no low dtype (AMP never casts integers)."""
    n = len(d.input_dtypes)
    return dataclasses.replace(
        d, run_dtype=None, casts=(None,) * n, emulated=False, fell_back=False,
        low_dtype=None, multicast=False, round_inputs=(False,) * n, round_outputs=False,
        refusal=None, reason="no floating input: it runs as it is (AMP never casts integers)")


def _slot(full: tuple, instance: Optional[str]) -> tuple:
    """Where a plan of ``full`` run by the Layer at ``instance`` is kept (a region without
    layer rules plans with no instance: the key alone)."""
    return full if instance is None else (full, instance)


BY_RANK = object()  # a plan that depends on the inputs' ranks (Frame.plan)


def _result_rank(a: int, b: int) -> int:
    """The rank of a GEMM's result on operands of ranks ``a`` and ``b``."""
    return max(a, b) if min(a, b) >= 2 else max(a, b) - 1


def _shape(ranks: Optional[tuple]):
    """The shape class of a GEMM's operands of ``ranks`` (dimensions unknown: the broadcast
    rule reads ranks only)."""
    if ranks is None:
        return None
    return ShapeClass(tuple((None,) * r for r in ranks), _result_rank(*ranks))


class _Regions(threading.local):
    """The regions open in this thread, innermost last, and the dtype of the last region
    this thread entered: like Paddle's own tracer state, a region opened in one thread (the
    training loop) does not reach another (a reader, another trainer)."""

    frames: list = []  # noqa: RUF012  (threading.local: each thread starts from this)
    last_dtype: str = "float16"  # paddle.amp's amp_global_state().amp_dtype: last set
    written: Optional[set] = None  # a to_static trace's: ids of the ops regions wrote (jit)

    def __init__(self) -> None:
        self.frames = []
        self.last_dtype = "float16"
        self.written = None


_regions = _Regions()
_open = [0]  # regions open in all threads: the wrappers stay installed while any is
_lock = threading.Lock()
_decided: dict = {}  # (policy, device, key) -> OpDecision: a region re-entered plans nothing
_notices = FallbackNotices("paddle_amp.dygraph")  # the core's wording, once per op
# id(open region) -> the frames of the thread that opened it (closed from any thread); not a
# field: a region that refers to its own stack is a cycle SOT's guards recurse into
_owners: dict = {}


def current() -> Optional[Frame]:
    """The innermost active region, or None."""
    frames = _regions.frames
    return frames[-1] if frames else None


def state_key() -> Any:
    """What decides this thread's ops now, as a key: None outside a region that runs mixed
    precision, else the innermost region's (policy, device truth, whether it is a report's
    region). ``to_static`` keys its programs by it (``jit``): a report's region traces its
    own program, so its decisions are logged (a program traced before logs nothing)."""
    frame = current()
    return None if frame is None or not frame.on else (
        frame.policy, frame.device, frame.log is not None)


@contextlib.contextmanager
def tracing() -> Iterator[set]:
    """A ``to_static`` trace in this thread: yields the ids of the legacy-program ops that
    regions opened inside it wrote (``jit``: the enclosing region leaves them)."""
    before, _regions.written = _regions.written, set()
    try:
        yield _regions.written
    finally:
        _regions.written = before


def last_dtype() -> str:
    """The dtype of the last region this thread entered (the native GradScaler reads the
    same; a region in another thread is no business of this thread's scaler)."""
    return _regions.last_dtype


_NAMES: dict[Any, Optional[str]] = {}


def _name(dtype: Any) -> Optional[str]:
    """The core's name of a Paddle dtype (None: not floating, never cast)."""
    if not _NAMES:
        import paddle
        for n in ("float16", "bfloat16", "float32", "float64"):
            _NAMES[getattr(paddle, n)] = n
            _NAMES[n] = n  # a legacy program's var, read by name (legacy.rewrite)
    return _NAMES.get(dtype)


# The fast path
# -------------
# A region knows at entry which wrapped ops run as they are on float32 inputs (``quiet``: the
# op is kept float32, or the region lowers nothing). Such a call costs Paddle's own op and
# little more: each wrapper opens with a test of a few hundred nanoseconds, no dtype read
# (about 1 us each in Paddle 2.6.2), no region lookup, no record:
#
#     if quick_gemm and <x and y are eager tensors> and <their element sizes sum to 8>:
#         return <Paddle's op>(x, y, ...)
#
# Element sizes 4 and 4 are the only pair of 1, 2, 4, 8 that sums to 8: two float32 tensors
# (an int32 one gets the same answer, run as it is: AMP never casts integers).
#
# ``quick_gemm`` (``matmul_v2``'s wrappers: ``matmul``, ``linear``, ``x @ y``) and
# ``quick_conv`` (``conv2d``) are this module's flags (the wrappers read them here), open
# only while handing the call on unrecorded loses nothing: in every thread with a region
# open, the innermost region has the op quiet and has recorded that quiet decision as the
# op's latest (``ran``) already. A thread without a region runs the op as it is anyway. So
# the flags are kept by the events that change that, under ``_lock``:
#
# - a region opens (``dispatch.push``): the thread's innermost region has recorded
#   nothing: closed;
# - a region closes (``dispatch._remove``): an outer region is innermost again: ``reopen``
#   checks;
# - a region records another decision for the op (``Frame.note``: a bfloat16 input, a
#   float64 one): closed;
# - a float32 call the region keeps as it is, with the flag closed
#   (``wrappers._quiet_here``): the region records its quiet decision and ``reopen`` checks.
#
# Everything else (the flag closed, another input, keywords) takes the planned path.
# ``ran`` is the region's record, to read: a record the caller deletes while the flag is
# open is not written again by the calls that follow.

quick_gemm = False  # matmul_v2's fast path is open (see above)
quick_conv = False  # conv2d's


def set_quick(op: str, on: bool) -> None:
    """Open or close ``op``'s fast path (the caller holds ``_lock``)."""
    global quick_gemm, quick_conv
    if op == "matmul_v2":
        quick_gemm = on
    else:
        quick_conv = on


def reopen(op: str) -> None:
    """Open ``op``'s fast path if, in every thread with a region open, the innermost region
    has ``op`` quiet and that quiet decision recorded as its latest; else close it (the
    caller holds ``_lock``)."""
    on = bool(_owners)
    for frames in _owners.values():
        innermost = frames[-1]
        d = innermost.quiet.get(op)
        if d is None or innermost.ran.get(op) is not d:
            on = False
            break
    set_quick(op, on)
