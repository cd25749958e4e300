"""Measured speed on MXNet: one op in the low dtype, its casts included, against float32.

``MXNetSource`` is this runtime's ``amp_adapters.services.speed_source.SpeedSource`` (the book,
the cache, the measuring loop are the core's; the child, ``mxnet_amp.speed_child``, is this
runtime's); its timer, ``time_job`` (``measure(op, shape, training)`` on the job's device),
for an op the O1 lists lower (the GEMMs and convolutions, legacy and ``mx.np``/``mx.npx``)
it builds the op's call at the shape class's concrete shapes (``ShapeClass.concrete``:
an unknown dimension at ``UNKNOWN_DIM``) and times, with the core's ``speed_source.cost_of``:

- low: ``amp_cast`` of each floating input to the low dtype, the op, ``amp_cast`` of its
  output back to float32 (what the plan inserts around a lowered op);
- base: the op in float32 on the same shapes;

forward only for inference; for ``training`` forward and backward under
``autograd.record`` (``Cost.train``), with the forward ratio measured too. Each run ends
in one ``wait_to_read`` (a host sync, so a time is the work's). Our patched ops are
bypassed (``unpatched``). An op without a recipe here (or whose attributes cannot be
read back from operand shapes, such as ``einsum``'s subscripts) gives None (not
measurable: the kernel decision stands as without measuring). An op that raises while
being timed raises here; ``SpeedBook`` records that as "no kernel".

The attributes an op takes are rebuilt from its operand shapes (``num_hidden`` from a
FullyConnected weight, ``kernel``/``num_filter``/``num_group`` from a convolution's;
a GEMM's transposes from which dimensions agree, ``speed_source.gemm_transposes``); strides and
dilations are taken as 1
and padding as "same": a shape class is an estimate of cost, not a replay of the call.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Callable, Optional

import mxnet as mx
from mxnet import autograd
from mxnet import ndarray as nd

from amp_adapters import Policy
from amp_adapters.services import speed_source
from amp_adapters.rules.device import Cost, DeviceProfile, ShapeClass
from amp_adapters.services.speed_source import BUDGET_S, Job, gemm_transposes
from amp_adapters.services.speedbook import gpu_key, nvidia_gpu, warn_once

from amp_adapters.services.quiet import stderr_silenced

from ._mx import _ND_AMP_CAST, mx_dtype, unpatched
from .kernels import _drain, device_profile

Shapes = tuple[tuple[int, ...], ...]
Call = Callable[[list], object]  # the op on its inputs (legacy or numpy-flavoured arrays)

# MXNet 1.9.1 on CPU: the bfloat16 Deconvolution gradient ends the process (std::terminate,
# no exception to catch) at any realistic shape, though the kernel probe's 1x1 one passes
ABORTS_BF16_BACKWARD = frozenset({"Deconvolution", "_npx_deconvolution"})


def _fc(s: Shapes, np_flavour: bool) -> Optional[Call]:
    if len(s) < 2 or len(s[1]) != 2:
        return None
    data, weight = s[0], s[1]
    flat = math.prod(data[1:]) == weight[1]
    if not flat and data[-1] != weight[1]:
        return None
    kw = dict(num_hidden=weight[0], no_bias=len(s) < 3, flatten=flat)
    fn = mx.npx.fully_connected if np_flavour else nd.FullyConnected
    return lambda xs: fn(*xs[:3], **kw)


def _conv(s: Shapes, np_flavour: bool, deconv: bool) -> Optional[Call]:
    if len(s) < 2 or len(s[0]) != len(s[1]) or len(s[0]) < 3:
        return None
    data, weight = s[0], s[1]
    kernel = tuple(weight[2:])
    if deconv:  # weight: (in channels, out channels per group, *kernel)
        groups = max(1, data[1] // weight[0]) if weight[0] else 1
        filters = weight[1] * groups
    else:       # weight: (out channels, in channels per group, *kernel)
        groups = max(1, data[1] // weight[1]) if weight[1] else 1
        filters = weight[0]
    kw = dict(kernel=kernel, num_filter=filters, num_group=groups, no_bias=len(s) < 3,
              pad=tuple(k // 2 for k in kernel))
    if np_flavour:
        fn = mx.npx.deconvolution if deconv else mx.npx.convolution
    else:
        fn = nd.Deconvolution if deconv else nd.Convolution
    return lambda xs: fn(*xs[:3], **kw)


def _dot(s: Shapes, fn: Callable, batch: bool, names: tuple[str, str] = (
        "transpose_a", "transpose_b")) -> Optional[Call]:
    if len(s) != 2 or (batch and (len(s[0]) != 3 or len(s[1]) != 3)) or \
            (not batch and (len(s[0]) != 2 or len(s[1]) != 2)):
        return None
    t = gemm_transposes(s[0], s[1])
    if t is None:
        return None
    kw = {names[0]: t[0], names[1]: t[1]}
    return lambda xs: fn(xs[0], xs[1], **kw)


def _matmul(s: Shapes, fn: Callable) -> Optional[Call]:
    """``np.matmul`` / ``np.dot``: no transpose flags, so only shapes that agree as given."""
    if len(s) != 2 or len(s[0]) < 1 or len(s[1]) < 1:
        return None
    inner_b = s[1][-2] if len(s[1]) >= 2 else s[1][0]
    if s[0][-1] != inner_b:
        return None
    return lambda xs: fn(xs[0], xs[1])


# op -> (shapes -> the op's call at those shapes, or None; numpy-flavoured inputs?)
RECIPES: dict[str, tuple[Callable[[Shapes], Optional[Call]], bool]] = {
    "FullyConnected": (lambda s: _fc(s, False), False),
    "_npx_fully_connected": (lambda s: _fc(s, True), True),
    "Convolution": (lambda s: _conv(s, False, False), False),
    "_npx_convolution": (lambda s: _conv(s, True, False), True),
    "Deconvolution": (lambda s: _conv(s, False, True), False),
    "_npx_deconvolution": (lambda s: _conv(s, True, True), True),
    "dot": (lambda s: _dot(s, nd.dot, False), False),
    "batch_dot": (lambda s: _dot(s, nd.batch_dot, True), False),
    "_npx_batch_dot": (lambda s: _dot(s, mx.npx.batch_dot, True), True),
    "_linalg_gemm2": (lambda s: _dot(s, nd.linalg.gemm2, False), False),
    "_npi_matmul": (lambda s: _matmul(s, mx.np.matmul), True),
    "_np_dot": (lambda s: _matmul(s, mx.np.dot), True),
}


def recipe(op: str, shape: ShapeClass) -> Optional[tuple[Call, Shapes, bool]]:
    """(the op's call, the operand shapes it is called with, numpy-flavoured?) at ``shape``'s
    concrete shapes; None for an op without a recipe or a shape class it cannot build."""
    entry = RECIPES.get(op)
    if entry is None or not shape.operands or any(s is None for s in shape.operands):
        return None
    shapes = shape.concrete()
    call = entry[0](shapes)
    return None if call is None else (call, shapes, entry[1])


def measure(op: str, shape: ShapeClass, training: bool, *, dtype: str = "bfloat16",
            ctx: Optional[mx.Context] = None, budget_s: float = BUDGET_S) -> Optional[Cost]:
    """The cost of ``op`` in ``dtype`` at ``shape`` on ``ctx`` (default: the CPU), its casts
    included, over float32: ``Cost.forward`` always, ``Cost.train`` for ``training``.
    None: no recipe for this op or shape. Exceptions while timing propagate (the caller,
    ``SpeedBook``, counts them as no kernel). Host syncs: one per timed run."""
    built = recipe(op, shape)
    if built is None:
        return None
    call, shapes, np_flavour = built
    ctx = ctx or mx.cpu()
    if training and dtype == "bfloat16" and op in ABORTS_BF16_BACKWARD and \
            ctx.device_type == "cpu":
        raise RuntimeError(f"MXNet {mx.__version__}'s bfloat16 {op} backward on CPU aborts "
                           f"the process (std::terminate), so it is not run")
    try:
        return _timed(call, shapes, np_flavour, training, dtype, ctx, budget_s)
    except Exception:
        _drain(ctx)  # its pending errors surface now, not in the user's next wait
        raise


def _timed(call: Call, shapes: Shapes, np_flavour: bool, training: bool, dtype: str,
           ctx: mx.Context, budget_s: float) -> Cost:
    with unpatched(), ctx, autograd.pause(), stderr_silenced():
        inputs = [nd.random.uniform(-1, 1, s, ctx=ctx) for s in shapes]
        if np_flavour:
            inputs = [x.as_np_ndarray() for x in inputs]
        for x in inputs:
            x.attach_grad()
        return speed_source.cost_of(lambda backward: _run(call, inputs, dtype, backward),
                                    lambda backward: _run(call, inputs, None, backward),
                                    training, budget_s)


def _cast(x: object, dtype: str) -> object:
    """``x`` cast to ``dtype`` by ``amp_cast`` (differentiably), as the plan casts; a
    numpy-flavoured array through its legacy view (``astype`` knows no bfloat16)."""
    if isinstance(x, mx.numpy.ndarray):
        return _ND_AMP_CAST(x.as_nd_ndarray(), dtype=mx_dtype(dtype)).as_np_ndarray()
    return _ND_AMP_CAST(x, dtype=mx_dtype(dtype))


def _run(call: Call, inputs: list, dtype: Optional[str], backward: bool) -> Callable[[], None]:
    """One complete run: (casts in,) the op, (cast out,) (backward,) one host sync."""
    def once() -> None:
        with autograd.record() if backward else autograd.pause():
            xs = inputs if dtype is None else [_cast(x, dtype) for x in inputs]
            out = call(xs)
            if dtype is not None:
                out = _cast(out, "float32")
        if backward:
            out.backward()
            for x in inputs:
                x.grad.wait_to_read()
        else:
            out.wait_to_read()
    return once


@dataclass(frozen=True)
class MXNetSource:
    """MXNet's ``amp_adapters.services.speed_source.SpeedSource``: an op with a recipe here
    (``RECIPES``) at a shape class it can build, timed by ``measure`` on the device
    ``device_type`` ``device_id`` (the device the model runs on; ``gpu``: its key, None on
    a CPU)."""

    dtype: str
    device_type: str = "cpu"
    device_id: int = 0
    gpu: Optional[str] = None
    framework: str = "mxnet"
    version: str = mx.__version__
    timer: str = "mxnet_amp.speed"
    child: str = "mxnet_amp.speed_child"

    def job(self, op: str, shape: ShapeClass, training: bool) -> Optional[Job]:
        if recipe(op, shape) is None:
            return None  # known here: no child started for it
        return Job(op, shape, training, self.dtype, {"device_type": self.device_type,
                                                     "device_id": self.device_id})


def time_job(job: Job) -> Optional[Cost]:
    """``measure`` of ``job`` on its device: what the measuring child runs."""
    return measure(job.op, job.shape, job.training, dtype=job.dtype,
                   ctx=mx.Context(job.how["device_type"], job.how["device_id"]))


def source(ctx: Optional[mx.Context], dtype: str) -> MXNetSource:
    """The speed source of ``ctx`` (default the CPU) in ``dtype``."""
    ctx = ctx or mx.cpu()
    return _source(ctx.device_type, ctx.device_id, dtype)


@functools.lru_cache(maxsize=None)
def _source(device_type: str, device_id: int, dtype: str) -> MXNetSource:
    return MXNetSource(dtype, device_type, device_id,
                       gpu_of(mx.Context(device_type, device_id)))


def profile(policy: Policy, ctx: mx.Context, training: bool) -> DeviceProfile:
    """The device profile a plan under ``policy`` on ``ctx`` reads: the kernels
    (``kernels.device_profile``), with the core's measured-speed lookup where the policy
    measures (``speed_source.profile``). The shape of every runtime's ``profile``: policy,
    device, (the IR,) training."""
    return speed_source.profile(device_profile(ctx, policy, training), policy,
                                lambda: source(ctx, policy.dtype))


def gpu_of(ctx: mx.Context, facts: Optional[tuple[str, object]] = None) -> Optional[str]:
    """The machine's GPU for a measurement on ``ctx`` (``speedbook.gpu_key``): its name and
    compute capability (``facts``, default what ``nvidia-smi`` says of ``ctx``'s device:
    MXNet itself cannot tell); None on a CPU."""
    if ctx.device_type in ("cpu", "cpu_pinned", "cpu_shared"):
        return None
    facts = facts or nvidia_gpu(ctx.device_id)
    if facts is None:
        warn_once(f"gpu-name:{ctx.device_id}", f"mxnet_amp: cannot read the name of GPU "
                  f"{ctx.device_id} (nvidia-smi): its timings are kept as 'unknown GPU', "
                  f"which another GPU model on this host would share")
        facts = ("unknown GPU", "?")
    return gpu_key(facts[0], facts[1])  # type: ignore[arg-type]


def note_native_speed(policy: Policy, training: bool) -> None:
    """Say once per process when the native's decisions run an op slower than float32 here
    (``amp_adapters.services.native_speed.note``)."""
    speed_source.note("mxnet_amp", policy, source(None, policy.dtype), training)


def forget_speed_books() -> None:
    """Drop this process's books (``reset``): the next plan reads the profile and the cache
    again (``AMP_ADAPTERS_CACHE`` as it is then); nothing measured is lost, it is on disk."""
    speed_source.forget()


def speed_probe(dtype: str):
    """``amp-adapters info --measure``'s answer for MXNet on this CPU (``speed_report``): the
    book ``policy="auto"`` reads, the device profiles, and a small and a large GEMM and a
    convolution as samples."""
    from amp_adapters.services.speed_report import Sample, gemm_samples, probe_of

    policy, ctx = Policy.preset("auto", dtype=dtype), mx.cpu()
    conv = Sample("Convolution", ShapeClass.of([(16, 64, 56, 56), (64, 64, 3, 3), (64,)]),
                  "conv 3x3 64ch 56x56")
    return probe_of(source(ctx, dtype), "mxnet", profile(policy, ctx, True),
                    profile(policy, ctx, False), gemm_samples("FullyConnected", bias=True)
                    + (conv,))
