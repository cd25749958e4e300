"""Measured speed in eager mode: the dygraph runtime's speed source (``DygraphSource``).

Under ``policy="auto"`` (``Policy.speed == "measured"``) a region's device profile carries
the core's lookup (``amp_adapters.services.speed_source.costs``): the core's book and cache
as every runtime, and Paddle's measuring child (``paddle_amp.speed_child``, the static
programs' too; MXNet has its own), under the framework ``"paddle-dygraph"`` (eager mode
reaches oneDNN by another route than a program, so its timings are its own). An op
is timed where it has an eager low route here (``kernels.lowp_kernels``: ``matmul_v2``,
which ``paddle.matmul``, ``Tensor.matmul`` and ``F.linear``'s GEMM plan as; ``conv2d`` has
no eager oneDNN route, so it falls back without being timed) at shapes that fit it (the
core's ``speed_source.gemm_transposes``: one rule for turning a shape class into a GEMM). The job
(``time_job``, in the measuring child) is the route ``wrappers`` runs: the operands cast
into the low dtype (``kernels.rounding_cast``), ``kernels.ROUTES[op]``, the result cast
back to float32, against the op in float32 (``speed_source.cost_of``); forward for a region
without gradients, forward and backward (``paddle.grad`` of both operands) for a training
one.
"""
from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass
from typing import Optional

import paddle

from amp_adapters import Policy
from amp_adapters.services import speed_source
from amp_adapters.rules.device import Cost, DeviceProfile, ShapeClass
from amp_adapters.services.speed_source import Job, gemm_transposes

from . import kernels


@dataclass(frozen=True)
class DygraphSource:
    """Eager mode's ``amp_adapters.services.speed_source.SpeedSource`` on this CPU for ``dtype``."""

    dtype: str
    framework: str = "paddle-dygraph"
    version: str = paddle.__version__
    timer: str = "paddle_amp.dygraph.speed"
    child: str = "paddle_amp.speed_child"
    gpu: Optional[str] = None  # eager mode's low route is oneDNN's: a CPU

    def job(self, op: str, shape: ShapeClass, training: bool) -> Optional[Job]:
        if op not in kernels.GEMMS or op not in kernels.lowp_kernels(self.dtype) or \
                not shape.operands or any(s is None for s in shape.operands):
            return None
        shapes = shape.concrete()
        trans = gemm_transposes(*shapes) if len(shapes) == 2 else None
        if trans is None:
            return None
        return Job(op, shape, training, self.dtype, {
            "x": list(shapes[0]), "y": list(shapes[1]), "trans": list(trans)})


@functools.lru_cache(maxsize=None)
def source(dtype: str) -> DygraphSource:
    """The dygraph speed source for ``dtype``."""
    return DygraphSource(dtype)


def profile(policy: Policy, device: DeviceProfile) -> DeviceProfile:
    """``device`` (``kernels.device_profile``: already for training or inference) with the core's
    measured-speed lookup where ``policy`` measures
    (``speed_source.profile``: the same lookup for every region, so its decisions are kept
    across regions). The shape of every runtime's ``profile``: policy, device (here its
    profile, which carries training)."""
    return speed_source.profile(device, policy, lambda: source(policy.dtype))


def speed_probe(dtype: str):
    """``amp-adapters info --measure``'s rows for eager mode on this CPU (``speed_report``):
    the book ``policy="auto"`` reads, the region's device profiles, and a small and a large
    GEMM (``paddle.matmul``, a ``Linear``) and a convolution (no eager low route: shown, not
    timed) as samples."""
    from amp_adapters.services.speed_report import Sample, gemm_samples, probe_of

    policy = Policy.preset("auto", dtype=dtype)
    conv = Sample("conv2d", ShapeClass.of([(16, 64, 56, 56), (64, 64, 3, 3)]),
                  "conv 3x3 64ch 56x56")
    return probe_of(source(dtype), "paddle", profile(policy, kernels.device_profile(dtype)),
                    profile(policy, kernels.device_profile(dtype, training=False)),
                    gemm_samples("matmul_v2") + (conv,))


_noted: set = set()  # (policy, training) said or found nothing to say in this process


def note_native_speed(policy: Policy, training: bool) -> None:
    """Say once per process when the native's decisions run an op slower than float32 here
    (``speed_source.note``; only for a policy with the native's defaults: a region without
    ``policy=``). It applies in eager mode too: ``paddle.amp`` itself does nothing on a
    CPU, but this runtime runs its lists there (``wrappers``), on oneDNN's bf16 GEMM,
    which an AVX-512 CPU without ``avx512_bf16`` emulates. The answer is kept per (policy,
    training): a region per training step reads neither the CPU nor the cache again."""
    if _seen.get((id(policy), training)) is policy:  # (hashing a Policy costs about 1 us)
        return
    if len(_seen) > 256:
        _seen.clear()
    _seen[(id(policy), training)] = policy
    if not policy.enabled or policy.defaults != "native" or (policy, training) in _noted:
        return
    _noted.add((policy, training))
    speed_source.note("paddle_amp.dygraph", policy, source(policy.dtype), training)


_seen: dict = {}  # (id(policy), training) -> policy: asked already (the same object)


def time_job(job: Job) -> Cost:
    """In the measuring child: the job's GEMM on the eager low route against float32 (see
    the module docstring)."""
    import numpy as np
    how, low_dtype = job.how, job.dtype
    rng = np.random.default_rng(0)
    x, y = (paddle.to_tensor(rng.uniform(-1, 1, s).astype(np.float32),
                             stop_gradient=not job.training) for s in (how["x"], how["y"]))
    tx, ty = how["trans"]
    cast, route = kernels.rounding_cast(), kernels.ROUTES[job.op]
    plain = paddle._C_ops.matmul

    def low_out():
        return cast(route(cast(x, low_dtype), cast(y, low_dtype), tx, ty), "float32")

    def base_out():
        return plain(x, y, tx, ty)

    def run(out_of, backward):
        def once():
            out = out_of()
            if backward:  # eager ops on a CPU run synchronously: no host sync to add
                paddle.grad([out], [x, y], [paddle.ones_like(out)])
        return once

    # (without training only the forward is timed: under no_grad, as a region without
    # gradients runs it)
    with contextlib.nullcontext() if job.training else paddle.no_grad():
        return speed_source.cost_of(lambda backward: run(low_out, backward),
                                    lambda backward: run(base_out, backward), job.training)
