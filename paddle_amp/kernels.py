"""Which Paddle ops have a low-precision kernel on the device actually used.

The native AMP always asks about GPU kernels, so on a CPU build it counts
nearly every op as unsupported and inserts no cast. Here the device is the one
the program will run on (``core.op_supported_infos``), and an op counts only if
its gradient op (when it has one) has the kernel too, so training does not
crash in the backward pass. ``cast`` is always usable.

Two kinds of kernel count (``plain_kernels`` | ``onednn_kernels``):

- plain ones, which the executor picks for a plain program. A kernel only for
  the STRIDED layout (``flatten_contiguous_range`` in fp16 on CPU) does not count;
- bfloat16 on a CPU: oneDNN's, the only bf16 GEMM/convolution kernels on a CPU,
  reached by the attributes the native bf16 rewrite sets on the legacy IR, and picked
  by the executor itself under PIR (``ProgramIR.use_onednn``). ``cast`` counts only by
  its own probe (``casts_on_onednn``; legacy IR only), and then means: the casts the
  rewrite inserts between float32 and bf16 go to oneDNN (``ProgramIR.use_onednn_casts``),
  but those in front of an op that trains only behind plain ones (``plain_cast_readers``).
  They need a CPU with AVX-512 (the project's device truth, ``amp_adapters.rules.isa.bf16_class``,
  a cheap gate that honours a simulated class, which Paddle's cpuid answer
  ``core.supports_bfloat16`` cannot) and a oneDNN
  that uses it (a bf16 add that runs, forward and backward, ``GATE``; it fails where
  ``ONEDNN_MAX_CPU_ISA=AVX2`` keeps oneDNN off AVX-512, and then no oneDNN bf16 op
  counts). Where it has them, each op with a recipe is run once, forward and backward,
  on tiny bf16 inputs in a legacy program, because a registered kernel may still fail:
  Paddle 2.6.2's oneDNN conv2d takes no bf16 filter, there is no bf16
  ``layer_norm_grad``, and Paddle 3.3.1's legacy-IR ``reshape2_grad`` fails ("could not
  reshape a memory descriptor"). Such an op stays fp32 (with the per-op warning). The
  registry read and the probes run in the measuring child, once per machine, Paddle build
  (version, commit, CUDA), IR and project version, and their answers are kept on disk
  (``kernel_answers``, ``amp_adapters.services.device_book``): what they load never stays
  in the process that trains (it raised a float32 step's peak by 14 MB). Answers are
  cached per process.

A kernel that runs may still be slow. Where an operand of a GEMM or an elementwise op
has fewer dimensions than its result (a Linear's weight on a batch of sequences, a bias
added to a batch), its gradient sums over the extra dimensions, and the oneDNN of Paddle
2.6.2 and 3.3.1 does that sum for bf16 on a reference implementation
(``reduction,ref:any``): a Transformer block's training step took 4-6x its fp32 time,
6.1 s of 6.5 s in those sums on 2.6.2. ``slow_broadcast_grads`` finds such ops from
oneDNN's own log of a probe (``onednn_log``), not from a table of versions; training
keeps those instances in float32 (``amp_adapters.rules.device.DeviceProfile.refusal``).

This file holds the recipes and the assembly; the programs are built and run by the
probe of the program's IR (``ir.of(program).probe``: ``ir/legacy/probe.py``,
``ir/pir/probe.py``), the one argument every question here takes beside the device and
dtype (default: the legacy IR's, ``ir.default_probe``).
"""
from __future__ import annotations

import functools
import re
from typing import Optional

import numpy as np
import paddle
from paddle.base import core

from amp_adapters import DeviceProfile
from amp_adapters.rules.isa import bf16_class, machine
from amp_adapters.services import device_book

from . import ir as program_ir
from .env import VARTYPE_OF, from_low, to_low
from .ir.protocol import ONEDNN_DTYPE, Probe
from .onednn_log import slow_or_failing



def paddle_build() -> str:
    """The Paddle build a kernel answer holds for (``device_book``'s key): its version, its
    commit (two builds of one version may register other kernels) and whether it is
    compiled with CUDA."""
    return f"{paddle.__version__} {paddle.version.commit} cuda={paddle.is_compiled_with_cuda()}"


def _probe(probe: Optional[Probe]) -> Probe:
    return program_ir.default_probe() if probe is None else probe


@functools.lru_cache(maxsize=None)
def _answers(device: str, dtype: str, probe: Optional[Probe] = None) -> dict[str, frozenset]:
    """``kernel_answers`` for ``probe``'s IR, asked once per machine and Paddle build in
    the measuring child and kept on disk (``amp_adapters.services.device_book``): the
    registry read and the probes never run in the process that trains. A probe that is not
    one of the IRs' own is asked here."""
    probe = _probe(probe)
    if program_ir.probe_named(probe.name) is not probe:
        got = kernel_answers(device, dtype, probe)
    else:
        flag = program_ir.inherited_flag()
        got = device_book.answer("paddle", paddle_build(),
                                 f"static {probe.name} {device} {dtype} pir_api={flag}",
                                 "paddle_amp.speed_child", kernel_answers, device, dtype,
                                 probe.name)
    return {k: frozenset(v) for k, v in got.items()}


def kernel_answers(device: str, dtype: str, probe: "Probe | str | None" = None
                   ) -> dict[str, list[str]]:
    """What the functions below answer for ``device``, ``dtype`` and the IR of ``probe`` (or
    its name), found here by reading the kernel registry and running the probes: what the
    measuring child runs (``_answers``)."""
    probe = program_ir.probe_named(probe) if isinstance(probe, str) else _probe(probe)
    return {"plain": sorted(_plain_kernels(device, dtype)),
            "onednn": sorted(_onednn_kernels(device, dtype, probe)),
            "slow": sorted(_slow_broadcast_grads(device, dtype, probe)),
            "plain_casts": sorted(_plain_cast_readers(device, dtype, probe))}


@functools.lru_cache(maxsize=None)
def lowp_kernels(device: str, dtype: str, probe: Optional[Probe] = None) -> frozenset[str]:
    """Op names with a ``dtype`` kernel on ``device`` ('CPU' or 'GPU'), forward and backward:
    plain kernels, and on a CPU in bfloat16 the oneDNN kernels that run here (in a program
    of ``probe``'s IR)."""
    return plain_kernels(device, dtype) | onednn_kernels(device, dtype, probe)


def device_profile(device: str, dtype: str, probe: Probe, training: bool = True
                   ) -> DeviceProfile:
    """What ``device`` runs in ``dtype`` for a program of ``probe``'s IR
    (``amp_adapters.rules.device``): the kernels (``lowp_kernels``), the oneDNN route
    (``onednn_kernels``), the casts kept plain (``plain_cast_readers``) and, for
    ``training``, the slow broadcast gradients (``slow_broadcast_grads``); the measured-speed
    lookup is ``speed_source.profile``'s to add (``Policy.speed == "measured"``)."""
    return DeviceProfile(
        lowp_kernels(device, dtype, probe), onednn_kernels(device, dtype, probe),
        slow_broadcast_grads(device, dtype, probe) if training else frozenset(),
        plain_cast_readers(device, dtype, probe), training=training)


def plain_kernels(device: str, dtype: str) -> frozenset[str]:
    """Ops whose ``dtype`` kernel on ``device`` the executor picks without oneDNN."""
    return _answers(device, dtype)["plain"]


@functools.lru_cache(maxsize=None)
def _plain_kernels(device: str, dtype: str) -> frozenset[str]:
    return _usable(device, dtype, _registered(device, dtype, onednn=False)) | {"cast"}


def onednn_kernels(device: str, dtype: str, probe: Optional[Probe] = None) -> frozenset[str]:
    """Ops whose oneDNN ``dtype`` kernel runs on this ``device``, forward and backward (a
    recipe's op only if its probe ran, in a program of ``probe``'s IR); empty but for
    bfloat16 on a CPU that supports it; ``cast`` where the IR can send casts there and
    their own probe ran (``casts_on_onednn``)."""
    return _answers(device, dtype, probe)["onednn"]


@functools.lru_cache(maxsize=None)
def _onednn_kernels(device: str, dtype: str, probe: Probe) -> frozenset[str]:
    if device != "CPU" or dtype != ONEDNN_DTYPE or bf16_class(machine()) == "none" \
            or not runs_onednn_bf16(GATE, backward=True, probe=probe):
        return frozenset()
    registered = _registered(device, dtype, onednn=True)
    usable = _usable(device, dtype, registered | _registered(device, dtype, onednn=False),
                     among=registered)
    ops = frozenset(op for op in usable if op != "cast" and (
        op not in _RECIPES or (runs_onednn_bf16(op, backward=True, probe=probe)
                               and trains_behind_casts(op, probe))))
    return ops | ({"cast"} if probe.onednn_casts and casts_on_onednn(probe) else frozenset())


def trains_behind_casts(op: str, probe: Optional[Probe] = None) -> bool:
    """Whether ``op`` (one of the recipes) trains in bf16 behind the casts a rewrite puts in
    front of it here (oneDNN's where casts go there, else, or for the ops of
    ``refuse_onednn_casts``, plain ones): a rewritten program always reaches its first bf16
    op through a cast. Paddle 3.3.1's legacy-IR oneDNN conv2d runs on bf16 data, but behind
    either cast fails on a batch of 16 channels ("could not construct a memory descriptor
    using strides") where oneDNN emulates bf16 (AVX512_CORE): no kernel."""
    probe = _probe(probe)
    onednn = probe.onednn_casts and casts_on_onednn(probe) and \
        op not in refuse_onednn_casts(probe)
    return runs_onednn_bf16(op, True, probe, cast_in="onednn" if onednn else "plain")


@functools.lru_cache(maxsize=None)
def casts_on_onednn(probe: Optional[Probe] = None) -> bool:
    """Whether the casts between float32 and bfloat16 that a rewrite inserts go to oneDNN
    here (an IR with such a switch: the legacy IR's oneDNN attributes): such a cast runs
    on oneDNN (a ``reorder`` in ``onednn_log``) and rounds to nearest even, both ways, as a
    bf16 kernel's output does (a subnormal flushes to zero there, as ``avx512_bf16``'s
    conversion instruction does). The probed ops that do not train between such casts
    but do behind plain ones keep plain casts in front (``refuse_onednn_casts``); one that
    trains behind neither has no kernel (``trains_behind_casts``). Such a cast is several times
    faster than Paddle's
    plain one (the MLP's bf16 training step: 1.56x of float32 with plain casts, 0.71x with
    oneDNN's, Paddle 2.6.2), and Paddle 2.6.2's plain cast truncates. PIR has no per-op
    switch for it (``PirProgram.use_onednn_casts``)."""
    probe = _probe(probe)
    x = np.array([1 + 2 ** -8, 1 + 3 * 2 ** -8, -(1 + 2 ** -8 + 2 ** -12), 3.0e38, -1e-30],
                 np.float32)  # ties to even (down, up), above a tie, large and small normals
    got = probe.casts_round_trip(x) if probe.onednn_casts else None
    if got is None:
        return False
    kinds, back = got
    return "reorder" in kinds and np.array_equal(
        back, from_low(to_low(x, ONEDNN_DTYPE), ONEDNN_DTYPE))


@functools.lru_cache(maxsize=None)
def refuse_onednn_casts(probe: Optional[Probe] = None) -> frozenset[str]:
    """The probed ops that run on oneDNN in bf16 here but do not train behind oneDNN casts
    of their inputs: Paddle 3.3.1's oneDNN ``conv2d_grad`` leaves the filter gradient in a
    layout its oneDNN cast cannot read ("could not construct a memory descriptor using
    strides") as the CPU is, and trains behind plain ones. The casts a rewrite puts in
    front of them stay plain (``plain_cast_readers``). Empty for an IR that cannot send a
    cast there."""
    probe = _probe(probe)
    if not probe.onednn_casts:
        return frozenset()
    return frozenset(op for op in _RECIPES if runs_onednn_bf16(op, backward=True, probe=probe)
                     and not runs_onednn_bf16(op, True, probe, cast_in="onednn")
                     and runs_onednn_bf16(op, True, probe, cast_in="plain"))


def plain_cast_readers(device: str, dtype: str, probe: Optional[Probe] = None
                       ) -> frozenset[str]:
    """The ops in front of which a rewrite's casts stay plain where the others go to oneDNN
    (``refuse_onednn_casts``); empty where no cast goes there (``cast`` not among
    ``onednn_kernels``)."""
    return _answers(device, dtype, probe)["plain_casts"]


def _plain_cast_readers(device: str, dtype: str, probe: Probe) -> frozenset[str]:
    return refuse_onednn_casts(probe) if "cast" in _onednn_kernels(device, dtype, probe) \
        else frozenset()


def _usable(device: str, dtype: str, supported: set[str], among=None) -> frozenset[str]:
    """Of ``among`` (default ``supported``), the ops whose gradient op, if any, is supported."""
    all_ops = set(core.op_supported_infos(device, VARTYPE_OF[dtype])[0])
    return frozenset(op for op in (supported if among is None else among)
                     if f"{op}_grad" not in all_ops or f"{op}_grad" in supported)


def _registered(device: str, dtype: str, onednn: bool) -> set[str]:
    """Ops registering a ``dtype`` kernel on ``device``: the oneDNN ones, or the others (no
    STRIDED-only kernel); the plain ones also must be in ``op_supported_infos``."""
    place = "cpu" if device == "CPU" else "gpu"
    key = re.compile(rf"data_type\[[\w:]*\b{dtype}\].*place\[Place\({place}")
    found = {op for op, kernels in core._get_all_register_op_kernels("all").items()
             if any(key.search(k) and ("library_type[MKLDNN]" in k) == onednn
                    and "data_layout[STRIDED]" not in k for k in kernels)}
    if onednn:
        return found
    return found & set(core.op_supported_infos(device, VARTYPE_OF[dtype])[1])


# op -> (inputs {slot: (shape, in bf16?)}, output slots, attrs): the op on tiny inputs.
_Recipe = tuple[dict[str, tuple[tuple[int, ...], bool]], tuple[str, ...], dict]
_CONV = {"strides": [1, 1], "paddings": [1, 1], "dilations": [1, 1], "groups": 1}
_RECIPES: dict[str, _Recipe] = {
    "matmul_v2": ({"X": ((2, 3), True), "Y": ((3, 4), True)}, ("Out",), {}),
    "mul": ({"X": ((2, 3), True), "Y": ((3, 4), True)}, ("Out",), {}),
    "matmul": ({"X": ((2, 3), True), "Y": ((3, 4), True)}, ("Out",), {}),
    # a batch of 2, 16 channels and a 3x3 window, as a model's: Paddle 3.3.1's legacy-IR
    # oneDNN conv2d runs bf16 on one image or a few channels, and fails on more ("could not
    # construct a memory descriptor using strides") where oneDNN emulates bf16 (AVX512_CORE)
    "conv2d": ({"Input": ((2, 16, 4, 4), True), "Filter": ((16, 16, 3, 3), True)},
               ("Output",), _CONV),
    "layer_norm": ({"X": ((2, 4), True), "Scale": ((4,), False), "Bias": ((4,), False)},
                   ("Y", "Mean", "Variance"), {"begin_norm_axis": 1, "epsilon": 1e-5}),
    # Paddle 3.3.1's legacy-IR oneDNN reshape2_grad: "could not reshape a memory descriptor"
    "reshape2": ({"X": ((2, 2, 3), True)}, ("Out", "XShape"), {"shape": [-1, 3]}),
    "elementwise_add": ({"X": ((2, 3), True), "Y": ((2, 3), True)}, ("Out",), {"axis": -1}),
    "relu": ({"X": ((2, 3), True)}, ("Out",), {}),
}
# The gate: where oneDNN cannot run this bf16 add (a CPU flag it does not use, a limit such
# as ONEDNN_MAX_CPU_ISA=AVX2), it runs no bf16 kernel, the unprobed ones included.
GATE = "elementwise_add"


# op -> the op with an operand of fewer dimensions than its result, whose gradient sums
# over the extra ones (``slow_broadcast_grads``)
_GEMM_3D = ({"X": ((2, 2, 3), True), "Y": ((3, 4), True)}, ("Out",), {})
_BIAS_3D = ({"X": ((2, 2, 4), True), "Y": ((4,), True)}, ("Out",), {"axis": -1})
_BROADCAST_RECIPES: dict[str, _Recipe] = {
    "matmul_v2": _GEMM_3D, "matmul": _GEMM_3D, "elementwise_add": _BIAS_3D,
    "elementwise_sub": _BIAS_3D, "elementwise_mul": _BIAS_3D,
}


@functools.lru_cache(maxsize=None)
def runs_onednn_bf16(op: str, backward: bool = False, probe: Optional[Probe] = None,
                     cast_in: Optional[str] = None) -> bool:
    """Whether ``op`` (one of the recipes) runs in bfloat16 on oneDNN on this CPU, and its
    gradient too with ``backward``: its recipe run once by ``probe`` (a legacy program with
    the native's oneDNN attributes; a PIR program, whose executor picks the kernel itself),
    on bf16 inputs, or with ``cast_in`` ("onednn" or "plain") behind such casts from
    float32. An error (no primitive for this CPU, a dtype the kernel refuses) is the answer
    False, never raised."""
    return _probe(probe).runs(op, _RECIPES[op], backward, cast_in=cast_in)


def slow_broadcast_grads(device: str, dtype: str, probe: Optional[Probe] = None
                         ) -> frozenset[str]:
    """Of the ops whose ``dtype`` kernel on ``device`` is oneDNN's, those whose gradient for
    an operand of fewer dimensions than the result runs a reference implementation, or
    fails (``onednn_log`` of the op's bf16 forward and backward on a 3-D input): such an
    instance would run slower than in float32, or not at all. Empty where oneDNN runs no
    bf16; where its log cannot be read, only the failures."""
    return _answers(device, dtype, probe)["slow"]


def _slow_broadcast_grads(device: str, dtype: str, probe: Probe) -> frozenset[str]:
    slow = set()
    for op in sorted(_onednn_kernels(device, dtype, probe) & set(_BROADCAST_RECIPES)):
        if slow_or_failing(lambda: probe.runs(op, _BROADCAST_RECIPES[op], True)):
            slow.add(op)
    return frozenset(slow)
