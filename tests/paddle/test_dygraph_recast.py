"""A bf16 GEMM in eager mode keeps no bf16 copy of an activation the backward keeps anyway in
float32 (issue 40, point 4: no copy that does not have to live; ``paddle_amp.dygraph.recast``).

A lowered Linear after a ReLU kept, until its backward, both the ReLU's float32 output (the
ReLU's gradient node saves it) and its bf16 cast (the GEMM's node saved it). Now the GEMM's
node saves the float32 tensor and casts it again when it reads it: the results and every
gradient are the route's own bit for bit, and the bytes the graph keeps after the forward are
counted exactly by Paddle's host allocator (``Allocated``, the live tensor bytes; not the
process's memory) against the bytes computed from the shapes.

The GEMM tests need oneDNN's bf16 GEMM, which the device truth (``isa.bf16_class``) says
this CPU class has (natively or emulated by oneDNN); the test of which gradient nodes keep
their output runs everywhere (float32)."""
import contextlib

import numpy as np
import paddle
import paddle.nn.functional as F
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from paddle.base import core

from amp_adapters.rules.isa import bf16_class, machine
from paddle_amp import dygraph as amp
from paddle_amp.dygraph import recast

NO_BF16 = pytest.mark.skipif(
    bf16_class(machine()) == "none",
    reason="the device truth (isa.bf16_class) says this CPU class has no oneDNN bf16 kernel "
           "(no AVX-512 in use): no bf16 GEMM to keep a copy for")

# an op producing each gradient node ``recast.KEEPS_OUTPUT`` names, on a float32 tensor
PRODUCERS = {"ReluGradNode": F.relu, "Relu6GradNode": F.relu6, "SigmoidGradNode": F.sigmoid,
             "TanhGradNode": paddle.tanh, "ExpGradNode": paddle.exp,
             "SqrtGradNode": paddle.sqrt, "RsqrtGradNode": paddle.rsqrt,
             "SoftmaxGradNode": F.softmax, "LogSoftmaxGradNode": F.log_softmax}


def _allocated() -> int:
    return int(core.host_memory_stat_current_value("Allocated", 0))


def _held_after_del(op, shape=(64, 1024)) -> int:
    """The bytes of ``op``'s output still allocated once the caller's last reference to it
    is gone (while the graph lives): kept by its gradient node."""
    h = paddle.to_tensor(np.abs(np.random.default_rng(0).standard_normal(shape))
                         .astype("float32") + 0.5, stop_gradient=False)
    out = op(h)
    before = _allocated()
    node = out.grad_fn
    del out
    held = int(np.prod(shape)) * 4 - (before - _allocated())
    del node
    return held


def test_the_gradient_nodes_said_to_keep_their_output_keep_it():
    """Each node of ``KEEPS_OUTPUT``, on the installed Paddle, is what its op creates and
    holds its output's bytes; GELU's node (which keeps its input) frees them: the check sees
    the difference."""
    assert set(PRODUCERS) == set(recast.KEEPS_OUTPUT)
    for name, op in PRODUCERS.items():
        h = paddle.ones([2, 2], "float32")
        h.stop_gradient = False
        assert op(h * 1.0).grad_fn.name() == name
        assert _held_after_del(lambda t: op(t * 1.0)) == 64 * 1024 * 4, name
    assert _held_after_del(lambda t: F.gelu(t * 1.0)) == 0


@contextlib.contextmanager
def _keeping(keeps):
    """``recast.KEEPS_OUTPUT`` = ``keeps`` for the block (empty: the route keeping its
    copy)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(recast, "KEEPS_OUTPUT", keeps)
        yield


def _linear_after(producer, shape, n, bias, keeps):
    """out, and the gradients of the producer's input, the weight and the bias, of
    ``F.linear(producer(h), w, b)`` in an O1-bf16 region with ``recast.KEEPS_OUTPUT`` =
    ``keeps`` (empty: the route as it was)."""
    rng = np.random.default_rng(sum(shape) + n)
    h = paddle.to_tensor(rng.standard_normal(shape).astype("float32"), stop_gradient=False)
    w = paddle.to_tensor(rng.standard_normal((shape[-1], n)).astype("float32") / 8,
                         stop_gradient=False)
    b = paddle.to_tensor(rng.standard_normal(n).astype("float32"), stop_gradient=False) \
        if bias else None
    with _keeping(keeps):
        with amp.auto_cast(policy="O1-bf16") as region:
            out = F.linear(producer(h), w, b)
        assert region.ran["matmul_v2"].execution == "kernel", region.ran["matmul_v2"]
        weights = paddle.to_tensor(np.cos(np.arange(out.size)).reshape(out.shape)
                                   .astype("float32"))
        (out * weights).sum().backward()
    return [t.numpy() for t in (out, h.grad, w.grad) + ((b.grad,) if bias else ())]


@NO_BF16
@settings(max_examples=8, deadline=None)
@given(producer=st.sampled_from(["relu", "sigmoid", "tanh"]),
       lead=st.sampled_from([(8,), (24,), (3, 8), (2, 5)]),
       k=st.sampled_from([16, 32, 48]), n=st.sampled_from([16, 40]), bias=st.booleans())
def test_a_linear_after_an_activation_gives_the_routes_results_bit_for_bit(producer, lead, k,
                                                                           n, bias):
    """Result and gradients (the activation's input, weight, bias) of a Linear on a ReLU,
    sigmoid or tanh output (2-D or a batch of sequences), recast in the backward: equal bit
    for bit to the route keeping the bf16 copy."""
    f = {"relu": F.relu, "sigmoid": F.sigmoid, "tanh": paddle.tanh}[producer]
    got = _linear_after(f, lead + (k,), n, bias, recast.KEEPS_OUTPUT)
    want = _linear_after(f, lead + (k,), n, bias, frozenset())
    for name, g, w in zip(("result", "d input", "d weight", "d bias"), got, want):
        assert np.array_equal(g, w), name


B, U = 512, 128  # large enough for the allocator to count each tensor exactly


class MLP(paddle.nn.Layer):
    """4 x (Linear(U) + ReLU), as the bench's MLP."""

    def __init__(self):
        super().__init__()
        self.layers = paddle.nn.LayerList([paddle.nn.Linear(U, U) for _ in range(4)])

    def forward(self, x):
        for layer in self.layers:
            x = F.relu(layer(x))
        return x


def _seeded(model, seed=0):
    """A new ``model`` and a [B, U] float32 input, drawn from ``seed``."""
    paddle.seed(seed)
    return model(), paddle.rand([B, U], "float32")


class ThreeHeads(paddle.nn.Layer):
    """One ReLU output read by three Linears (an attention's q, k, v): cast once a step
    (``stepcasts``), and no reader keeps the cast."""

    def __init__(self):
        super().__init__()
        self.inner = paddle.nn.Linear(U, U)
        self.q, self.k, self.v = (paddle.nn.Linear(U, U) for _ in range(3))

    def forward(self, x):
        h = F.relu(self.inner(x))
        return self.q(h) + self.k(h) + self.v(h)


def _kept_after_forward(net, x, region) -> int:
    """The tensor bytes allocated by ``net``'s forward and still held after it (by the
    result and the graph)."""
    before = _allocated()
    with region():
        out = net(x)
    kept = _allocated() - before
    out.sum().backward()
    net.clear_gradients()
    return kept


@NO_BF16
@pytest.mark.parametrize("model,gemms", [(MLP, 4), (ThreeHeads, 4)])
def test_after_the_forward_the_graph_keeps_no_bf16_copy_of_an_activation(model, gemms):
    """O1-bf16 keeps, beyond float32's, the bf16 casts of the weights (one per Linear) and of
    the model's input (a leaf: nothing else keeps it) and nothing more: no copy of a ReLU
    output (the MLP's three, the shared one of the three heads), counted exactly."""
    net, x = _seeded(model)
    from contextlib import nullcontext
    fp32 = _kept_after_forward(net, x, nullcontext)
    bf16 = _kept_after_forward(net, x, lambda: amp.auto_cast(policy="O1-bf16"))
    assert bf16 - fp32 == gemms * U * U * 2 + B * U * 2


@NO_BF16
def test_a_shared_activation_gives_the_routes_results_bit_for_bit():
    """The three heads' activation is cast once in the forward and its bf16 gradients summed
    before the cast's own gradient, as the route did: every gradient bit for bit."""
    def grads(keeps):
        net, x = _seeded(ThreeHeads, seed=1)
        with _keeping(keeps):
            before = _allocated()
            with amp.auto_cast(policy="O1-bf16"):
                out = net(x)
            kept = _allocated() - before
            (out * out).sum().backward()
        return kept, [out.numpy()] + [p.grad.numpy() for p in net.parameters()]
    (kept, got), (kept_before, want) = grads(recast.KEEPS_OUTPUT), grads(frozenset())
    assert kept_before - kept == B * U * 2  # the shared copy, recast in the backward
    for g, w in zip(got, want):
        assert np.array_equal(g, w)


@NO_BF16
def test_an_activation_written_in_place_after_the_gemm_is_refused_in_the_backward():
    """The backward would read the written value: it says what happened and what to do, and
    leaves gradients on."""
    h = paddle.rand([8, 32], "float32")
    h.stop_gradient = False
    w = paddle.rand([32, 16], "float32")
    w.stop_gradient = False
    with amp.auto_cast(policy="O1-bf16"):
        x = F.relu(h)
        out = F.linear(x, w)
    x.scale_(2.0)
    with pytest.raises(Exception, match="written in place after that GEMM"):
        out.sum().backward()
    assert paddle.is_grad_enabled()  # as the backward found it


@NO_BF16
def test_inside_a_users_saved_tensor_hooks_the_copy_is_kept_and_their_hooks_stay():
    """Paddle holds one pair of saved-tensor hooks at a time (its recompute uses them): in a
    user's block the GEMM keeps its bf16 copy as before, and every tensor saved in the block,
    after the GEMM too, goes through the user's hooks."""
    h = paddle.rand([8, 32], "float32")
    h.stop_gradient = False
    w = paddle.rand([32, 16], "float32")
    w.stop_gradient = False
    packed = []

    def pack(t):
        packed.append(tuple(t.shape))
        return t

    def unpack(t):
        out = core.eager.Tensor()
        t._share_buffer_to(out)
        return out
    with amp.auto_cast(policy="O1-bf16"):
        with paddle.autograd.saved_tensors_hooks(pack, unpack):
            out = F.relu(F.linear(F.relu(h), w))
    assert (8, 16) in packed[-1:], packed  # the ReLU after the GEMM: still the user's hooks
    assert packed.count((8, 32)) == 2, packed  # the first ReLU's output and the GEMM's copy
    out.sum().backward()
    assert h.grad is not None


def test_reading_a_tensors_producer_keeps_no_graph_alive():
    """``recast.producer`` reads the node's name; Paddle's ``Tensor.grad_fn`` alone keeps
    the node (one reference too many) and every tensor its graph saved."""
    w = paddle.rand([256, 256], "float32")
    w.stop_gradient = False
    before = _allocated()
    h = F.relu(paddle.matmul(paddle.rand([1024, 256], "float32"), w))
    assert [recast.producer(h) for _ in range(3)] == ["ReluGradNode"] * 3
    del h
    assert _allocated() == before


def _mlp_step_bytes(keeps):
    """(bytes held after the forward, after the backward while the graph is still
    referenced, after it is released) of an O1-bf16 MLP step, over the bytes before it."""
    net, x = _seeded(MLP)
    with _keeping(keeps):
        before = _allocated()
        with amp.auto_cast(policy="O1-bf16"):
            loss = net(x).mean()
        forward = _allocated() - before
        loss.backward()
        for p in net.parameters():
            p.clear_gradient(False)  # (released, not zeroed)
        backward = _allocated() - before
        del loss
        return forward, backward, _allocated() - before


@NO_BF16
def test_nothing_of_the_route_outlives_the_backward_or_the_graph():
    """After the backward, while the step's graph is still referenced (a loop keeps its loss
    into the next forward), the route holds what the route keeping the copy held (Paddle
    drops a node's saved tensors once it ran); once the graph goes, nothing at all."""
    fwd, bwd, end = _mlp_step_bytes(recast.KEEPS_OUTPUT)
    fwd0, bwd0, end0 = _mlp_step_bytes(frozenset())
    assert fwd0 - fwd == 3 * B * U * 2
    assert (bwd, end) == (bwd0, end0) and end == 0


RETAINED = r'''
import sys, numpy as np, paddle
import paddle.nn.functional as F
from paddle_amp import dygraph as amp
from paddle_amp.dygraph import recast
if sys.argv[1] == "copy":
    recast.KEEPS_OUTPUT = frozenset()
rng = np.random.default_rng(0)
h = paddle.to_tensor(rng.standard_normal((64, 32)).astype("float32"), stop_gradient=False)
w = paddle.to_tensor(rng.standard_normal((32, 16)).astype("float32"), stop_gradient=False)
with amp.auto_cast(policy="O1-bf16"):
    loss = F.linear(F.relu(h), w).mean()
loss.backward(retain_graph=True)
print("once", h.grad.numpy().tobytes().hex()[:64], w.grad.numpy().tobytes().hex()[:64], flush=True)
loss.backward()
print("twice", h.grad.numpy().tobytes().hex()[:64], w.grad.numpy().tobytes().hex()[:64], flush=True)
'''


@NO_BF16
def test_a_retained_graph_runs_again_as_the_route_keeping_the_copy_does(tmp_path):
    """``retain_graph=True``: the second backward casts the float32 tensor again, and gives
    what the route keeping the copy gives, in a child process each (on Paddle 2.6.2 that
    route's second backward kills the process, before and after this change)."""
    import os
    import subprocess
    import sys
    from pathlib import Path
    script = tmp_path / "retained.py"
    script.write_text(RETAINED)
    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "GLOG_minloglevel": "3",
           "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    runs = [subprocess.run([sys.executable, str(script), route], capture_output=True,
                           text=True, timeout=120, env=env) for route in ("recast", "copy")]
    said = [[line for line in r.stdout.splitlines() if line.startswith(("once", "twice"))]
            for r in runs]
    assert said[0] == said[1] and said[0], [(r.returncode, r.stdout[-800:]) for r in runs]
    assert (runs[0].returncode == 0) == (runs[1].returncode == 0)


@NO_BF16
def test_while_a_region_is_open_in_another_thread_the_copy_is_kept():
    """Paddle's saved-tensor hooks are one pair for the process: with a region open in
    another thread the GEMM keeps its copy as before (counted exactly), rather than set and
    reset them under the other thread's ops."""
    import threading
    opened, release = threading.Event(), threading.Event()

    def other():
        with amp.auto_cast(policy="O1-bf16"):
            opened.set()
            release.wait(30)
    t = threading.Thread(target=other)
    t.start()
    try:
        assert opened.wait(30)
        net, x = _seeded(MLP)
        from contextlib import nullcontext
        fp32 = _kept_after_forward(net, x, nullcontext)
        bf16 = _kept_after_forward(net, x, lambda: amp.auto_cast(policy="O1-bf16"))
    finally:
        release.set()
        t.join()
    assert bf16 - fp32 == 4 * U * U * 2 + 4 * B * U * 2  # the input's and 3 ReLUs' copies


def _grad_then_backward(keeps) -> list:
    """``paddle.grad`` for the weight only (the graph not retained), then ``backward``: what
    each gives, with ``recast.KEEPS_OUTPUT`` = ``keeps`` (empty: the route keeping its copy)."""
    rng = np.random.default_rng(3)
    h = paddle.to_tensor(rng.standard_normal((64, 32)).astype("float32"), stop_gradient=False)
    w = paddle.to_tensor(rng.standard_normal((32, 16)).astype("float32"), stop_gradient=False)
    with _keeping(keeps):
        with amp.auto_cast(policy="O1-bf16"):
            loss = F.linear(F.relu(h), w).mean()
        (gw,) = paddle.grad(loss, [w], retain_graph=False)
        loss.backward()  # paddle.grad ran on copies of the nodes: the graph is still whole
    return [gw.numpy(), h.grad.numpy(), w.grad.numpy()]


@NO_BF16
def test_a_backward_after_paddle_grad_gives_what_the_route_keeping_the_copy_gives():
    got, ref = _grad_then_backward(recast.KEEPS_OUTPUT), _grad_then_backward(frozenset())
    for a, b in zip(got, ref):
        assert np.array_equal(a, b)


def _attention(keeps) -> tuple:
    """``softmax(q @ k^T) @ v`` in an O1-bf16 region (the GEMMs of two activations: the
    ``_operand_gemm`` route), with ``recast.KEEPS_OUTPUT`` = ``keeps``: (the bytes the graph
    holds after the forward, the result and the gradients of q, k, v)."""
    rng = np.random.default_rng(5)
    q, k, v = (paddle.to_tensor(rng.standard_normal((2, 4, 16, 8)).astype("float32"),
                                stop_gradient=False) for _ in range(3))
    with _keeping(keeps):
        before = _allocated()
        with amp.auto_cast(policy="O1-bf16") as region:
            out = paddle.matmul(F.softmax(paddle.matmul(q, k, transpose_y=True), -1), v)
        assert region.ran["matmul_v2"].execution == "kernel", region.ran["matmul_v2"]
        held = _allocated() - before
        weights = paddle.to_tensor(np.cos(np.arange(out.size)).reshape(out.shape)
                                   .astype("float32"))
        (out * weights).sum().backward()
    return (held, *(t.numpy() for t in (out, q.grad, k.grad, v.grad)))


@NO_BF16
def test_a_gemm_of_a_softmax_output_keeps_no_copy_of_it_and_gives_the_same_bits():
    held, *got = _attention(recast.KEEPS_OUTPUT)
    held_before, *ref = _attention(frozenset())
    for a, b in zip(got, ref):
        assert np.array_equal(a, b)
    # the attention weights' bf16 copy (2x4x16x16, 2 bytes each) is no longer held
    assert held_before - held == 2 * 4 * 16 * 16 * 2
