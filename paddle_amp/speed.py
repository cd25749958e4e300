"""Measured speed on Paddle's static programs: their speed source (``StaticSource``).

Under ``Policy.speed == "measured"`` (the preset ``"auto"``) the device profile's
``costs`` (``profile``) is a lookup in the core's book (``amp_adapters.services.speed_source``): a
saved profile, this machine's cache, or a measurement now. The measurement (the source's
job, timed by ``time_job`` in Paddle's measuring child, ``paddle_amp.speed_child``, which
serves the core's loop) times one op the O1 lists lower
(``TIMED``: the GEMMs and the convolution; None for any other op: not measured) at the
shape class the model uses (``ShapeClass.concrete``: an unknown batch is taken as
``UNKNOWN_DIM``), in the low dtype behind the casts a rewrite adds (their route as the
device profile says: oneDNN's or plain) with its result cast back to float32, against
the op in float32: forward for an eval program, forward and backward for training. The
program is built and run by the IR's probe (``ProgramIR.probe.time``); this file only
turns a shape class into the op's inputs and attributes.

A shape class keeps only operand shapes: a matmul's transposes are chosen so the shapes
fit (the core's ``speed_source.gemm_transposes``), a ``mul`` flattens its first operand where it
fits the second, and a convolution is
measured at stride 1 and "same" padding. Shapes that fit no such op are not measured
(None). The entries' framework is ``"paddle"`` for the legacy IR and ``"paddle-pir"`` for
PIR: the two build different casts around the op (PIR has no oneDNN cast), so their
timings are not each other's.

The op is timed on the place the program runs on (``timing_place``: the CPU, or the GPU
``paddle.set_device`` chose), and on a GPU the book is keyed by that GPU's name and
compute capability (``gpu_of``).
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Optional

import paddle

from amp_adapters import Policy
from amp_adapters.services import speed_source
from amp_adapters.rules.device import Cost, DeviceProfile, ShapeClass
from amp_adapters.services.speed_source import Job, gemm_transposes
from amp_adapters.services.speedbook import gpu_key

from .ir import probe_named
from .ir.protocol import Probe
from .kernels import device_profile

TIMED = ("matmul_v2", "matmul", "mul", "conv2d")  # the ops O1 lowers that a timer builds


@dataclass(frozen=True)
class StaticSource:
    """Paddle's static programs' ``amp_adapters.services.speed_source.SpeedSource``, one per IR (the
    probe named ``ir``), place timed on and dtype: an op of ``TIMED`` at shapes it fits
    (``fit``), on the routes the device profile gives it, timed by the IR's probe."""

    dtype: str
    ir: str
    place: tuple = ("CPUPlace",)
    version: str = paddle.__version__
    timer: str = "paddle_amp.speed"
    child: str = "paddle_amp.speed_child"

    @property
    def gpu(self) -> Optional[str]:
        """The GPU timed on (``gpu_of``), asked of Paddle only when a book is made."""
        return _gpu(self.place)

    @property
    def framework(self) -> str:
        """The profile entries' framework name for this IR (``framework``)."""
        return "paddle" if self.ir == "legacy" else f"paddle-{self.ir}"

    def job(self, op: str, shape: ShapeClass, training: bool) -> Optional[Job]:
        if not measurable(op, shape):
            return None
        inputs, attrs = fit(op, shape.concrete())  # type: ignore[misc]
        device = "CPU" if self.place[0] == "CPUPlace" else "GPU"
        profile = device_profile(device, self.dtype, probe_named(self.ir), training)
        route = profile.route(op)
        if route == "none":
            return None
        cast_in = None
        if profile.route("cast") == "onednn":
            cast_in = "plain" if op in profile.plain_casts_before else "onednn"
        return Job(op, shape, training, self.dtype, {
            "ir": self.ir, "inputs": {k: list(v) for k, v in inputs.items()}, "attrs": attrs,
            "onednn": route == "onednn", "cast_in": cast_in, "place": list(self.place)})


def time_job(job: Job) -> Cost:
    """``Probe.time`` of the job's IR on the job's place: what the measuring child runs."""
    how = job.how
    return probe_named(how["ir"]).time(
        job.op, {k: tuple(v) for k, v in how["inputs"].items()}, how["attrs"], job.training,
        job.dtype, how["onednn"], how["cast_in"], place=place_of(tuple(how["place"])))


def source(device: str, dtype: str, probe: Probe, place: Optional[Place] = None
           ) -> StaticSource:
    """The speed source of a program of ``probe``'s IR on ``device`` in ``dtype``, timed on
    ``place`` (default ``timing_place(device)``)."""
    return _source(timing_place(device) if place is None else tuple(place), dtype, probe.name)


@functools.lru_cache(maxsize=None)
def _source(place: Place, dtype: str, ir_name: str) -> StaticSource:
    return StaticSource(dtype, ir_name, place)


@functools.lru_cache(maxsize=None)
def _gpu(place: Place) -> Optional[str]:
    return gpu_of(place)


def profile(policy: Policy, device: str, probe: Probe, training: bool) -> DeviceProfile:
    """The device profile a rewrite under ``policy`` plans on: the kernels of ``device`` in
    ``probe``'s IR (``kernels.device_profile``), with the core's measured-speed lookup
    where the policy measures (``speed_source.profile``: this process's book for the
    dtype, profile file and IR; only what the source can time is looked up)."""
    return speed_source.profile(device_profile(device, policy.dtype, probe, training), policy,
                                lambda: source(device, policy.dtype, probe))


def measurable(op: str, shape: ShapeClass) -> bool:
    """Whether ``op`` can be built at ``shape``: one of ``TIMED``, its operands of known rank
    and fitting it (``fit``)."""
    return op in TIMED and all(s is not None for s in shape.operands) \
        and fit(op, shape.concrete()) is not None


Place = tuple  # ("CPUPlace",) or ("CUDAPlace", index): a place as JSON, for the child


def timing_place(device: str, gpu_id: Optional[int] = None) -> Place:
    """The place an op is timed on for a program on ``device`` ('CPU' or 'GPU'): the CPU, or
    the GPU ``gpu_id`` (default: the one programs run on, ``paddle.set_device``)."""
    if device == "CPU":
        return ("CPUPlace",)
    if gpu_id is None:
        from .env import expected_place
        place = expected_place()
        gpu_id = place.get_device_id() if hasattr(place, "get_device_id") else \
            place.gpu_device_id()
    return ("CUDAPlace", int(gpu_id))


def place_of(place: Place):
    """The Paddle place ``timing_place`` names (built where it is timed: the child)."""
    kinds = {"CPUPlace": paddle.CPUPlace, "CUDAPlace": paddle.CUDAPlace}
    return kinds[place[0]](*place[1:])


def gpu_of(place: Place, facts: Optional[tuple[str, object]] = None) -> Optional[str]:
    """The machine's GPU for a measurement on ``place``: its name and compute capability
    (``speedbook.gpu_key``; ``facts`` default Paddle's answer for the device), None on
    the CPU."""
    if place[0] == "CPUPlace":
        return None
    if facts is None:
        cuda = paddle.device.cuda
        facts = (cuda.get_device_name(place[1]), cuda.get_device_capability(place[1]))
    return gpu_key(facts[0], facts[1])  # type: ignore[arg-type]


def fit(op: str, shapes: tuple) -> Optional[tuple[dict, dict]]:
    """({slot: shape}, attributes) of ``op`` on operands of ``shapes`` (its floating
    operands in slot order), or None where they fit no such op."""
    if op in ("matmul_v2", "matmul"):
        return _fit_matmul(op, shapes)
    if op == "mul":
        return _fit_mul(shapes)
    if op == "conv2d":
        return _fit_conv(shapes)
    return None


def _fit_matmul(op: str, shapes: tuple) -> Optional[tuple[dict, dict]]:
    t = gemm_transposes(*shapes) if len(shapes) == 2 else None
    if t is None:
        return None
    names = ("trans_x", "trans_y") if op == "matmul_v2" else ("transpose_X", "transpose_Y")
    return {"X": shapes[0], "Y": shapes[1]}, dict(zip(names, t))


def _fit_mul(shapes: tuple) -> Optional[tuple[dict, dict]]:
    if len(shapes) != 2 or len(shapes[1]) != 2 or len(shapes[0]) < 2:
        return None
    x, y = shapes
    for k in range(1, len(x)):
        if math.prod(x[k:]) == y[0]:
            return {"X": x, "Y": y}, {"x_num_col_dims": k, "y_num_col_dims": 1}
    return None


def _fit_conv(shapes: tuple) -> Optional[tuple[dict, dict]]:
    """The operands in either order (the legacy IR lists a conv2d's slots by name, Filter
    before Input; PIR as called): the filter is the one whose window fits in the other's
    image and whose channels divide its channels into groups."""
    if len(shapes) != 2 or len(shapes[0]) != 4 or len(shapes[1]) != 4:
        return None
    for x, w in (shapes, shapes[::-1]):
        if w[2] <= x[2] and w[3] <= x[3] and not x[1] % w[1] and not w[0] % (x[1] // w[1]):
            break
    else:
        return None
    return {"Input": x, "Filter": w}, {
        "strides": [1, 1], "paddings": [w[2] // 2, w[3] // 2], "dilations": [1, 1],
        "groups": x[1] // w[1], "data_format": "NCHW", "padding_algorithm": "EXPLICIT"}


def speed_probe(dtype: str):
    """``amp-adapters info --measure``'s answer for Paddle's programs on this CPU, in the
    default IR (``speed_report``): the book ``policy="auto"`` reads, the device profiles,
    and a small and a large GEMM and a convolution as samples."""
    from amp_adapters.services.speed_report import Sample, gemm_samples, probe_of

    from .env import current_device
    from .ir import default_probe
    probe, device = default_probe(), current_device()
    policy = Policy.preset("auto", dtype=dtype)
    conv = Sample("conv2d", ShapeClass.of([(16, 64, 56, 56), (64, 64, 3, 3)]),
                  "conv 3x3 64ch 56x56")
    return probe_of(source(device, dtype, probe), "paddle",
                    profile(policy, device, probe, True), profile(policy, device, probe, False),
                    gemm_samples("matmul_v2") + (conv,))


def note_native_speed(policy: Policy, probe: Probe, training: bool) -> None:
    """Say once per process when the native's decisions run an op slower than float32 here
    (``amp_adapters.services.native_speed.note``), for a program in ``probe``'s IR."""
    speed_source.note("paddle_amp", policy, StaticSource(policy.dtype, probe.name), training)
