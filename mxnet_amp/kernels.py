"""Which ops have a low-precision kernel on a device, found by probing it once.

MXNet 1.9.1's CPU build has no float16 GEMM/convolution (FullyConnected,
Convolution, dot, batch_dot, np.matmul, ...) while elementwise ops, softmax,
LayerNorm and reductions work in float16. Rather than a hand-kept table, each
op the planner asks about is run once on a tiny input of the target dtype on
that device; the answer is cached per (device type, dtype, op, direction). The
probe waits on its result: one host sync per op per device type, once per process.

bfloat16 runs through oneDNN on CPUs with AVX-512 (for real with ``avx512_bf16``);
elsewhere oneDNN "could not create a primitive descriptor iterator": the probe
finds that out on the machine, it is never assumed. For training (``backward``)
the op's gradient is probed too: a forward kernel without its backward one
would crash the first training step.
"""
from __future__ import annotations

import collections.abc
import hashlib
from typing import Callable, Iterator, Sequence

import mxnet as mx
from mxnet import autograd
from mxnet import ndarray as nd

from amp_adapters import DeviceProfile, OpDecision, Policy
from amp_adapters.services.fallback import FallbackNotices
from amp_adapters.services.quiet import stderr_silenced

from ._mx import cast, dtype_name, unpatched

_Make = Callable[..., "nd.NDArray"]


def _np(make: _Make) -> _Make:
    return lambda *shape: make(*shape).as_np_ndarray()


# op -> a call on tiny inputs built by make(*shape) in the probed dtype.
_RECIPES: dict[str, Callable[[_Make], object]] = {
    "FullyConnected": lambda a: nd.FullyConnected(a(2, 3), a(4, 3), a(4), num_hidden=4),
    "Convolution": lambda a: nd.Convolution(a(1, 1, 3, 3), a(1, 1, 1, 1), a(1), kernel=(1, 1),
                                            num_filter=1),
    "Deconvolution": lambda a: nd.Deconvolution(a(1, 1, 3, 3), a(1, 1, 1, 1), a(1),
                                                kernel=(1, 1), num_filter=1, no_bias=False),
    "RNN": lambda a: nd.RNN(a(1, 1, 1), a(4), a(1, 1, 1), state_size=1, num_layers=1,
                            mode="rnn_tanh"),
    "Activation": lambda a: nd.Activation(a(2, 2), act_type="relu"),
    "Pooling": lambda a: nd.Pooling(a(1, 1, 2, 2), kernel=(2, 2), pool_type="max"),
    "BatchNorm": lambda a: nd.BatchNorm(a(1, 1, 2, 2), *(nd.ones((1,)) for _ in range(4))),
    "Embedding": lambda a: nd.Embedding(nd.zeros((2,)), a(3, 2), input_dim=3, output_dim=2),
    "dot": lambda a: nd.dot(a(2, 2), a(2, 2)),
    "batch_dot": lambda a: nd.batch_dot(a(1, 2, 2), a(1, 2, 2)),
    "_linalg_gemm": lambda a: nd.linalg.gemm(a(2, 2), a(2, 2), a(2, 2)),
    "_linalg_gemm2": lambda a: nd.linalg.gemm2(a(2, 2), a(2, 2)),
    "_npi_matmul": lambda a: mx.np.matmul(_np(a)(2, 2), _np(a)(2, 2)),
    "_np_dot": lambda a: mx.np.dot(_np(a)(2, 2), _np(a)(2, 2)),
    "_npi_einsum": lambda a: mx.np.einsum("ij,jk->ik", _np(a)(2, 2), _np(a)(2, 2)),
    "_npx_batch_dot": lambda a: mx.npx.batch_dot(_np(a)(1, 2, 2), _np(a)(1, 2, 2)),
    "_npx_fully_connected": lambda a: mx.npx.fully_connected(
        _np(a)(2, 3), _np(a)(4, 3), _np(a)(4), num_hidden=4),
    "_npx_convolution": lambda a: mx.npx.convolution(
        _np(a)(1, 1, 3, 3), _np(a)(1, 1, 1, 1), _np(a)(1), kernel=(1, 1), num_filter=1),
    "_npx_deconvolution": lambda a: mx.npx.deconvolution(
        _np(a)(1, 1, 3, 3), _np(a)(1, 1, 1, 1), _np(a)(1), kernel=(1, 1), num_filter=1,
        no_bias=False),
    "_npx_rnn": lambda a: mx.npx.rnn(_np(a)(1, 1, 1), _np(a)(4), _np(a)(1, 1, 1), state_size=1,
                                     num_layers=1, mode="rnn_tanh"),
}


def _generic(op: str) -> Callable[[_Make], object]:
    """A unary, then binary, call of the legacy op ``op`` (for ops without a recipe)."""
    def call(a: _Make) -> object:
        fn = getattr(nd, op, None) or getattr(nd._internal, op)
        try:
            return fn(a(2, 2))
        except (TypeError, mx.base.MXNetError):
            return fn(a(2, 2), a(2, 2))
    return call


def _runs(recipe: Callable[[_Make], object], ctx: mx.Context, dtype: str,
          backward: bool = False) -> bool:
    leaves: list = []

    def make(*shape: int) -> nd.NDArray:
        with autograd.pause():  # a leaf: made outside the recorded graph
            x = cast(nd.ones(shape, ctx=ctx), dtype)
        if backward:
            x.attach_grad()
            leaves.append(x)
        return x
    try:
        with unpatched(), ctx, stderr_silenced():
            with autograd.record() if backward else autograd.pause():
                out = recipe(make)
            outs = out if isinstance(out, (list, tuple)) else [out]
            if backward:
                autograd.backward([o for o in outs if dtype_of(o) == dtype] or outs[:1])
                outs = [x.grad for x in leaves if x.grad is not None] or outs
            for o in outs:
                o.wait_to_read()  # host sync: errors surface here, once per op
        return True
    except (mx.base.MXNetError, TypeError, AttributeError, ValueError):
        _drain(ctx)
        return False


def _drain(ctx: mx.Context) -> None:
    """Let a failed probe's pending errors surface now, silenced, instead of in the next
    probe's (or the user's) wait."""
    with stderr_silenced():
        try:
            nd.waitall()
        except mx.base.MXNetError:
            pass


def dtype_of(x: object) -> str:
    return dtype_name(getattr(x, "dtype", "float32"))


def _probe(op: str, ctx: mx.Context, dtype: str, backward: bool) -> bool:
    """``has_kernel``'s answer found here, by running ``op``'s recipe (or ``_generic``'s call)
    on ``ctx``: forward, and with ``backward`` forward then backward (asked only where the
    forward runs: the callers check that first). An op the probe cannot call even in
    float32 is assumed to have the kernel (``has_kernel``)."""
    recipe = _RECIPES.get(op) or _generic(op)
    return _runs(recipe, ctx, dtype, backward) or not _runs(recipe, ctx, "float32", backward)


def _mp_update_runs(ctx: mx.Context, dtype: str) -> bool:
    """``has_mp_update``'s answer found here, by running ``mp_sgd_update`` on ``ctx``."""
    def call(a: _Make) -> object:
        w, master = a(4), nd.ones((4,), ctx=ctx)
        return nd.mp_sgd_update(w, a(4), master, lr=0.1, out=w)
    return _runs(call, ctx, dtype)


def batch_ops(dtype: str) -> list[str]:
    """The ops one question asks about at once (``kernel_answers``): every op with a recipe
    and those the native default lists lower in ``dtype`` (``amp-adapters info``'s table)."""
    from amp_adapters import effective_lists
    lowered = effective_lists(Policy.preset("mxnet-native", dtype=dtype), "mxnet")["lower"]
    return sorted(set(_RECIPES) | set(lowered))


def mxnet_build() -> str:
    """The MXNet build a kernel answer holds for (``device_book``'s key): its version, the
    features it is compiled with (two builds of one version, with or without oneDNN, run
    other kernels; MXNet 1.9.1 exposes no commit) and whether CUDA is among them."""
    features = mx.runtime.Features()
    enabled = ",".join(sorted(name for name, f in features.items() if f.enabled))
    digest = hashlib.sha1(enabled.encode()).hexdigest()[:10]
    return f"{mx.__version__} features={digest} cuda={features.is_enabled('CUDA')}"


def kernel_answers(dtype: str, ops: "list[str] | None" = None) -> dict:
    """``has_kernel``'s answers on the CPU for ``ops`` (default: ``batch_ops``), forward and
    backward, found here by running the probes, and with the default batch
    ``has_mp_update``'s: what the measuring child runs (``mxnet_amp.speed_child``,
    ``_asked``). JSON: {"forward": {op: bool}, "backward": {op: bool}[, "mp_update": bool]}."""
    ctx = mx.cpu()
    names = batch_ops(dtype) if ops is None else list(ops)
    got: dict = {"forward": {op: _probe(op, ctx, dtype, False) for op in names}}
    got["backward"] = {op: got["forward"][op] and _probe(op, ctx, dtype, True) for op in names}
    if ops is None:
        got["mp_update"] = _mp_update_runs(ctx, dtype)
    return got


def _asked(dtype: str, op: "str | None" = None) -> dict:
    """``kernel_answers(dtype)`` (``op`` None: the batch) or ``kernel_answers(dtype, [op])``,
    asked once per machine (its simulated CPU class and oneDNN limits included), MXNet build
    and project version in the measuring child and kept on disk
    (``amp_adapters.services.device_book``): what the probes load (oneDNN primitives, JIT
    code, freed memory the heap keeps: +15.4 MiB resident after six ops' probes, most of it
    the engine's first use, which a step pays too; 2 MiB of the bench's CNN step's peak)
    never stays in the process that trains. Where the child gives no answer it is asked
    here (with a warning once); a measuring child asks itself."""
    from amp_adapters.services import device_book
    question = f"kernels cpu {dtype}" + ("" if op is None else f" op {op}")
    args = (dtype,) if op is None else (dtype, [op])
    return device_book.answer("mxnet", mxnet_build(), question, "mxnet_amp.speed_child",
                              kernel_answers, *args)


def _keep(dtype: str, got: dict) -> None:
    """Hold ``kernel_answers``' answers in this process's cache (``_probed``, ``_mp_probed``);
    an op a kept answer does not name is asked again, never assumed."""
    for direction, backward in (("forward", False), ("backward", True)):
        for op, ok in got.get(direction, {}).items():
            _probed.setdefault(("cpu", dtype, op, backward), bool(ok))
    if "mp_update" in got:
        _mp_probed.setdefault(("cpu", dtype), bool(got["mp_update"]))


_probed: dict[tuple[str, str, str, bool], bool] = {}
_batched: set[str] = set()  # the dtypes whose batch this process asked


def _from_book(op: "str | None", dtype: str) -> None:
    """Fill this process's cache with the batch's answers for ``dtype`` (once), then, if
    ``op`` is still unanswered (outside the batch, or a kept batch that does not name it),
    with ``op``'s own answer, asked in the child as well and kept beside the batch."""
    if dtype not in _batched:
        _keep(dtype, _asked(dtype))
        _batched.add(dtype)
    if op is not None and ("cpu", dtype, op, False) not in _probed:
        _keep(dtype, _asked(dtype, op))


def forget() -> None:
    """Drop this process's answers (the next question reads the device book again)."""
    _probed.clear()
    _mp_probed.clear()
    _batched.clear()


def _in_child_book(ctx: mx.Context) -> bool:
    """Whether ``ctx``'s kernel questions go to the device book: the CPU's, asked from a
    process that is not itself a measuring child. A GPU's are probed in this process: the
    child would have to see the same device, and the answers of a GPU are not keyed by it
    in the book (a GPU's probe leaves its memory on the GPU's own allocator anyway)."""
    from amp_adapters.services import measure_process
    return ctx.device_type == "cpu" and not measure_process.serving


def has_kernel(op: str, ctx: mx.Context, dtype: str, backward: bool = False) -> bool:
    """True if ``op`` computes in ``dtype`` on ``ctx``'s device type (probed once, cached);
    with ``backward``, its gradient too (training).

    On the CPU the probes run in the measuring child, their answers kept on disk
    (``_asked``); on a GPU, here. An op the probe cannot call even in float32 (no recipe,
    unusual arity) is assumed to have the kernel: it is not a GEMM/conv, whose recipes are
    known.
    """
    key = (ctx.device_type, dtype, op, backward)
    if key not in _probed and _in_child_book(ctx):
        _from_book(op, dtype)
    if key not in _probed:  # a gradient only where the forward runs (as the probe asks)
        _probed[key] = (not backward or has_kernel(op, ctx, dtype)) and \
            _probe(op, ctx, dtype, backward)
    return _probed[key]


class KernelSet(collections.abc.Set):
    """The ops with a ``dtype`` kernel on ``ctx``, as the ``lowp_kernels`` set of ``plan_op``;
    with ``backward`` (training), the ops whose gradient has one too.

    Membership is probed lazily on first ask; iterating lists the ops probed so far.
    """

    def __init__(self, ctx: mx.Context, dtype: str, backward: bool = False):
        self.ctx, self.dtype, self.backward = ctx, dtype, backward

    def __contains__(self, op: object) -> bool:
        return isinstance(op, str) and has_kernel(op, self.ctx, self.dtype, self.backward)

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(op for (dev, dt, op, bw), ok in _probed.items()
                           if ok and dev == self.ctx.device_type and dt == self.dtype
                           and bw == self.backward))

    def __len__(self) -> int:
        return sum(1 for _ in self)


def device_profile(ctx: mx.Context, policy: Policy, training: bool) -> DeviceProfile:
    """What ``ctx``'s device runs in ``policy.dtype`` (``amp_adapters.rules.device``): the ops
    whose kernel runs there, forward and, for ``training``, backward (probed lazily,
    ``KernelSet``); the measured-speed lookup is ``speed_source.profile``'s to add (under
    ``Policy.speed == "measured"``). MXNet picks oneDNN by itself, so no op needs a route
    asked for."""
    return DeviceProfile(KernelSet(ctx, policy.dtype, backward=training), training=training)


_notices = FallbackNotices("mxnet_amp")


def log_fallback(op: str, ctx: mx.Context, decision: OpDecision) -> None:
    """Warn, once per op and device type, that ``op`` runs in float32 for lack of a kernel
    (INFO when it is emulated)."""
    _notices.note(op, str(ctx), decision)


def summarize_fallbacks(what: str, decisions: Sequence[OpDecision], ctx: mx.Context) -> None:
    """One line about a model: ops in the low dtype, in float32 and why (when any lacks a
    kernel here; see ``amp_adapters.services.fallback.summary``)."""
    _notices.summarize(what, decisions, str(ctx))


def forget_fallback_logs() -> None:
    """Let the next ``init`` log its fallbacks again (called by ``reset``)."""
    _notices.forget()


def lowp_kernels(device: str, dtype: str) -> frozenset[str]:
    """Op names with a ``dtype`` kernel on ``device`` ('CPU' or 'GPU'), forward and backward:
    the GEMM/conv recipes and the ops the native default lists lower (``amp-adapters info``).
    No GPU: empty."""
    from amp_adapters import effective_lists
    if device.upper() == "GPU":
        if mx.context.num_gpus() == 0:
            return frozenset()
        ctx = mx.gpu(0)
    else:
        ctx = mx.cpu()
    lowered = effective_lists(Policy.preset("mxnet-native", dtype=dtype), "mxnet")["lower"]
    return frozenset(op for op in sorted(set(_RECIPES) | set(lowered))
                     if has_kernel(op, ctx, dtype, backward=True))


_mp_probed: dict[tuple[str, str], bool] = {}


def has_mp_update(ctx: mx.Context, dtype: str) -> bool:
    """True if MXNet's fused multi-precision update (``mp_sgd_update``: a ``dtype`` weight, its
    float32 master) runs on ``ctx``'s device type. MXNet 1.9.1 registers it for float16
    only ("Unknown type enum 12" for bfloat16); probed once, not assumed (on the CPU in the
    measuring child, with the batch of ``kernel_answers``)."""
    key = (ctx.device_type, dtype)
    if key not in _mp_probed and _in_child_book(ctx):
        _from_book(None, dtype)
    if key not in _mp_probed:
        _mp_probed[key] = _mp_update_runs(ctx, dtype)
    return _mp_probed[key]
