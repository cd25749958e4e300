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
  They need a CPU with AVX-512 (``core.supports_bfloat16``, a cheap gate) and a oneDNN
  that uses it (a bf16 add that runs, forward and backward, ``GATE``; it fails where
  ``ONEDNN_MAX_CPU_ISA=AVX2`` keeps oneDNN off AVX-512, and then no oneDNN bf16 op
  counts). Where it has them, each op with a recipe is run once, forward and backward,
  on tiny bf16 inputs in a legacy program, because a registered kernel may still fail:
  Paddle 2.6.2's oneDNN conv2d takes no bf16 filter, there is no bf16
  ``layer_norm_grad``, and Paddle 3.3.1's legacy-IR ``reshape2_grad`` fails ("could not
  reshape a memory descriptor"). Such an op stays fp32 (with the per-op warning). Answers
  are cached per process.

A kernel that runs may still be slow. Where an operand of a GEMM or an elementwise op
has fewer dimensions than its result (a Linear's weight on a batch of sequences, a bias
added to a batch), its gradient sums over the extra dimensions, and the oneDNN of Paddle
2.6.2 and 3.3.1 does that sum for bf16 on a reference implementation
(``reduction,ref:any``): a Transformer block's training step took 4-6x its fp32 time,
6.1 s of 6.5 s in those sums on 2.6.2. ``slow_broadcast_grads`` finds such ops from
oneDNN's own log of a probe (``onednn_log``), not from a table of versions; training
keeps those instances in float32 (``rewrite.Rewriter``).
"""
from __future__ import annotations

import contextlib
import functools
import re
from typing import Callable, Optional

import numpy as np
import paddle
from paddle.base import core

from amp_adapters.device import DeviceProfile
from amp_adapters.quiet import stderr_silenced

from .env import VARTYPE_OF, from_low, to_low
from .onednn_log import executed, onednn_log

ONEDNN_DTYPE = "bfloat16"  # the one low dtype oneDNN runs on a CPU


@functools.lru_cache(maxsize=None)
def lowp_kernels(device: str, dtype: str, pir: bool = False) -> frozenset[str]:
    """Op names with a ``dtype`` kernel on ``device`` ('CPU' or 'GPU'), forward and backward:
    plain kernels, and on a CPU in bfloat16 the oneDNN kernels that run here (in a PIR
    program with ``pir``)."""
    return plain_kernels(device, dtype) | onednn_kernels(device, dtype, pir)


def device_profile(device: str, dtype: str, pir: bool = False, training: bool = True,
                   costs=None) -> DeviceProfile:
    """What ``device`` runs in ``dtype`` for a program in the legacy IR or, with ``pir``, in
    PIR (``amp_adapters.device``): the kernels (``lowp_kernels``), the oneDNN route
    (``onednn_kernels``), the casts kept plain (``plain_cast_readers``) and, for
    ``training``, the slow broadcast gradients (``slow_broadcast_grads``); ``costs``: the
    measured-speed lookup (``Policy.speed == "measured"``)."""
    return DeviceProfile(
        lowp_kernels(device, dtype, pir), onednn_kernels(device, dtype, pir),
        slow_broadcast_grads(device, dtype, pir) if training else frozenset(),
        plain_cast_readers(device, dtype, pir), training=training, costs=costs)


@functools.lru_cache(maxsize=None)
def plain_kernels(device: str, dtype: str) -> frozenset[str]:
    """Ops whose ``dtype`` kernel on ``device`` the executor picks without oneDNN."""
    return _usable(device, dtype, _registered(device, dtype, onednn=False)) | {"cast"}


@functools.lru_cache(maxsize=None)
def onednn_kernels(device: str, dtype: str, pir: bool = False) -> frozenset[str]:
    """Ops whose oneDNN ``dtype`` kernel runs on this ``device``, forward and backward (a
    recipe's op only if its probe ran, in a PIR program with ``pir``); empty but for
    bfloat16 on a CPU that supports it."""
    if device != "CPU" or dtype != ONEDNN_DTYPE or not core.supports_bfloat16() \
            or not runs_onednn_bf16(GATE, backward=True, pir=pir):
        return frozenset()
    registered = _registered(device, dtype, onednn=True)
    usable = _usable(device, dtype, registered | _registered(device, dtype, onednn=False),
                     among=registered)
    ops = frozenset(op for op in usable if op != "cast" and (
        op not in _RECIPES or runs_onednn_bf16(op, backward=True, pir=pir)))
    return ops | ({"cast"} if not pir and casts_on_onednn() else frozenset())


@functools.lru_cache(maxsize=None)
def casts_on_onednn() -> bool:
    """Whether the casts between float32 and bfloat16 that a legacy-IR rewrite inserts go to
    oneDNN here: such a cast with the oneDNN attributes runs on oneDNN (a ``reorder`` in
    ``onednn_log``) and rounds to nearest even, both ways, as a bf16 kernel's output does (a
    subnormal flushes to zero there, as ``avx512_bf16``'s conversion instruction does), and
    every probed op that runs on oneDNN here trains between such casts, but for the ops of
    ``refuse_onednn_casts``, which train with plain casts in front (and oneDNN's after). Such
    a cast is several times faster than Paddle's plain one (the MLP's bf16 training step:
    1.56x of float32 with plain casts, 0.71x with oneDNN's, Paddle 2.6.2), and Paddle
    2.6.2's plain cast truncates. PIR has no per-op switch for it
    (``PirProgram.use_onednn_casts``)."""
    x = np.array([1 + 2 ** -8, 1 + 3 * 2 ** -8, -(1 + 2 ** -8 + 2 ** -12), 3.0e38, -1e-30],
                 np.float32)  # ties to even (down, up), above a tie, large and small normals
    try:
        with _static(), stderr_silenced(), onednn_log() as log:
            main = paddle.static.Program()
            block = main.global_block()
            v = {n: block.create_var(name=f"probe_{n}", dtype=d, shape=list(x.shape))
                 for n, d in (("x", "float32"), ("low", ONEDNN_DTYPE), ("back", "float32"))}
            v["x"].desc.set_need_check_feed(False)
            _cast(block, v["x"], v["low"])
            _cast(block, v["low"], v["back"])
            exe = paddle.static.Executor(paddle.CPUPlace())
            back, = exe.run(main, feed={"probe_x": x}, fetch_list=[v["back"]])
    except Exception:  # noqa: BLE001 - any failure to build or run is "no"
        return False
    return "reorder" in {kind for kind, _ in executed(log)} and np.array_equal(
        np.asarray(back, np.float32), from_low(to_low(x, ONEDNN_DTYPE), ONEDNN_DTYPE)) and all(
        _runs(op, _RECIPES[op], True, False, cast_in="plain") for op in refuse_onednn_casts())


@functools.lru_cache(maxsize=None)
def refuse_onednn_casts() -> frozenset[str]:
    """The probed ops that run on oneDNN in bf16 here (legacy IR) but do not train behind
    oneDNN casts of their inputs: Paddle 3.3.1's oneDNN ``conv2d_grad`` leaves the filter
    gradient in a layout its oneDNN cast cannot read ("could not construct a memory
    descriptor using strides"). The casts a rewrite puts in front of them stay plain
    (``plain_cast_readers``)."""
    return frozenset(op for op in _RECIPES if runs_onednn_bf16(op, backward=True)
                     and not _runs(op, _RECIPES[op], True, False, cast_in="onednn"))


@functools.lru_cache(maxsize=None)
def plain_cast_readers(device: str, dtype: str, pir: bool = False) -> frozenset[str]:
    """The ops in front of which a rewrite's casts stay plain where the others go to oneDNN
    (``refuse_onednn_casts``); empty where no cast goes there (``cast`` not among
    ``onednn_kernels``)."""
    return refuse_onednn_casts() if "cast" in onednn_kernels(device, dtype, pir) \
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
_CONV = {"strides": [1, 1], "paddings": [0, 0], "dilations": [1, 1], "groups": 1}
_RECIPES: dict[str, _Recipe] = {
    "matmul_v2": ({"X": ((2, 3), True), "Y": ((3, 4), True)}, ("Out",), {}),
    "mul": ({"X": ((2, 3), True), "Y": ((3, 4), True)}, ("Out",), {}),
    "matmul": ({"X": ((2, 3), True), "Y": ((3, 4), True)}, ("Out",), {}),
    "conv2d": ({"Input": ((1, 2, 4, 4), True), "Filter": ((2, 2, 1, 1), True)}, ("Output",),
               _CONV),
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
def runs_onednn_bf16(op: str, backward: bool = False, pir: bool = False) -> bool:
    """Whether ``op`` (one of the recipes) runs in bfloat16 on oneDNN on this CPU, and its
    gradient too with ``backward``: a tiny legacy program with the native's oneDNN
    attributes, run once (with ``pir``, a PIR program, whose executor picks the kernel
    itself). An error (no primitive for this CPU, a dtype the kernel refuses) is the
    answer False, never raised."""
    return _runs(op, _RECIPES[op], backward, pir)


@functools.lru_cache(maxsize=None)
def slow_broadcast_grads(device: str, dtype: str, pir: bool = False) -> frozenset[str]:
    """Of the ops whose ``dtype`` kernel on ``device`` is oneDNN's, those whose gradient for
    an operand of fewer dimensions than the result runs a reference implementation, or
    fails (``onednn_log`` of the op's bf16 forward and backward on a 3-D input): such an
    instance would run slower than in float32, or not at all. Empty where oneDNN runs no
    bf16; where its log cannot be read, only the failures."""
    slow = set()
    for op in sorted(onednn_kernels(device, dtype, pir) & set(_BROADCAST_RECIPES)):
        with onednn_log() as log:
            ran = _runs(op, _BROADCAST_RECIPES[op], True, pir)
        if not ran or any(impl.startswith("ref") for _, impl in executed(log)):
            slow.add(op)
    return frozenset(slow)


def _runs(op: str, recipe: _Recipe, backward: bool, pir: bool,
          cast_in: Optional[str] = None) -> bool:
    """``runs_onednn_bf16`` for ``op`` built by ``recipe``; with ``cast_in`` ("onednn" or
    "plain"), between the casts a rewrite puts around it (``_build``)."""
    if pir:
        return _runs_in_pir(op, recipe, backward)
    inputs, outputs, attrs = recipe
    try:
        with _static(), stderr_silenced():
            main, startup = paddle.static.Program(), paddle.static.Program()
            with paddle.static.program_guard(main, startup):
                fetch = _build(main.global_block(), op, inputs, outputs, attrs, backward,
                               cast_in)
            exe = paddle.static.Executor(paddle.CPUPlace())
            exe.run(startup)
            feed = {f"probe_{name}": to_low(np.ones(shape), ONEDNN_DTYPE) if low and not cast_in
                    else np.ones(shape, np.float32) for name, (shape, low) in inputs.items()}
            got = exe.run(main, feed=feed, fetch_list=fetch)
        return all(np.all(np.isfinite(np.asarray(g, np.float32))) for g in got)
    except Exception:  # noqa: BLE001 - any failure to build or run is "no kernel here"
        return False


# op -> the PIR call on the recipe's inputs (by slot)
_PIR_CALLS: dict[str, Callable] = {
    "matmul_v2": lambda i: paddle.matmul(i["X"], i["Y"]),
    "mul": lambda i: paddle.matmul(i["X"], i["Y"]),
    "matmul": lambda i: paddle.matmul(i["X"], i["Y"]),
    "conv2d": lambda i: paddle.nn.functional.conv2d(i["Input"], i["Filter"]),
    "layer_norm": lambda i: paddle.nn.functional.layer_norm(i["X"], [4], i["Scale"], i["Bias"]),
    "reshape2": lambda i: paddle.reshape(i["X"], [-1, 3]),
    "relu": lambda i: paddle.nn.functional.relu(i["X"]),
    "elementwise_add": lambda i: paddle.add(i["X"], i["Y"]),
    "elementwise_sub": lambda i: paddle.subtract(i["X"], i["Y"]),
    "elementwise_mul": lambda i: paddle.multiply(i["X"], i["Y"]),
}


def _runs_in_pir(op: str, recipe: _Recipe, backward: bool) -> bool:
    """The recipe's op in a tiny PIR program, its bf16 result read by a bf16 op after it:
    Paddle 3.3.1's PIR oneDNN conv2d leaves float32 data in its bf16 output, which only a
    reader in bf16 finds ("does not match the type of data"). Every input needs a
    gradient (oneDNN's matmul_grad dies on one that needs none: ``rewrite``)."""
    inputs, _, _ = recipe
    if not hasattr(getattr(paddle, "pir_utils", None), "IrGuard"):
        return False  # Paddle 2.6: no PIR
    try:
        with _static("IrGuard"), stderr_silenced():
            main, startup = paddle.static.Program(), paddle.static.Program()
            with paddle.static.program_guard(main, startup):
                feeds, xs = {}, []
                for slot, (shape, low) in inputs.items():
                    x = paddle.static.data(f"probe_{slot}", list(shape), "float32")
                    x.stop_gradient = not backward
                    xs.append(x)
                    feeds[slot] = paddle.cast(x, ONEDNN_DTYPE) if low else x
                out = _PIR_CALLS[op](feeds)
                loss = paddle.mean(paddle.cast(paddle.scale(out, 2.0), "float32"))
                fetch = [loss]
                if backward:
                    fetch += [g for g in paddle.static.gradients([loss], xs) if g is not None]
            exe = paddle.static.Executor(paddle.CPUPlace())
            exe.run(startup)
            feed = {f"probe_{slot}": np.ones(shape, np.float32)
                    for slot, (shape, _) in inputs.items()}
            got = exe.run(main, feed=feed, fetch_list=fetch)
        return all(np.all(np.isfinite(np.asarray(g, np.float32))) for g in got)
    except Exception:  # noqa: BLE001 - any failure to build or run is "no kernel here"
        return False


def _build(block, op: str, inputs, outputs, attrs, backward: bool,
           cast_in: Optional[str] = None) -> list:
    """The recipe's op and, for ``backward``, its gradients, as raw legacy ops (Paddle 3's
    functional API builds PIR values by default, even under the legacy-IR guard); with
    ``cast_in`` ("onednn" or "plain"), its bf16 inputs cast from float32 feeds by such
    casts, and its result cast to float32 by a oneDNN cast (so the casts' gradients read
    what the op's gradient kernel leaves, and the other way round)."""
    def var(name, dtype, shape=None, **kw):
        return block.create_var(name=f"probe_{name}", dtype=dtype, shape=shape, **kw)

    feeds = {slot: var(slot, ONEDNN_DTYPE if low and not cast_in else "float32", list(shape),
                       stop_gradient=not backward)
             for slot, (shape, low) in inputs.items()}
    for v in feeds.values():
        v.desc.set_need_check_feed(False)
    for slot, (shape, low) in inputs.items():
        if low and cast_in:
            src, feeds[slot] = feeds[slot], var(f"{slot}_low", ONEDNN_DTYPE, list(shape),
                                                stop_gradient=not backward)
            _cast(block, src, feeds[slot], onednn=cast_in == "onednn")
    outs = {slot: var(f"{slot}_out", ONEDNN_DTYPE if i == 0 else "float32")
            for i, slot in enumerate(outputs)}
    block.append_op(type=op, inputs={k: [v] for k, v in feeds.items()},
                    outputs={k: [v] for k, v in outs.items()},
                    attrs={**attrs, **onednn_attrs()})
    first = outs[outputs[0]]
    if not backward:
        return [first]
    wide, loss = var("wide", "float32"), var("loss", "float32", [1])
    _cast(block, first, wide, onednn=cast_in is not None)
    block.append_op(type="mean", inputs={"X": [wide]}, outputs={"Out": [loss]})
    grads = paddle.base.backward.append_backward(loss)
    return [first, *(g for _, g in grads)]


def onednn_attrs(op=None) -> dict:
    """The attributes the native bf16 rewrite sets on a bf16 op, in the spellings the
    installed Paddle knows (2.6: ``use_mkldnn``/``mkldnn_data_type``; 3.x also accepts
    ``use_onednn``/``onednn_data_type``); for ``op``, only those it has."""
    out = {}
    for use, kind in (("use_mkldnn", "mkldnn_data_type"), ("use_onednn", "onednn_data_type")):
        if op is None or op.has_attr(use):
            out[use] = True
        if op is None or op.has_attr(kind):
            out[kind] = ONEDNN_DTYPE
    if op is None:  # a new op: the spellings this version's op makers declare
        out = {k: v for k, v in out.items() if k in _known_attrs()}
    return out


@functools.lru_cache(maxsize=None)
def _known_attrs() -> frozenset[str]:
    """Which oneDNN attribute spellings this Paddle's legacy ops carry (read off a matmul_v2)."""
    with _static():
        block = paddle.static.Program().global_block()
        x = block.create_var(name="x", dtype="float32", shape=[1, 1])
        op = block.append_op(type="matmul_v2", inputs={"X": [x], "Y": [x]},
                             outputs={"Out": [block.create_var(name="y", dtype="float32")]})
        return frozenset(a for a in ("use_mkldnn", "mkldnn_data_type", "use_onednn",
                                     "onednn_data_type") if op.has_attr(a))


def _cast(block, src, dst, onednn: bool = True) -> None:
    """A legacy ``cast`` of ``src`` into ``dst``, with the oneDNN attributes if ``onednn``."""
    block.append_op(type="cast", inputs={"X": [src]}, outputs={"Out": [dst]},
                    attrs={"in_dtype": src.dtype, "out_dtype": dst.dtype,
                           **(onednn_attrs() if onednn else {})})


@contextlib.contextmanager
def _static(ir_guard: str = "OldIrGuard"):
    """Static mode and a program IR for the probe (``OldIrGuard``: the legacy IR, a no-op on
    Paddle 2.6; ``IrGuard``: PIR, Paddle 3 only), restored after."""
    dynamic = paddle.in_dynamic_mode()
    paddle.enable_static()
    guard: Callable = getattr(getattr(paddle, "pir_utils", None), ir_guard,
                              contextlib.nullcontext)
    try:
        with guard():
            yield
    finally:
        if dynamic:
            paddle.disable_static()
