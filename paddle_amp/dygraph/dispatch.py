"""The per-op cast in eager mode: the Python entry points of the ops AMP lowers, wrapped
while an ``auto_cast`` region is active (as ``mxnet_amp.patching`` wraps MXNet's ops).

Paddle's eager AMP casts inside its C++ op functions and only for GPU, XPU and custom
places: on a CPU it does nothing, even with the tracer's AMP state set by hand. So the
cast happens one level up, in ``paddle._C_ops``, the module every Python path into an op
goes through (``paddle.matmul``, ``Tensor.matmul``, ``paddle.nn.functional.linear``,
``conv2d``; the wrapped ops are ``_WRAPPERS``):

- a call on values of a PIR program being built (``to_static``, Paddle 3) is planned
  alike; its low route is the op itself on bf16 values (the PIR executor picks oneDNN's
  kernel), so the decisions are built into the program; a call on anything else (a
  legacy-IR program, SOT's simulation) passes through untouched;
- a tensor is cast or rounded once per step however many ops read it (``stepcasts``: a
  Linear applied N times casts its weight once);
- otherwise the planner decides (``amp_adapters.plan_op`` with the active policy and the
  device truth ``kernels.profile``), once per (op, input dtypes) in a region; an op planned
  in the low dtype with a kernel here runs on its oneDNN route (``kernels.ROUTES``) and
  hands back float32 (exact: a widening cast); an emulated op computes in float32 on
  values rounded through the low dtype, and rounds its result; an op that falls back
  runs as it is (logged once).

Results come back float32 because the ops after a lowered one have no plain bf16 kernel
on a CPU and the eager dispatcher cannot reach oneDNN's: a bf16 tensor handed to the next
op would crash it. The low op's numerics are kept (its result carries bf16 rounding); the
ops after it compute in float32, as Paddle's native promotion does for a Linear's bias add.
The wrappers are installed when the first region opens and removed when the last closes:
outside ``auto_cast`` nothing is wrapped and nothing costs.
"""
from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from amp_adapters import OpDecision, Policy, plan_op
from amp_adapters.device import DeviceProfile, ShapeClass

from . import kernels, stepcasts
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
    fast: dict = field(default_factory=dict)  # (op, element sizes) -> plan: _planned
    on: bool = False  # policy.enabled, a plain field (to_static's SOT reads no property)

    def __post_init__(self) -> None:
        self.on = self.policy.enabled

    def plan(self, key: tuple, ranks: Optional[tuple] = None) -> Any:
        """Decide ``key`` = (program op, *input dtypes) once in this region (with ``ranks``,
        its inputs' ranks, for an op the device refuses by shape): the decision, None when
        the op has nothing to do (no cast, no rounding, not run low), or ``BY_RANK`` when
        the decision depends on the inputs' ranks (``DeviceProfile.refusal``: a broadcast
        operand's gradient on a reference implementation); then ask again with them."""
        full = key if ranks is None else key + ranks
        op, dtypes = key[0], key[1:]
        if ranks is None and self.device is not None and op in \
                self.device.slow_broadcast_grads:
            free = self._decide(key, None)
            if free.run_dtype is not None and free.run_dtype == free.low_dtype:
                self.plans[key] = BY_RANK
                return BY_RANK
        d = self._decide(full, _shape(ranks))
        self.ran[op] = self.decisions[full] = d
        if all(t is None for t in d.input_dtypes):
            # no floating input: nothing to cast or round (plan_op still plans a lower op's
            # emulation for it: rounding an integer result through float16 would be wrong)
            self.plans[full] = None
            return None
        if d.lacks_kernel and (op, d.low_dtype) not in _warned:
            _warned.add((op, d.low_dtype))
            log.warning("paddle_amp.dygraph: %s runs in float32: %s", op, d.reason)
        acts = d.needs_action or (d.run_dtype is not None and d.run_dtype == d.low_dtype)
        self.plans[full] = d if acts else None
        return self.plans[full]

    def _decide(self, full: tuple, shape) -> OpDecision:
        """``plan_op`` for ``full`` (op, dtypes..., [ranks...]), kept across regions."""
        cached = _decided.get((self.policy, self.device, full))
        if cached is not None:
            return cached
        op, dtypes = full[0], full[1:3] if shape is not None else full[1:]
        d = plan_op(self.policy, "paddle", op, tuple(_name(t) for t in dtypes),
                    device=self.device, shape=shape)
        if len(_decided) > 4096:
            _decided.clear()
        _decided[(self.policy, self.device, full)] = d
        return d


BY_RANK = object()  # a plan that depends on the inputs' ranks (Frame.plan)


def _shape(ranks: Optional[tuple]):
    """The shape class of a GEMM's operands of ``ranks`` (dimensions unknown: the broadcast
    rule reads ranks only)."""
    if ranks is None:
        return None
    a, b = ranks
    result = max(a, b) if min(a, b) >= 2 else max(a, b) - 1
    return ShapeClass(tuple((None,) * r for r in ranks), result)


class _Regions(threading.local):
    """The regions open in this thread, innermost last: like Paddle's own tracer state, a
    region opened in one thread (the training loop) does not reach another (a reader)."""

    frames: list = []  # noqa: RUF012  (threading.local: each thread starts from this)

    def __init__(self) -> None:
        self.frames = []


_regions = _Regions()
_open = [0]  # regions open in all threads: the wrappers stay installed while any is
_lock = threading.Lock()
_decided: dict = {}  # (policy, device, key) -> OpDecision: a region re-entered plans nothing
_warned: set = set()
_originals: dict[str, Callable] = {}
_last_dtype: list[str] = ["float16"]  # paddle.amp's amp_global_state().amp_dtype: last set


def current() -> Optional[Frame]:
    """The innermost active region, or None."""
    frames = _regions.frames
    return frames[-1] if frames else None


def last_dtype() -> str:
    """The dtype of the last region entered (the native GradScaler reads the same)."""
    return _last_dtype[0]


def push(policy: Policy, log: Optional[list] = None,
         training: Optional[bool] = None) -> Frame:
    """Open a region under ``policy`` (checked before: nothing here can fail on user input);
    ``log``: a list to append each call's decision to, in call order (``cast_report``).
    ``training`` (None: whether gradients are recorded here, ``paddle.is_grad_enabled``)
    picks the device truth for training (gradient kernels and their refusals too) or
    inference (``DeviceProfile.for_inference``: a broadcast GEMM's slow gradient is no
    reason to keep an eval forward float32)."""
    device = kernels.profile(policy.dtype) if policy.enabled else None
    if device is not None:
        import paddle
        if not (paddle.is_grad_enabled() if training is None else training):
            device = kernels.inference_profile(policy.dtype)
    frame = Frame(policy, device, log=log)
    with _lock:
        if not _open[0]:
            _install()
        _open[0] += 1
    _regions.frames.append(frame)
    if policy.enabled and log is None:  # a cast report's region is no training's dtype
        _last_dtype[0] = policy.dtype
    return frame


def pop(frame: Frame) -> None:
    """Close ``frame`` (the innermost region of this thread, or another one of it); the last
    region out, of all threads, removes the wrappers."""
    frames = _regions.frames
    if frames and frames[-1] is frame:
        frames.pop()
    elif any(f is frame for f in frames):
        frames[:] = [f for f in frames if f is not frame]
    else:
        return  # not open in this thread (closed already)
    with _lock:
        _open[0] -= 1
        if not _open[0]:
            _uninstall()


_NAMES: dict[Any, Optional[str]] = {}


def _name(dtype: Any) -> Optional[str]:
    """The core's name of a Paddle dtype (None: not floating, never cast)."""
    if not _NAMES:
        import paddle
        for n in ("float16", "bfloat16", "float32", "float64"):
            _NAMES[getattr(paddle, n)] = n
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
    if d.emulated:
        args = tuple(cast_once(x, ("round", low_dtype), lambda t: _round(t, low_dtype))
                     if r else x for x, r in zip(inputs, d.round_inputs))
        out = plain(*args)
        return _round(out, low_dtype) if d.round_outputs else out
    if d.run_dtype is not None and d.run_dtype == d.low_dtype:
        args = tuple(cast_to(x, c) if c else x for x, c in zip(inputs, d.casts))
        if any(not a.stop_gradient for a in args):
            # oneDNN's bf16 matmul_v2_grad crashes (SIGSEGV) if one operand wants no
            # gradient: every operand then wants one (a copy of a caller's own tensor)
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
    if frame.log is not None:
        return _noted(frame, (op, x.dtype, y.dtype), x, y)
    sizes = (op, x.element_size(), y.element_size())
    fast = frame.fast
    if sizes in fast:
        d = fast[sizes]
        if d is BY_RANK:
            return _by_rank(frame, (op, x.dtype, y.dtype), x, y)
        if d is None or d.input_dtypes == (_name(x.dtype), _name(y.dtype)):
            return d
    key = (op, x.dtype, y.dtype)
    d = frame.plans[key] if key in frame.plans else frame.plan(key)
    if sizes[1] in (4, 8) and sizes[2] in (4, 8) and _name(key[1]) and _name(key[2]):
        fast[sizes] = d
    return _by_rank(frame, key, x, y) if d is BY_RANK else d


def _noted(frame: Frame, key: tuple, x, y) -> Any:
    """The plan of ``key``, its decision appended to ``frame.log`` (a report's region)."""
    d, full = frame.plan(key), key
    if d is BY_RANK:
        full = key + (x.ndim, y.ndim)
        d = frame.plan(key, full[-2:])
    frame.log.append(frame.decisions[full])
    return d


def _by_rank(frame: Frame, key: tuple, x, y) -> Any:
    """The plan of ``key`` for inputs of ``x``'s and ``y``'s ranks (``Frame.plan``)."""
    full = key + (x.ndim, y.ndim)
    return frame.plans[full] if full in frame.plans else frame.plan(key, full[-2:])


def _matmul(x, y, transpose_x=False, transpose_y=False, *rest, **kw):
    orig = _originals["matmul"]
    d = _planned(current(), "matmul_v2", x, y)
    if d is None or d is _MISSING or rest or kw:
        return orig(x, y, transpose_x, transpose_y, *rest, **kw)
    plain = lambda a, b: orig(a, b, transpose_x, transpose_y)  # noqa: E731
    return _run(d, (x, y), plain, plain if _in_program(x) else
                lambda a, b: kernels.matmul_v2(a, b, transpose_x, transpose_y))


def _linear(x, weight, bias=None, *rest, **kw):
    """``F.linear`` in eager mode: its GEMM decided as ``matmul_v2``, its bias add as the
    native's ``add`` (promotion: float32 with a float32 bias)."""
    orig = _originals["linear"]
    d = _planned(current(), "matmul_v2", x, weight)
    if d is None or d is _MISSING or rest or kw:
        return orig(x, weight, bias, *rest, **kw)
    mm = _originals["matmul"]
    plain = lambda a, b: mm(a, b, False, False)  # noqa: E731
    out = _run(d, (x, weight), plain, plain if _in_program(x) else
               lambda a, b: kernels.matmul_v2(a, b, False, False))
    return out if bias is None else _originals["add"](out, bias)


def _conv2d(x, weight, *args, **kw):
    """``conv2d`` (``nn.Conv2D``, ``F.conv2d``): decided, emulated when asked; it has no
    oneDNN route in eager mode (Paddle's oneDNN conv2d reads its filter from a program's
    context: "OneDnnContext does not have the input Filter", 2.6.2 and 3.3.1), so a bf16
    plan falls back to float32, and says so."""
    orig = _originals["conv2d"]
    d = _planned(current(), "conv2d", x, weight)
    if d is None or d is _MISSING:
        return orig(x, weight, *args, **kw)
    return _run(d, (x, weight), lambda a, b: orig(a, b, *args, **kw), None)


_WRAPPERS = {"matmul": _matmul, "linear": _linear, "conv2d": _conv2d}


# [(the classes a wrapper plans for: eager Tensor, PIR Value), PIR Value or None]: set at
# the first install
_Tensor: list = []
# SOT's in_sot(): True while to_static's bytecode translator simulates the wrapper (which
# then passes the op through, as the AST translator's program values do)
_in_sot: list = [lambda: False]


def _install() -> None:
    from paddle import _C_ops
    from paddle.base import core
    if not _Tensor:
        value = getattr(getattr(__import__("paddle"), "pir", None), "Value", None)
        value = value if isinstance(value, type) else None
        _Tensor.append((core.eager.Tensor,) + ((value,) if value is not None else ()))
        _Tensor.append(value)
        try:
            from paddle.jit.sot.psdb import in_sot
            _in_sot[0] = in_sot
        except ImportError:  # a Paddle without SOT
            pass
    for name, wrapper in _WRAPPERS.items():
        current = getattr(_C_ops, name)
        if current is not wrapper:  # what is there now: Paddle's, or another tool's patch
            _originals[name] = current
        setattr(_C_ops, name, wrapper)
    _originals.setdefault("add", getattr(_C_ops, "add"))
    stepcasts.install()


def _uninstall() -> None:
    from paddle import _C_ops
    for name, wrapper in _WRAPPERS.items():
        # only our own wrapper goes: a patch another tool made since stays
        if name in _originals and getattr(_C_ops, name) is wrapper:
            setattr(_C_ops, name, _originals[name])
    stepcasts.uninstall()
