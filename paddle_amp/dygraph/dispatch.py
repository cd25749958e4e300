"""The per-op cast in eager mode: the Python entry points of the ops AMP lowers, wrapped
while an ``auto_cast`` region is active (as ``mxnet_amp.patching`` wraps MXNet's ops).

Paddle's eager AMP casts inside its C++ op functions and only for GPU, XPU and custom
places: on a CPU it does nothing, even with the tracer's AMP state set by hand. So the
cast happens one level up, in ``paddle._C_ops``, the module every Python path into an op
goes through (``paddle.matmul``, ``Tensor.matmul``, ``paddle.nn.functional.linear``,
``conv2d``; the wrapped ops are ``_WRAPPERS``):

- a call on values of a PIR program being built (``to_static``, Paddle 3) is planned
  alike; its low route is the op itself on bf16 values (the PIR executor picks oneDNN's
  kernel), so the decisions are built into the program; a legacy-IR program's ops do not
  come through here: a region there writes them when it closes (``legacy``); a call in
  SOT's simulation passes through untouched;
- a tensor is cast or rounded once per step however many ops read it (``stepcasts``: a
  Linear applied N times casts its weight once);
- otherwise the planner decides (``amp_adapters.plan_op`` with the active policy and the
  device truth ``kernels.device_profile``), once per (op, input dtypes) in a region (under
  measured speed, ``policy="auto"``, once per (op, input dtypes, shape class): the device
  then carries the core's speed-book lookup, ``speed.profile``), and, where
  the policy has layer rules (``Policy.layers``), per path of the Layer running the op
  (``layer_paths``: ``2``, ``encoder.layers.3.ffn``, the planner's ``instance``); an op planned
  in the low dtype with a kernel here runs on its oneDNN route (``kernels.ROUTES``) and
  hands back float32 (exact: a widening cast); an emulated op computes in float32 on
  values rounded through the low dtype, and rounds its result; an op that falls back
  runs as it is (logged once).

Results come back float32 because the ops after a lowered one have no plain bf16 kernel
on a CPU and the eager dispatcher cannot reach oneDNN's: a bf16 tensor handed to the next
op would crash it. The low op's numerics are kept (its result carries bf16 rounding); the
ops after it compute in float32, as Paddle's native promotion does for a Linear's bias add.
The wrappers are installed when the first region that decides opens and removed when the
last closes: outside ``auto_cast`` (and in an ``O0`` region) nothing is wrapped and nothing
costs (the Tensor's ``@`` is parked instead, and put back by its first use outside: see
``_SITES``). A region works out at entry which wrapped ops run as they are on float32 inputs
(``quiet``): such a call is handed on without planning, and once the region has recorded
it, without even a record (the wrappers' fast path: see "The fast path" below).
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Optional

from amp_adapters import DeviceProfile, OpCall, OpDecision, Policy, ShapeClass, plan_op
from amp_adapters.services.fallback import FallbackNotices

from . import kernels, layer_paths, legacy, speed, stepcasts
from .stepcasts import cast_once

log = logging.getLogger("paddle_amp.dygraph")


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
                _set_quick(op, False)

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
_sharing = [0]  # regions open in all threads that keep stepcasts installed (Frame.shares)
_lock = threading.Lock()
_decided: dict = {}  # (policy, device, key) -> OpDecision: a region re-entered plans nothing
_notices = FallbackNotices("paddle_amp.dygraph")  # the core's wording, once per op
_originals: dict[str, Callable] = {}
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


def push(policy: Policy, log: Optional[list] = None,
         training: Optional[bool] = None) -> Frame:
    """Open a region under ``policy`` (checked before: nothing here can fail on user input);
    ``log``: a list to append each call's decision to, in call order (``cast_report``).
    ``training`` (None: whether gradients are recorded here, ``paddle.is_grad_enabled``)
    picks the device truth for training (gradient kernels and their refusals too) or
    inference (``DeviceProfile.for_inference``: a broadcast GEMM's slow gradient is no
    reason to keep an eval forward float32).

    A region opened inside one that logs (a model whose ``forward`` opens its own, under
    ``cast_report`` or the doctor) logs to the same lists, as a training step of the same
    kind (``inherit``): the report holds every op the model runs, whichever region decided
    it; inside the doctor's region (``governs``) a region that runs mixed precision runs
    under the doctor's policy instead (the policy examined, or float32 for its reference
    run), and one the model turns off stays off."""
    outer = current()
    inherit = outer is not None and outer.log is not None and log is None
    if inherit:
        if outer.governs and policy.enabled:
            policy = outer.policy
        log, training = outer.log, outer.training
    enabled = policy.enabled
    device = kernels.device_profile(policy.dtype) if enabled else None
    if device is not None:
        training = _grad_enabled() if training is None else training
        if not training:
            device = kernels.device_profile(policy.dtype, training=False)
        device = speed.profile(policy, device)  # measured speed: the core's book
        speed.note_native_speed(policy, training)  # the native's lists, slower here?
    frame = Frame(policy, device, log=log, training=training)
    if inherit:
        frame.watched = outer.watched
        frame.governs = outer.governs
    if _master_grads and enabled and policy.level == "O2" and log is None:
        _hook_master_grads()
    # every region in a legacy program records its place, an ``O0`` one too: its ops are
    # claimed at exit, so the region around it leaves them float32 (``_close_in_program``)
    block = legacy.building_block()
    if block is not None:
        frame.legacy = (block, len(block.ops), set())
    frame.quiet = quiet(frame)
    # a region that decides nothing (O0, enable=False) needs no wrapper: it costs nothing
    frame.counted = frame.on or log is not None
    frame.shares = frame.counted and len(frame.quiet) < len(_PROGRAM_OPS)
    with _lock:
        if frame.counted:
            if not _open[0]:
                _install()
            _open[0] += 1
        if frame.shares:
            if not _sharing[0]:
                stepcasts.install()
            _sharing[0] += 1
        frames = _regions.frames
        _owners[id(frame)] = frames
        frames.append(frame)
        # this thread's innermost region is new: it has recorded nothing (``_reopen``)
        _set_quick("matmul_v2", False)
        _set_quick("conv2d", False)
    if frame.layered:  # inside a forward: the Layer calls running are the model's (adopt)
        layer_paths.enter()
        frame.adopted = layer_paths.adopt()
    if enabled and log is None:  # a cast report's region is no training's dtype
        _regions.last_dtype = policy.dtype
    return frame


def _grad_enabled() -> bool:
    """``paddle.is_grad_enabled()`` (found once: a region is entered per step)."""
    if not _IS_GRAD_ENABLED:
        import paddle
        _IS_GRAD_ENABLED.append(paddle.is_grad_enabled)
    return _IS_GRAD_ENABLED[0]()


_IS_GRAD_ENABLED: list = []


_master_grads: list = []  # O2 parameters decorated with master_grad=True


def master_grad_params(params: list) -> None:
    """``decorate(master_grad=True)``: after each backward run in an O2 region, the gradients
    of ``params`` are float32 (the native's ``master_grad_hook``, registered as it does:
    at each region's entry, for the backward that follows)."""
    _master_grads.extend(params)


def _hook_master_grads() -> None:
    from paddle.base import core
    from .masters import widen_grads
    core.eager._add_backward_final_hook(lambda: widen_grads(list(_master_grads)))


def pop(frame: Frame) -> None:
    """Close ``frame`` (the innermost region of the thread that opened it, or another one of
    its regions), from any thread: a region closed by another thread (a generator finished
    elsewhere, a callback) is closed in its own thread's stack. The last region out, of all
    threads, removes the wrappers. Closing a closed region does nothing. A region in a
    legacy program being built writes the ops appended in it (``legacy.rewrite``)."""
    frames = _owners.get(id(frame))
    try:
        if frame.legacy is not None and frames is not None and frame in frames:  # (identity)
            _close_in_program(frame, frames)
    finally:  # a failed write still closes the region: nothing stays wrapped for good
        _remove(frame, frames)


def _remove(frame: Frame, frames: Optional[list]) -> None:
    """Take ``frame`` off its thread's stack (``pop``); the last region out, of all threads,
    uninstalls the wrappers."""
    with _lock:
        if frames is None or frame not in frames:
            return  # closed already
        del _owners[id(frame)]
        if frames[-1] is frame:
            frames.pop()
        else:
            frames[:] = [f for f in frames if f is not frame]
        for op in _PROGRAM_OPS:  # an outer region is innermost again: it may have recorded
            if _owners:
                _reopen(op)
            else:
                _set_quick(op, False)
        try:
            if frame.layered:
                layer_paths.release(frame.adopted)
                layer_paths.leave()
        finally:
            if frame.shares:
                _sharing[0] -= 1
                if not _sharing[0]:
                    stepcasts.uninstall()
            if frame.counted:
                _open[0] -= 1
                if not _open[0]:
                    _uninstall()


_PROGRAM_OPS = ("matmul_v2", "conv2d")  # what the wrappers plan (``_WRAPPERS``)


def quiet(frame: Frame) -> dict:
    """What ``frame`` knows at entry: program op -> its decision, for each wrapped op whose
    call on float32 inputs runs as it is (nothing to cast, round or run low), so a wrapper
    hands such a call straight on, with no planning per call (``_matmul``): an op the
    policy keeps float32, or a region that lowers nothing. Not for a report's region (it
    logs each call), or an op without a kernel here not yet warned about (its first call
    plans, and says so), nor a region that decides per Layer path or per shape class."""
    if frame.log is not None or not frame.on or frame.layered or frame.measured:
        return {}  # (decided per Layer path, or per shape class: never at entry)
    # by identity: a training loop enters a region per step with the same checked policy
    # and device objects (both cached), and hashing a Policy costs tens of microseconds
    key = (id(frame.policy), id(frame.device), len(_notices))  # (a warning since: plan again)
    kept = _quiet.get(key)
    if kept is not None and kept[0] is frame.policy and kept[1] is frame.device:
        return kept[2]
    out = {}
    for op in _PROGRAM_OPS:
        # (an op whose plan depends on ranks runs low on some: never quiet, it acts)
        d = frame._decide((op, "float32", "float32"), None)
        acts = d.needs_action or (d.run_dtype is not None and d.run_dtype == d.low_dtype)
        if not acts and (not d.lacks_kernel or _notices.noted(op, "CPU", d.low_dtype)):
            out[op] = d
    if len(_quiet) > 256:
        _quiet.clear()
    _quiet[key] = (frame.policy, frame.device, out)
    return out


_quiet: dict = {}  # (id(policy), id(device), warnings) -> (policy, device, quiet ops)


def _close_in_program(frame: Frame, frames: list) -> None:
    """Write the legacy-program ops ``frame`` saw appended (a region with mixed precision
    off leaves them float32); the enclosing region (in the same block, or around the
    control-flow op whose sub-block this is) leaves them as written."""
    block, start, done = frame.legacy
    frame.legacy = None
    if frame.on:  # an O0 region writes nothing, but its ops are its own (claimed below)
        legacy.rewrite(frame, block, start, done)
    # (the region around it: in the same block, or in the block holding its sub-block)
    outer = [f for f in frames if f is not frame and f.legacy is not None]
    if outer:
        outer[-1].legacy[2].update(legacy.claimed(block, start))
    elif _regions.written is not None:
        _regions.written.update(legacy.claimed(block, start))


_NAMES: dict[Any, Optional[str]] = {}


def _name(dtype: Any) -> Optional[str]:
    """The core's name of a Paddle dtype (None: not floating, never cast)."""
    if not _NAMES:
        import paddle
        for n in ("float16", "bfloat16", "float32", "float64"):
            _NAMES[getattr(paddle, n)] = n
            _NAMES[n] = n  # a legacy program's var, read by name (legacy.rewrite)
    return _NAMES.get(dtype)


def _round(x, low: str):
    cast = kernels.rounding_cast()
    return cast(cast(x, low), "float32")


def _in_program(x) -> bool:
    """``x`` is a value of a PIR program being built (``to_static``), whose executor picks a
    bf16 op's oneDNN kernel itself (Paddle 3.3.1): its low route is the op itself."""
    return _Tensor[1] is not None and isinstance(x, _Tensor[1])


def _wants_grad(a, ours: bool):
    """``a`` (a copy, unless it is a cast ``_run`` made) with ``stop_gradient`` off."""
    if not ours:
        from paddle import _C_ops
        a = _C_ops.assign(a)
    a.stop_gradient = False
    return a


def _run(d: OpDecision, inputs: tuple, plain: Callable, low: Callable):
    """``inputs`` through the op as ``d`` says: its low route, emulated, or plain."""
    cast = kernels.rounding_cast()
    low_dtype = d.low_dtype

    def cast_to(x, c):  # once per tensor and step, however many ops read it (stepcasts)
        return cast_once(x, ("cast", c), lambda t: cast(t, c))
    if d.emulated:  # an input stored low (an O2 weight) is only widened: exact
        args = tuple(cast_once(x, ("round", low_dtype), lambda t: _round(t, low_dtype))
                     if r else cast_to(x, c) if c else x
                     for x, r, c in zip(inputs, d.round_inputs, d.casts))
        out = plain(*args)
        return _round(out, low_dtype) if d.round_outputs else out
    if d.run_dtype is not None and d.run_dtype == d.low_dtype:
        args = tuple(cast_to(x, c) if c else x for x, c in zip(inputs, d.casts))
        if _in_program(args[0]) and any(not a.stop_gradient for a in args):
            # a PIR program runs the op itself, and oneDNN's bf16 matmul_v2_grad crashes
            # (SIGSEGV) if one operand wants no gradient: every operand then wants one (a
            # copy of a caller's own value). Eager mode's route never runs that kernel
            # (``kernels.matmul_v2``)
            args = tuple(a if not a.stop_gradient else _wants_grad(a, c is not None)
                         for a, c in zip(args, d.casts))
        return cast(low(*args), "float32")
    if d.needs_action:
        inputs = tuple(cast_to(x, c) if c else x for x, c in zip(inputs, d.casts))
    return plain(*inputs)


_MISSING = object()


def _planned(frame: Optional[Frame], op: str, x, y) -> Any:
    """The plan of ``op`` on ``x``, ``y`` (eager tensors, or values of a PIR program being
    built) in ``frame`` (None: run it as it is; ``_MISSING``: not ours to plan: no region,
    mixed precision off, SOT simulating, other values).

    Reading a Paddle dtype and hashing it costs about 1 us each (a pybind enum), more than a
    small op; so the region first looks the call up by its inputs' element sizes
    (``Frame.fast``), kept only for 4- and 8-byte floating inputs, where the size names one
    floating dtype. An integer input of the same size gets the same answer: run as it is
    (AMP never casts integers), or, for a plan that acts, the real dtypes are checked first."""
    if frame is None or _in_sot[0]() or not frame.on or not (
            isinstance(x, _Tensor[0]) and isinstance(y, _Tensor[0])):
        return _MISSING
    if frame.measured:
        return _by_shape(frame, (op, x.dtype, y.dtype), x, y)
    if frame.log is not None or frame.layered:
        return _noted(frame, (op, x.dtype, y.dtype), x, y)
    sizes = (op, x.element_size(), y.element_size())
    fast = frame.fast
    if sizes in fast:
        d, decision = fast[sizes]  # (the plan, the decision it came from: ``ran``)
        if d is BY_RANK:
            return _by_rank(frame, (op, x.dtype, y.dtype), x, y)
        if d is None or d.input_dtypes == (_name(x.dtype), _name(y.dtype)):
            frame.note(op, decision)
            return d
    key = (op, x.dtype, y.dtype)
    d = frame.plans[key] if key in frame.plans else frame.plan(key)
    decision = None if d is BY_RANK else frame.decisions[key]
    if sizes[1] in (4, 8) and sizes[2] in (4, 8) and _name(key[1]) and _name(key[2]):
        fast[sizes] = (d, decision)
    if d is BY_RANK:
        return _by_rank(frame, key, x, y)
    frame.note(op, decision)
    return d


def _noted(frame: Frame, key: tuple, x, y) -> Any:
    """The plan of ``key`` run by the Layer running now (its path, where the policy has
    layer rules), its decision appended to ``frame.log`` (a report's region, a doctor's)."""
    instance = layer_paths.current() if frame.layered else None
    full = key
    slot = _slot(key, instance)
    d = frame.plans[slot] if slot in frame.plans else frame.plan(key, None, instance)
    if d is BY_RANK:
        full = key + (x.ndim, y.ndim)
        slot = _slot(full, instance)
        d = frame.plans[slot] if slot in frame.plans else \
            frame.plan(key, full[-2:], instance)
    decision = frame.decisions[_slot(full, instance)]
    frame.note(key[0], decision)
    if frame.log is not None:
        frame.log.append(decision)
    return d


def _by_shape(frame: Frame, key: tuple, x, y) -> Any:
    """The plan of ``key`` for inputs of ``x``'s and ``y``'s shape class, under measured speed
    (an op is lowered only where it was measured faster at its shape class: decided once
    per shape class in a region, and per Layer path where the policy has layer rules), its
    decision logged in a report's region."""
    instance = layer_paths.current() if frame.layered else None
    shape = ShapeClass.of([x.shape, y.shape], _result_rank(len(x.shape), len(y.shape)))
    slot = _slot(key + (shape,), instance)
    d = frame.plans[slot] if slot in frame.plans else frame.plan(key, None, instance, shape)
    decision = frame.decisions[slot]
    frame.note(key[0], decision)
    if frame.log is not None:
        frame.log.append(decision)
    return d


def _by_rank(frame: Frame, key: tuple, x, y) -> Any:
    """The plan of ``key`` for inputs of ``x``'s and ``y``'s ranks (``Frame.plan``)."""
    full = key + (x.ndim, y.ndim)
    d = frame.plans[full] if full in frame.plans else frame.plan(key, full[-2:])
    frame.note(key[0], frame.decisions[full])
    return d


# The fast path
# -------------
# A region knows at entry which wrapped ops run as they are on float32 inputs (``quiet``: the
# op is kept float32, or the region lowers nothing). Such a call costs Paddle's own op and
# little more: each wrapper opens with a test of a few hundred nanoseconds, no dtype read
# (about 1 us each in Paddle 2.6.2), no region lookup, no record:
#
#     if _quick_gemm and <x and y are eager tensors> and <their element sizes sum to 8>:
#         return <Paddle's op>(x, y, ...)
#
# Element sizes 4 and 4 are the only pair of 1, 2, 4, 8 that sums to 8: two float32 tensors
# (an int32 one gets the same answer, run as it is: AMP never casts integers).
#
# ``_quick_gemm`` (``matmul_v2``'s wrappers: ``matmul``, ``linear``, ``x @ y``) and
# ``_quick_conv`` (``conv2d``) are module flags, open only while handing the call on
# unrecorded loses nothing: in every thread with a region open, the innermost region has the
# op quiet and has recorded that quiet decision as the op's latest (``ran``) already. A
# thread without a region runs the op as it is anyway. So the flags are kept by the events
# that change that, under ``_lock``:
#
# - a region opens (``push``): the thread's innermost region has recorded nothing: closed;
# - a region closes (``_remove``): an outer region is innermost again: ``_reopen`` checks;
# - a region records another decision for the op (``Frame.note``: a bfloat16 input, a
#   float64 one): closed;
# - a float32 call the region keeps as it is, with the flag closed (``_quiet_here``): the
#   region records its quiet decision and ``_reopen`` checks.
#
# Everything else (the flag closed, another input, keywords) takes the planned path.
# ``ran`` is the region's record, to read: a record the caller deletes while the flag is
# open is not written again by the calls that follow.

_quick_gemm = False  # matmul_v2's fast path is open (see above)
_quick_conv = False  # conv2d's


def _set_quick(op: str, on: bool) -> None:
    """Open or close ``op``'s fast path (the caller holds ``_lock``)."""
    global _quick_gemm, _quick_conv
    if op == "matmul_v2":
        _quick_gemm = on
    else:
        _quick_conv = on


def _reopen(op: str) -> None:
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
    _set_quick(op, on)


def _quiet_here(op: str, x, y) -> bool:
    """Whether ``op`` on ``x``, ``y`` runs as it is in this thread's innermost region: ``op``
    quiet there, and ``x``, ``y`` float32 eager tensors (the fast path's test; int32 runs as
    it is alike). If so, the region records its quiet decision for ``op``, once: the first
    such call since the region opened or recorded another decision for it; then ``op``'s
    fast path opens if every thread's innermost region agrees (``_reopen``)."""
    frames = _regions.frames
    if not frames:
        return False
    frame = frames[-1]
    # (``in`` and ``[]``, not ``dict.get``: Paddle 2.6.2's SOT translator, simulating this
    # under ``to_static``, fails on ``get`` of a missing key)
    if op not in frame.quiet or not (isinstance(x, _EAGER) and isinstance(y, _EAGER) and
                                     x.element_size() + y.element_size() == 8):
        return False
    d = frame.quiet[op]
    if op not in frame.ran or frame.ran[op] is not d:
        frame.ran[op] = d
        with _lock:
            _reopen(op)
    return True


# The wrappers take Paddle 3's keyword forms as named parameters, not ``**kw``: CPython 3.11
# calls a function with plain parameters only (no ``*args``, ``**kw``, keyword-only) through
# a specialized path, about 100 ns faster a call here.

def _matmul(x=_MISSING, y=_MISSING, transpose_x=False, transpose_y=False, name=None,
            out=None, input=None, other=None):  # noqa: A002  (Paddle's keyword names)
    """``_C_ops.matmul`` in a region: Paddle's positional form (``x, y, transpose_x,
    transpose_y``, and ``name``), and Paddle 3.3.1's keywords (``input``/``other``, the aliases
    of ``x``/``y``; ``out=``): the fast path, else planned (``_matmul_planned``)."""
    if _quick_gemm and isinstance(x, _EAGER) and isinstance(y, _EAGER) and \
            x.element_size() + y.element_size() == 8 and \
            out is None and input is None and other is None:
        return _originals["matmul"](x, y, transpose_x, transpose_y)
    if out is not None or input is not None or other is not None or x is _MISSING or \
            y is _MISSING:
        return _matmul_kw(x, y, transpose_x, transpose_y, out, input, other)
    return _matmul_planned(x, y, transpose_x, transpose_y)


# (each wrapper's planned path is a function of its own: a wrapper whose body makes a
# closure, such as ``plain`` below, pays for its cells on every call, fast path too)

def _matmul_planned(x, y, transpose_x: bool, transpose_y: bool):
    orig = _originals["matmul"]
    if _quiet_here("matmul_v2", x, y):
        return orig(x, y, transpose_x, transpose_y)
    frame = current()
    d = _planned(frame, "matmul_v2", x, y)
    if d is None or d is _MISSING:
        out = orig(x, y, transpose_x, transpose_y)
    else:
        plain = lambda a, b: orig(a, b, transpose_x, transpose_y)  # noqa: E731
        out = _run(d, (x, y), plain, plain if _in_program(x) else
                   lambda a, b: kernels.matmul_v2(a, b, transpose_x, transpose_y))
    if frame is not None and frame.watched is not None:
        _watched(frame, d, (x, y), out)
    return out


def _linear(x=_MISSING, weight=_MISSING, bias=None, name=None,
            input=None):  # noqa: A002  (Paddle's keyword name)
    """``F.linear`` in eager mode (``_C_ops.linear(x, weight, bias)``; ``input`` the alias of
    ``x``): its GEMM decided as ``matmul_v2``, its bias add as the native's ``add``
    (promotion: float32 with a float32 bias)."""
    if _quick_gemm and isinstance(x, _EAGER) and isinstance(weight, _EAGER) and \
            x.element_size() + weight.element_size() == 8 and input is None:
        return _originals["linear"](x, weight, bias)
    if input is not None or x is _MISSING or weight is _MISSING:
        kw = {} if input is None else {"input": input}
        x, weight = _keywords("linear", (x, weight), (("x", "input"), ("weight",)),
                              (_MISSING, _MISSING), kw)
    return _linear_planned(x, weight, bias)


def _linear_planned(x, weight, bias):
    orig = _originals["linear"]
    if _quiet_here("matmul_v2", x, weight):
        return orig(x, weight, bias)
    frame = current()
    d = _planned(frame, "matmul_v2", x, weight)
    if d is None or d is _MISSING:
        out = orig(x, weight, bias)
    else:
        mm = _originals["matmul"]
        plain = lambda a, b: mm(a, b, False, False)  # noqa: E731
        out = _run(d, (x, weight), plain, plain if _in_program(x) else
                   lambda a, b: kernels.matmul_v2(a, b, False, False))
        out = out if bias is None else _originals["add"](out, bias)
    if frame is not None and frame.watched is not None:
        _watched(frame, d, (x, weight), out)
    return out


def _conv2d(x, weight, *args, **kw):
    """``conv2d`` (``nn.Conv2D``, ``F.conv2d``): decided, emulated when asked, on oneDNN in
    bf16 where its route's probe ran (``kernels.conv2d``: in Paddle 2.6.2 and 3.3.1 it does
    not, so a bf16 plan falls back to float32, and the warning says why)."""
    if _quick_conv and isinstance(x, _EAGER) and isinstance(weight, _EAGER) and \
            x.element_size() + weight.element_size() == 8:
        return _originals["conv2d"](x, weight, *args, **kw)
    return _conv2d_planned(x, weight, args, kw)


def _conv2d_planned(x, weight, args: tuple, kw: dict):
    orig = _originals["conv2d"]
    if _quiet_here("conv2d", x, weight):
        return orig(x, weight, *args, **kw)
    frame = current()
    d = _planned(frame, "conv2d", x, weight)
    if d is None or d is _MISSING:
        out = orig(x, weight, *args, **kw)
    else:
        plain = lambda a, b: orig(a, b, *args, **kw)  # noqa: E731
        out = _run(d, (x, weight), plain, plain if _in_program(x) else
                   lambda a, b: kernels.conv2d(a, b, *args, **kw))
    if frame is not None and frame.watched is not None:
        _watched(frame, d, (x, weight), out)
    return out


def _watched(frame: Frame, d: Any, inputs: tuple, out: Any) -> None:
    """A wrapped call in a region that keeps them (``Frame.watched``): its decision (the one
    ``_noted`` logged; None where the region planned nothing: mixed precision off, not
    eager tensors), inputs, result, and the path of the Layer running it (tracked where
    ``layer_paths`` is entered)."""
    decision = frame.log[-1] if d is not _MISSING and frame.log else None
    frame.watched.append((decision, inputs, out, layer_paths.current()))


def _keywords(op: str, given: tuple, names: tuple, defaults: tuple, kw: dict) -> tuple:
    """``given`` (the positional parameters, ``_MISSING`` or their default where not passed)
    with the keywords of ``kw`` mapped onto them as Paddle's signature does (each parameter
    by its name or alias, ``names``); ``name=`` dropped (a label only in eager mode); the
    keywords left stay in ``kw``. A parameter passed twice, or a required one missing, is
    the TypeError Python gives."""
    kw.pop("name", None)
    out = list(given)
    for i, aliases in enumerate(names):
        for alias in aliases:
            if alias in kw:
                if out[i] is not defaults[i]:
                    raise TypeError(f"{op}() got multiple values for argument {aliases[0]!r}")
                out[i] = kw.pop(alias)
        if out[i] is _MISSING:
            raise TypeError(f"{op}() missing required argument {aliases[0]!r}")
    return tuple(out)


def _matmul_kw(x, y, transpose_x, transpose_y, out, input, other):  # noqa: A002
    """``_C_ops.matmul`` called with Paddle 3.3.1's keywords (``paddle.matmul(x, y,
    transpose_x=False, transpose_y=False, name=None, *, out=None)``, ``input``/``other`` the
    aliases of ``x``/``y``), or without ``x`` or ``y``: the call planned as its positional
    form; ``out=`` receives the result as Paddle's does."""
    kw = {k: v for k, v in (("input", input), ("other", other)) if v is not None}
    x, y = _keywords("matmul", (x, y), (("x", "input"), ("y", "other")),
                     (_MISSING, _MISSING), kw)
    result = _matmul(x, y, transpose_x, transpose_y)
    if out is None:
        return result
    import paddle
    paddle.assign(result, output=out)
    return out


def _tensor_matmul(self, other):
    """``Tensor.__matmul__`` (``x @ w``) while the wrappers are installed: decided as
    ``paddle.matmul`` (Paddle's native AMP and a program lower it alike), with its fast
    path; parked outside every region (``_parked_call``)."""
    if _quick_gemm and isinstance(other, _EAGER) and \
            self.element_size() + other.element_size() == 8:
        return _originals["matmul"](self, other, False, False)
    if not _open[0]:
        return _parked_call("__matmul__", self, other)
    if isinstance(other, _EAGER):
        return _matmul(self, other)
    return _originals["__matmul__"](self, other)


def _tensor_rmatmul(self, other):
    """``Tensor.__rmatmul__`` (``other @ self``), as ``_tensor_matmul``."""
    if not _open[0]:
        return _parked_call("__rmatmul__", self, other)
    if isinstance(other, _EAGER):
        return _matmul(other, self)
    return _originals["__rmatmul__"](self, other)


def _parked_call(name: str, tensor, other):
    """A call of the Tensor operator ``name`` while no region decides (the wrappers parked:
    ``_uninstall``): Paddle's operators are put back (``_unpark``), and this call is
    Paddle's."""
    original = _originals[name]
    if not _in_sot[0]():  # (not while to_static's translator simulates this code)
        _unpark()
    return original(tensor, other)


# the eager Tensor's operators routed through the matmul wrapper while it is installed
_OPERATORS = {"__matmul__": _tensor_matmul, "__rmatmul__": _tensor_rmatmul}


_WRAPPERS = {"matmul": _matmul, "linear": _linear, "conv2d": _conv2d}
# the program ops the wrappers plan: the only readers an O2 parameter stored low may have
PLANNED_OPS = frozenset({"matmul_v2", "conv2d"})


_EAGER: Any = ()  # the eager Tensor class (set at the first install; () matches nothing)

# [(the classes a wrapper plans for: eager Tensor, PIR Value), PIR Value or None]: set at
# the first install
_Tensor: list = []
# SOT's in_sot(): True while to_static's bytecode translator simulates the wrapper (which
# then passes the op through, as the AST translator's program values do)
_in_sot: list = [lambda: False]


# (owner, name, wrapper): every entry point the wrappers go in, found at the first install
# (``paddle._C_ops``'s GEMM and convolution, the eager Tensor's ``@``; Paddle 2.6.2 has no
# ``__rmatmul__``): installing is a loop over it, each region that decides pays it twice.
#
# The Tensor's operators are parked, not removed, when the last region closes: setting an
# attribute of the eager Tensor class (as putting Paddle's ``__matmul__`` back does) makes
# CPython drop what it has cached of every Tensor attribute lookup, and refilling that costs a
# 4-Linear MLP's forward about 5-7 us, twice a step where a training loop enters a region
# every step. A parked operator puts Paddle's back at its first call outside every region
# (``_parked_call``); the next region finds its wrapper still there and sets nothing.
_SITES: list = []
_parked: set = set()  # the names of the operators the last region left wrapped (parked)


def _find_sites() -> None:
    global _EAGER
    from paddle import _C_ops
    from paddle.base import core
    _EAGER = core.eager.Tensor
    value = getattr(getattr(__import__("paddle"), "pir", None), "Value", None)
    value = value if isinstance(value, type) else None
    _Tensor.append((core.eager.Tensor,) + ((value,) if value is not None else ()))
    _Tensor.append(value)
    try:
        from paddle.jit.sot.psdb import in_sot
        _in_sot[0] = in_sot
    except ImportError:  # a Paddle without SOT
        pass
    _originals.setdefault("add", getattr(_C_ops, "add"))
    _SITES.extend((_C_ops, name, wrapper) for name, wrapper in _WRAPPERS.items())
    _SITES.extend((_EAGER, name, wrapper) for name, wrapper in _OPERATORS.items()
                  if getattr(_EAGER, name, None) is not None)


def _install() -> None:
    if not _SITES:
        _find_sites()
    for owner, name, wrapper in _SITES:
        _wrap(owner, name, wrapper)


def _wrap(owner: Any, name: str, wrapper: Callable) -> None:
    """Put ``wrapper`` in ``owner.name``, calling what is there now (Paddle's op, or a patch
    another tool made outside a region), unless what is there is a patch made over our
    wrapper while a region was open (``_over_ours``): that one calls ours already, so it
    stays, and is never taken for Paddle's op (the two would call each other for good)."""
    current = getattr(owner, name)
    if name in _parked:  # our wrapper was left here (``_uninstall``)
        _parked.discard(name)
        if current is not wrapper:  # a patch made over it since: it calls ours
            _over_ours.setdefault(name, []).append(current)
            return
    if current is wrapper:
        return
    over = _over_ours.get(name)
    if over and any(current is p for p in over):
        return
    _originals[name] = current
    setattr(owner, name, wrapper)


def _unwrap(owner: Any, name: str, wrapper: Callable) -> None:
    """Put back what ``_wrap`` found, if ``wrapper`` is still there; a patch another tool made
    over it since stays, remembered as one that calls ours (``_wrap``)."""
    current = getattr(owner, name, None)
    if current is wrapper:
        if name in _originals:
            setattr(owner, name, _originals[name])
    elif current is not None and current is not _originals.get(name):
        _over_ours.setdefault(name, []).append(current)


_over_ours: dict = {}  # name -> patches found over our wrapper at uninstall (they call it)


def _uninstall() -> None:
    """The last region that decides has closed (the caller holds ``_lock``): Paddle's op
    functions go back; the Tensor's operators stay, parked (``_SITES``). Only our own wrapper
    goes: a patch another tool made since stays."""
    for owner, name, wrapper in _SITES:
        if owner is not _EAGER:
            _unwrap(owner, name, wrapper)
        else:
            _parked.add(name)


def _unpark() -> None:
    """Put Paddle's Tensor operators back, if still no region decides."""
    with _lock:
        if not _open[0]:
            for owner, name, wrapper in _SITES:
                if owner is _EAGER and name in _parked:
                    _parked.discard(name)
                    _unwrap(owner, name, wrapper)
