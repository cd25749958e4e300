"""What this CPU runs in the low dtype in eager mode, and how an op gets there.

Paddle's eager dispatcher picks a plain CPU kernel by the tensors' place, and the CPU
build has no plain bf16 GEMM: ``paddle.matmul`` on bf16 tensors fails (2.6.2 and 3.3.1),
whatever ``FLAGS_use_mkldnn`` says. oneDNN's bf16 kernels are reached through the legacy
op entry (``paddle._legacy_C_ops``) with the attributes a program's native bf16 rewrite
sets (``use_mkldnn``, ``mkldnn_data_type``), forward and backward (its grad op inherits
them). That is the route (``ROUTES``). Two faults of that route are worked around:
oneDNN's bf16 ``matmul_v2_grad`` crashes the process (SIGSEGV) when one of its gradients
is not asked for, so the GEMM route never runs it (``matmul_v2``); and Paddle 2.6.2's
plain bf16 cast truncates, so the casts into bf16 go to oneDNN's cast, which rounds to
nearest even, wherever the plain one does not (``rounding_cast``, a probe, not a version).

``profile(dtype)`` is the device truth the planner reads: the ops whose route ran here,
forward and backward, on tiny inputs. Gated by the project's device truth
(``amp_adapters.rules.isa.bf16_class``: no oneDNN bf16 kernel on a CPU class ``"none"``, such as
``AMP_ADAPTERS_CPU=avx2``). float16 has no CPU kernel on either route (``emulate=True``
rounds through it instead). The probes run in the measuring child, once per machine,
Paddle build and project version, their answers kept on disk (``eager_answers``,
``amp_adapters.services.device_book``): what they load never stays in the process that
trains. Answers are cached per process.
"""
from __future__ import annotations

import functools
import math
from typing import Callable, Optional

import numpy as np

from amp_adapters import DeviceProfile
from amp_adapters.rules.isa import bf16_class, machine

ONEDNN_ATTRS = ("use_mkldnn", True, "mkldnn_data_type", "bfloat16")
CAST_SLICE_BYTES = 4 << 20  # the most of its input one oneDNN cast reads (``onednn_cast``)


def _eagerly(probe: Callable) -> Callable:
    """``probe`` run in dynamic mode: a region first opened while ``to_static`` builds a
    legacy program asks for the device truth there, and a probe's tensors need eager mode
    (its answer is cached for the process: a failure there would read as no kernel)."""
    @functools.wraps(probe)
    def run(*args):
        from paddle.base import framework
        if framework.in_dygraph_mode():
            return probe(*args)
        from paddle.base.dygraph import guard
        with guard():
            return probe(*args)
    return run


def _vartype(dtype: str) -> int:
    from paddle.base import core
    return int({"float32": core.VarDesc.VarType.FP32,
                "bfloat16": core.VarDesc.VarType.BF16}[dtype])


def onednn_cast(x, src: str, dst: str):
    """``x`` cast from ``src`` to ``dst`` by oneDNN (a reorder: round to nearest even).

    Paddle's eager entry to a oneDNN kernel copies each input whole before the kernel runs
    (``PreparePhiData``: the kernel's backend, ONEDNN, is not the tensor's, CPU; Paddle
    2.6.2 and 3.3.1), so one cast of a large ``x`` held a copy of it beside the result: a
    float32 64x128x1024 activation cost 32 MiB more at the step's peak. Where autograd
    records nothing (``_recorded``: untracked, or inside a PyLayer), a large ``x`` of two
    or more dimensions is cast in slices of its rows (the last dimension kept: the join of
    1-D oneDNN results, or their reshape, fails in oneDNN's next reorder), each at most
    ``CAST_SLICE_BYTES``, and joined: elementwise, so the same bits, and the copy is a
    slice's. One row larger than a slice is cast whole; an empty tensor by Paddle's plain
    cast (oneDNN's fails on it). The join costs a second copy of the result while it runs:
    a win only while Paddle copies inputs (2.6.2 is the Paddle whose rounding casts come
    here)."""
    import paddle
    from paddle import _C_ops, _legacy_C_ops
    shape = list(x.shape)
    if 0 in shape:  # oneDNN's cast fails on it ("could not create a primitive descriptor")
        return _C_ops.cast(x, getattr(paddle, dst))  # (no value to round)
    attrs = ("in_dtype", _vartype(src), "out_dtype", _vartype(dst), "use_mkldnn", True)
    rows = math.prod(shape[:-1])
    step = CAST_SLICE_BYTES // (shape[-1] * x.element_size()) if shape else 0
    if not 1 <= step < rows or _recorded(x):
        return _legacy_C_ops.cast(x, *attrs)
    matrix = _C_ops.reshape(x, [rows, shape[-1]])
    pieces = [_legacy_C_ops.cast(_C_ops.slice(matrix, [0], [i], [min(i + step, rows)], [1],
                                              []), *attrs) for i in range(0, rows, step)]
    return _C_ops.reshape(_C_ops.concat(pieces, 0), shape)


@functools.lru_cache(maxsize=None)
@_eagerly
def plain_cast_rounds() -> bool:
    """Whether Paddle's plain float32 -> bfloat16 cast rounds to nearest even (3.3.1) rather
    than truncating (2.6.2): ties to even both ways, and a value above a tie."""
    import paddle
    x = np.array([1 + 2 ** -8, 1 + 3 * 2 ** -8, -(1 + 2 ** -8 + 2 ** -12)], np.float32)
    got = paddle.to_tensor(x).astype("bfloat16").astype("float32").numpy()
    return bool(np.array_equal(got, np.array([1.0, 1 + 2 ** -6, -(1 + 2 ** -7)], np.float32)))


@functools.lru_cache(maxsize=None)
def rounding_cast() -> Callable:
    """``cast(x, name)``: ``x`` cast to the dtype named ``name`` ("bfloat16", "float16",
    "float32"), into bfloat16 rounding to nearest even (``plain_cast_rounds``)."""
    import paddle
    from paddle import _C_ops
    dtypes = {n: getattr(paddle, n) for n in ("bfloat16", "float16", "float32")}
    if plain_cast_rounds():
        return lambda x, name: _C_ops.cast(x, dtypes[name])

    def cast(x, name):
        if name == "bfloat16" and x.dtype == paddle.float32:
            if not _recorded(x) or x.is_leaf:
                return onednn_cast(x, "float32", "bfloat16")
            return _rounded_bf16()(x)
        return _C_ops.cast(x, dtypes[name])
    return cast


@functools.lru_cache(maxsize=None)
def _rounded_bf16() -> Callable:
    """oneDNN's rounding cast into bf16 for an activation in training, with Paddle's plain
    cast as its gradient. oneDNN's own cast gradient comes back in oneDNN's layout, and a
    reshape's gradient then aborts the process ("could not create a primitive descriptor
    for a reorder primitive", SIGABRT, Paddle 2.6.2: a Linear after a flatten, in any CNN).
    A PyLayer costs about 25 us a call here; rounding outside the graph and adding the
    difference costs 5-7x a cast."""
    import paddle
    from paddle import _C_ops

    class RoundedBf16(paddle.autograd.PyLayer):
        @staticmethod
        def forward(ctx, x):
            return onednn_cast(x, "float32", "bfloat16")

        @staticmethod
        def backward(ctx, dy):
            return _C_ops.cast(dy, paddle.float32)
    return RoundedBf16.apply


def _onednn_matmul(x, y, trans_x: bool = False, trans_y: bool = False):
    """oneDNN's bf16 ``matmul_v2`` kernel, forward (its own gradient kernel: ``matmul_v2``)."""
    from paddle import _legacy_C_ops
    return _legacy_C_ops.matmul_v2(x, y, "trans_x", trans_x, "trans_y", trans_y, *ONEDNN_ATTRS)


def _onednn_mul(x, y):
    """oneDNN's bf16 ``mul`` (``x`` [..., K] by a matrix ``y`` [K, N]): the same forward
    kernel as ``matmul_v2``'s, and a gradient kernel that computes only the gradients
    asked for."""
    from paddle import _legacy_C_ops
    return _legacy_C_ops.mul(x, y, "x_num_col_dims", len(x.shape) - 1, "y_num_col_dims", 1,
                             *ONEDNN_ATTRS)


def matmul_v2(x, y, trans_x: bool = False, trans_y: bool = False, x_from=None, y_from=None):
    """``matmul_v2`` on oneDNN in bfloat16 (``x``, ``y`` bf16; a bf16 result, float32 where
    both operands want a gradient and the GEMM is not a ``mul``). ``x_from``, ``y_from``: the
    float32 tensor an operand was cast from where the backward keeps it anyway
    (``recast.kept_source``): a ``mul`` then saves it, and casts it again when its gradient
    reads it, rather than keeping the bf16 copy (``recast``; the other routes keep theirs).

    oneDNN's bf16 ``matmul_v2_grad`` crashes the process (SIGSEGV, Paddle 2.6.2 and 3.3.1)
    when one of its two gradients is not asked for: an operand with ``stop_gradient`` set,
    or one ``paddle.grad`` prunes (an operand not among its ``inputs``). So its gradient
    never runs: where an operand wants one, a matrix ``y`` read untransposed (a Linear's
    weight) goes to oneDNN's ``mul``, whose gradient kernel tolerates a pruned gradient;
    any other GEMM to ``_operand_gemm``, one PyLayer per operand wanting a gradient, each
    with that operand as its only input (a PyLayer must return None for a pruned input,
    and cannot see which one is); where both want one, the result is float32 (Paddle's
    CPU ``add`` has no bf16 kernel, and oneDNN's fails on batches). A vector's transpose
    is ignored, as Paddle's own matmul does (oneDNN's kernel fails on it, or corrupts the
    heap)."""
    if trans_x and len(x.shape) == 1:
        trans_x = False
    if trans_y and len(y.shape) == 1:
        trans_y = False
    want_x, want_y = not x.stop_gradient, not y.stop_gradient
    if not (want_x or want_y) or not _grad_enabled():
        return _onednn_matmul(x, y, trans_x, trans_y)
    if not trans_x and not trans_y and len(y.shape) == 2 and len(x.shape) >= 2:
        if x_from is None and y_from is None:
            return _onednn_mul(x, y)
        from .recast import saving_recast
        return saving_recast(lambda: _onednn_mul(x, y), ((x, x_from), (y, y_from)), _to_bf16)
    gemm = _operand_gemm()
    kept = _Held((x_from, y_from)) if x_from is not None or y_from is not None else None
    if want_x and want_y:  # y's gradient edge: float32 zeros added to the result (exact)
        from paddle import _C_ops
        shared = _Held(None)  # the result's gradient in bf16, narrowed once for both
        out = gemm(x, _Held(y), 0, trans_x, trans_y, shared, None, kept)
        return _C_ops.add(out, gemm(y, _Held(x), 1, trans_x, trans_y, shared, _Held(out),
                                    kept))
    if want_x:
        return gemm(x, _Held(y), 0, trans_x, trans_y, None, None, kept)
    return gemm(y, _Held(x), 1, trans_x, trans_y, None, None, kept)


class _Held:
    """A tensor handed to a PyLayer out of its inputs' sight (no gradient edge to it)."""
    __slots__ = ("t",)

    def __init__(self, t):
        self.t = t


def _grad_enabled() -> bool:
    from paddle.base.framework import _dygraph_tracer
    tracer = _dygraph_tracer()
    return tracer is not None and tracer._has_grad


def _recorded(x) -> bool:
    """Whether autograd records an op on ``x`` here: ``x`` wants a gradient and gradients
    are on (off inside a PyLayer's forward and backward)."""
    return not x.stop_gradient and _grad_enabled()


def _to_bf16(x):
    """float32 ``x`` in bf16, rounded to nearest even (``plain_cast_rounds``), untracked."""
    import paddle
    from paddle import _C_ops
    return _C_ops.cast(x, paddle.bfloat16) if plain_cast_rounds() else \
        onednn_cast(x, "float32", "bfloat16")


def _summed_to(g, shape: list, final: list):
    """The gradient ``g`` of a GEMM operand of matrix ``shape`` (broadcast: fewer or size-1
    batch dimensions), ``final`` its own shape (a vector's differs): the batch's bf16
    products summed in float32 and rounded once, as oneDNN's own grad kernel does
    (bit-identical here). Reshaped in float32: a oneDNN result's reshape fails in oneDNN's
    cast gradient ("could not create a primitive descriptor for a reorder primitive")."""
    import paddle
    from paddle import _C_ops
    if list(g.shape) == list(shape) == list(final):
        return g
    lead = len(g.shape) - len(shape)
    axes = list(range(lead)) + [lead + i for i, n in enumerate(shape[:-2])
                                if n == 1 and g.shape[lead + i] != 1]
    g32 = _C_ops.cast(g, paddle.float32)
    if axes:
        g32 = _C_ops.sum(g32, axes, None, True)
    return _to_bf16(_C_ops.reshape(g32, list(final)))


def _gemm_grad(x, y, d, trans_x: bool, trans_y: bool, which: int):
    """The gradient of operand ``which`` (0: ``x``, 1: ``y``) of ``matmul_v2(x, y, trans_x,
    trans_y)`` for the result's gradient ``d``, by oneDNN's bf16 forward kernel: the
    products Paddle's grad kernel computes, per transpose combination."""
    from paddle import _C_ops
    mm = _onednn_matmul
    x_shape, y_shape = list(x.shape), list(y.shape)
    if len(x_shape) == 1 or len(y_shape) == 1:  # a vector as a matrix, and the result
        shape = list(d.shape) + [1] if len(y_shape) == 1 else list(d.shape)
        if len(x_shape) == 1:
            x = _C_ops.reshape(x, [1, x_shape[0]])
            shape = shape[:-1] + [1] + shape[-1:]
        if len(y_shape) == 1:
            y = _C_ops.reshape(y, [y_shape[0], 1])
        d = _C_ops.reshape(d, shape)
    if which == 0:
        g = mm(d, y, False, not trans_y) if not trans_x else mm(y, d, trans_y, True)
        return _summed_to(g, list(x.shape), x_shape)
    g = mm(x, d, not trans_x, False) if not trans_y else mm(d, x, True, trans_x)
    return _summed_to(g, list(y.shape), y_shape)


@functools.lru_cache(maxsize=None)
def _operand_gemm() -> Callable:
    """``gemm(t, other, which, trans_x, trans_y, shared, zeros_like)``: ``matmul_v2`` on
    oneDNN in bf16 of ``t`` (operand ``which``) and ``other.t``, whose backward is ``t``'s
    gradient only (``_gemm_grad``). With ``shared`` (a holder) the result is widened to
    float32 (as the route's own cast would), and with ``zeros_like`` too (a held result)
    float32 zeros of that shape instead, the second operand's gradient edge (added to the
    result: exact); the pair narrows the result's gradient to bf16 once, by Paddle's plain
    cast, as the gradient of the route's cast does. Gradients bit-identical to oneDNN's
    ``matmul_v2_grad``'s (transposes, batches, broadcasting)."""
    import paddle
    from paddle import _C_ops

    from .recast import Recipe

    class OperandGemm(paddle.autograd.PyLayer):
        @staticmethod
        def forward(ctx, t, other, which, trans_x, trans_y, shared, zeros_like, kept=None):
            operands = (t, other.t) if which == 0 else (other.t, t)
            sources = kept.t if kept is not None else (None, None)
            # an operand whose float32 source the backward keeps anyway is held as that
            # source and cast again in the backward (``recast``); the other as it is
            ctx.gemm = (tuple(Recipe(src, _to_bf16) if src is not None else low
                              for low, src in zip(operands, sources)),
                        trans_x, trans_y, which)
            ctx.shared = shared
            if zeros_like is not None:
                return paddle.zeros(zeros_like.t.shape, paddle.float32)
            out = _onednn_matmul(*operands, trans_x, trans_y)
            return out if shared is None else _C_ops.cast(out, paddle.float32)

        @staticmethod
        def backward(ctx, d):
            held, trans_x, trans_y, which = ctx.gemm
            x, y = (h.make() if isinstance(h, Recipe) else h for h in held)
            if ctx.shared is not None:
                if ctx.shared.t is None:
                    ctx.shared.t = _C_ops.cast(d, paddle.bfloat16)
                d = ctx.shared.t
            return _gemm_grad(x, y, d, trans_x, trans_y, which)
    return OperandGemm.apply


def conv2d(x, w, strides=(1, 1), paddings=(0, 0), padding_algorithm="EXPLICIT",
           dilations=(1, 1), groups=1, data_format="NCHW"):
    """``conv2d`` on oneDNN in bfloat16 through the legacy op entry, with the attributes
    Paddle's static bf16 rewrite sets (2.6.2 and 3.3.1). It fails in eager mode in both
    versions: the oneDNN kernel names its weight cache by the inputs' variable names, read
    from a program's context (``OneDnnContext::GetInputsName("Filter")``), which the eager
    entry does not fill; the phi API picks the plain CPU kernel (no bf16) even for a tensor
    in oneDNN's layout. The probe (``lowp_kernels``) keeps asking, so a Paddle that fills it
    gets the route."""
    from paddle import _legacy_C_ops
    return _legacy_C_ops.conv2d(x, w, "strides", list(strides), "paddings", list(paddings),
                                "padding_algorithm", padding_algorithm,
                                "dilations", list(dilations), "groups", groups,
                                "data_format", data_format, *ONEDNN_ATTRS)


# program op -> its oneDNN bf16 call in eager mode
ROUTES: dict[str, Callable] = {"matmul_v2": matmul_v2, "conv2d": conv2d}
GEMMS = frozenset({"matmul_v2"})  # the routes whose broadcast gradient is checked


def _probe(op: str, dtype: str, x_shape=(2, 3)) -> Optional[str]:
    """``op``'s route, forward and backward, on tiny ``dtype`` inputs that both want a
    gradient (a GEMM: ``x_shape`` @ 3x4; conv2d: 1x1x3x3 by 1x1x2x2), checked against the
    plain float32 op (exact on these values): None where it runs, else why not."""
    import paddle
    from paddle import _C_ops
    try:
        shapes = ((1, 1, 3, 3), (1, 1, 2, 2)) if op == "conv2d" else (x_shape, (3, 4))
        x, y = (paddle.to_tensor(np.ones(s, np.float32), stop_gradient=False) for s in shapes)
        x32, y32 = (paddle.to_tensor(np.ones(s, np.float32), stop_gradient=False)
                    for s in shapes)
        cast = rounding_cast()
        out = ROUTES[op](cast(x, dtype), cast(y, dtype))
        out.astype("float32").sum().backward()
        ref = _C_ops.conv2d(x32, y32, [1, 1], [0, 0], "EXPLICIT", [1, 1], 1, "NCHW") \
            if op == "conv2d" else paddle.matmul(x32, y32)
        ref.sum().backward()
        same = all(np.allclose(a.numpy(), b.numpy()) for a, b in
                   ((out.astype("float32"), ref), (x.grad, x32.grad), (y.grad, y32.grad)))
        return None if same else "its results differ from float32's"
    except Exception as e:  # no kernel, a dtype the kernel refuses: no route here
        return str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__


def _runs(op: str, dtype: str, x_shape=(2, 3)) -> bool:
    return _probe(op, dtype, x_shape) is None


@functools.lru_cache(maxsize=None)
def _answers(dtype: str) -> dict:
    """``eager_answers(dtype)``, asked once per machine, Paddle build and set of ``ROUTES`` in
    the measuring child and kept on disk (``amp_adapters.services.device_book``): the probes'
    oneDNN primitives and tensors never load in the process that trains."""
    from amp_adapters.services import device_book

    from ..kernels import paddle_build
    return device_book.answer("paddle", paddle_build(),
                              f"eager {dtype} routes={','.join(sorted(ROUTES))}",
                              "paddle_amp.speed_child", eager_answers, dtype)


@_eagerly
def eager_answers(dtype: str) -> dict:
    """Found here by running the probes: {"runs": the routes probed that ran, "missing":
    ``missing_routes``, "slow": ``slow_broadcast_grads``} in ``dtype`` on a CPU whose class
    has bf16 (what the measuring child runs, ``_answers``). What runs is named, never
    derived from what is missing: a route the answer does not name was not probed."""
    why = {op: _probe(op, dtype) for op in ROUTES}
    runs = sorted(op for op, reason in why.items() if reason is None)
    missing = {op: reason for op, reason in why.items() if reason is not None}
    from ..onednn_log import slow_or_failing
    slow = [op for op in sorted(set(runs) & GEMMS)
            if slow_or_failing(lambda: _runs(op, dtype, x_shape=(2, 2, 3)))]
    return {"runs": runs, "missing": missing, "slow": slow}


def _has_bf16(dtype: str) -> bool:
    return dtype == "bfloat16" and bf16_class(machine()) != "none"


@functools.lru_cache(maxsize=None)
def missing_routes(dtype: str) -> dict[str, str]:
    """{op: why its ``dtype`` route does not run here} (empty on a CPU class without bf16,
    where the device truth says why)."""
    return dict(_answers(dtype)["missing"]) if _has_bf16(dtype) else {}


@functools.lru_cache(maxsize=None)
def lowp_kernels(dtype: str) -> frozenset[str]:
    """The program ops whose ``dtype`` route runs here in eager mode, forward and backward:
    the routes the probes ran (an answer's ``runs``; a route it does not name is not used)."""
    return frozenset(_answers(dtype).get("runs", ())) & frozenset(ROUTES) \
        if _has_bf16(dtype) else frozenset()


@functools.lru_cache(maxsize=None)
def slow_broadcast_grads(dtype: str) -> frozenset[str]:
    """Of ``lowp_kernels``, the ops whose gradient for an operand of fewer dimensions than the
    result (a Linear's weight on a batch of sequences) runs a reference implementation in
    oneDNN's log, or fails: such a training step ran 2-3x slower than float32 here (Paddle
    2.6.2 and 3.3.1), so the planner keeps those instances float32
    (``DeviceProfile.refusal``), as the static drop-in does. Where the log cannot be read,
    only the failures."""
    return frozenset(_answers(dtype)["slow"]) if _has_bf16(dtype) else frozenset()


@functools.lru_cache(maxsize=None)
def device_profile(dtype: str, training: bool = True) -> DeviceProfile:
    """The device truth for eager ops in ``dtype`` on this CPU: for ``training``, gradients
    too; else for a forward that records no gradient (``DeviceProfile.for_inference``)."""
    if not training:
        return device_profile(dtype).for_inference()
    kernels = lowp_kernels(dtype)
    return DeviceProfile(kernels=kernels, onednn=kernels, training=True,
                         slow_broadcast_grads=slow_broadcast_grads(dtype),
                         name=f"this CPU in eager mode ({bf16_class(machine())} bf16 class)")


def forget() -> None:
    """Read the device truth again at the next question (every answer above is cached for
    the process): after the CPU class changes under it (``AMP_ADAPTERS_CPU`` set by a test).
    The probes of what runs are not forgotten: they ran on this CPU."""
    for cached in (_answers, missing_routes, lowp_kernels, slow_broadcast_grads,
                   device_profile):
        cached.cache_clear()
