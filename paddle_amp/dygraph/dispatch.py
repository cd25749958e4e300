"""The per-op cast in eager mode, its region lifecycle: ``push`` opens an ``auto_cast``
region and ``pop`` closes it; while any region that decides is open, the Python entry
points of the ops AMP lowers are wrapped (``wrappers``, as ``mxnet_amp.patching`` wraps
MXNet's ops); the regions' state is ``frames``.

Paddle's eager AMP casts inside its C++ op functions and only for GPU, XPU and custom
places: on a CPU it does nothing, even with the tracer's AMP state set by hand. So the
cast happens one level up, in ``paddle._C_ops``, the module every Python path into an op
goes through (``paddle.matmul``, ``Tensor.matmul``, ``paddle.nn.functional.linear``,
``conv2d``):

- a call on values of a PIR program being built (``to_static``, Paddle 3) is planned
  alike; its low route is the op itself on bf16 values (the PIR executor picks oneDNN's
  kernel), so the decisions are built into the program; a legacy-IR program's ops do not
  come through the wrappers: a region there writes them when it closes (``legacy``); a call
  in SOT's simulation passes through untouched;
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
``wrappers._SITES``). A region works out at entry which wrapped ops run as they are on
float32 inputs (``quiet``): such a call is handed on without planning, and once the region
has recorded it, without even a record (the wrappers' fast path: ``frames``, "The fast
path").
"""
from __future__ import annotations

import logging
from typing import Optional

from amp_adapters import Policy

from . import frames, kernels, layer_paths, legacy, speed, stepcasts
from .frames import Frame, _lock, _open, _owners, _regions, current, reopen, set_quick
from .wrappers import _install, _uninstall

log = logging.getLogger("paddle_amp.dygraph")
_sharing = [0]  # regions open in all threads that keep stepcasts installed (Frame.shares)

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
        if block is not None:  # a backward appended inside it is built from written ops
            if not _in_program:
                legacy.hook_backward(_flush_in_program)
            _in_program.add(id(frame))
        frames.append(frame)
        # this thread's innermost region is new: it has recorded nothing (``reopen``)
        set_quick("matmul_v2", False)
        set_quick("conv2d", False)
    if frame.layered:  # inside a forward: the Layer calls running are the model's (adopt)
        _track_layers(frame, frames)
    if enabled and log is None:  # a cast report's region is no training's dtype
        _regions.last_dtype = policy.dtype
    return frame


def _track_layers(frame: Frame, frames: list) -> None:
    """Follow the Layer calls for ``frame``'s layer rules (``layer_paths``); if that fails,
    the region is closed again before the error goes on: no wrapper stays installed."""
    try:
        layer_paths.enter()
    except BaseException:
        frame.layered = False  # (entered nothing: nothing to leave)
        _remove(frame, frames)
        raise
    try:
        frame.adopted = layer_paths.adopt()
    except BaseException:
        _remove(frame, frames)
        raise


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
        if id(frame) in _in_program:
            _in_program.discard(id(frame))
            if not _in_program:
                legacy.unhook_backward()
        if frames[-1] is frame:
            frames.pop()
        else:
            frames[:] = [f for f in frames if f is not frame]
        for op in _PROGRAM_OPS:  # an outer region is innermost again: it may have recorded
            if _owners:
                reopen(op)
            else:
                set_quick(op, False)
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
_in_program: set = set()  # ids of the regions open in a legacy program (``hook_backward``)


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
    # (a warning since: plan again)
    key = (id(frame.policy), id(frame.device), len(frames._notices))
    kept = _quiet.get(key)
    if kept is not None and kept[0] is frame.policy and kept[1] is frame.device:
        return kept[2]
    out = {}
    for op in _PROGRAM_OPS:
        # (an op whose plan depends on ranks runs low on some: never quiet, it acts)
        d = frame._decide((op, "float32", "float32"), None)
        acts = d.needs_action or (d.run_dtype is not None and d.run_dtype == d.low_dtype)
        if not acts and (not d.lacks_kernel or frames._notices.noted(op, "CPU", d.low_dtype)):
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


def _flush_in_program() -> None:
    """A backward is appended while this thread's regions are open in a legacy program
    (``loss.backward()`` inside ``auto_cast``): each writes the ops appended in it so far,
    innermost first (as they would close), and starts again past them, so the gradient ops
    are built from the forward eager mode runs (bf16 GEMMs on oneDNN), not from float32
    ops written only after them."""
    frames = _regions.frames
    open_ = [(f, f.legacy[0]) for f in frames if f.legacy is not None]
    for frame, _ in reversed(open_):  # (each claimed by the next one out, still open)
        _close_in_program(frame, frames)
    for frame, block in open_:
        frame.legacy = (block, len(block.ops), set())
