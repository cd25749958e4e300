"""Measured speed in eager mode: the dygraph runtime's speed source (``DygraphSource``).

Under ``policy="auto"`` (``Policy.speed == "measured"``) a region's device profile carries
the core's lookup (``amp_adapters.services.speed_source.costs``): the same book, cache and measuring
child as the static programs and MXNet, under the framework ``"paddle-dygraph"`` (eager
mode reaches oneDNN by another route than a program, so its timings are its own). An op
is timed where it has an eager low route here (``kernels.lowp_kernels``: ``matmul_v2``,
which ``paddle.matmul``, ``Tensor.matmul`` and ``F.linear``'s GEMM plan as; ``conv2d`` has
no eager oneDNN route, so it falls back without being timed) at shapes that fit it (the
static timer's ``fit``: one rule for turning a shape class into a GEMM). The job
(``time_job``, in the measuring child) is the route ``dispatch`` runs: the operands cast
into the low dtype (``kernels.rounding_cast``), ``kernels.ROUTES[op]``, the result cast
back to float32, against the op in float32; forward for a region without gradients,
forward and backward (``paddle.grad`` of both operands) for a training one.
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
from amp_adapters.services.speed_source import Job
from amp_adapters.services.timing import ratio_of

from . import kernels

BUDGET_S = 0.15  # per ratio; a training key measures two (forward, forward + backward)


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
        if op not in kernels.ROUTES or op not in kernels.lowp_kernels(self.dtype) or \
                not shape.operands or any(s is None for s in shape.operands):
            return None
        from ..speed import fit
        fitted = fit(op, shape.concrete())
        if fitted is None:
            return None
        inputs, attrs = fitted
        return Job(op, shape, training, self.dtype, {
            "x": list(inputs["X"]), "y": list(inputs["Y"]),
            "trans": [bool(attrs["trans_x"]), bool(attrs["trans_y"])]})


@functools.lru_cache(maxsize=None)
def source(dtype: str) -> DygraphSource:
    """The dygraph speed source for ``dtype``."""
    return DygraphSource(dtype)


def profile(device: DeviceProfile, policy: Policy) -> DeviceProfile:
    """``device`` (``kernels.device_profile``, for training or inference) with the core's
    measured-speed lookup where ``policy`` measures (``speed_source.profile``: the same
    lookup for every region, so its decisions are kept across regions)."""
    return speed_source.profile(device, policy, lambda: source(policy.dtype))


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

    with contextlib.nullcontext() if job.training else paddle.no_grad():
        forward = ratio_of(run(low_out, False), run(base_out, False), budget_s=BUDGET_S)
    if not job.training:
        return Cost(forward=forward[0], forward_spread=forward[1])
    train = ratio_of(run(low_out, True), run(base_out, True), budget_s=BUDGET_S)
    return Cost(forward=forward[0], forward_spread=forward[1], train=train[0],
                train_spread=train[1])
