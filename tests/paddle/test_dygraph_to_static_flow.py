"""paddle.jit.to_static of a forward with a region around control flow that depends on a
tensor (a converted ``if``, a ``for`` over a tensor's range): the ops inside the branches
and the loop body get the region's decisions as in eager mode, in both IRs. In a legacy
program (Paddle 2.6.2, or 3.x with FLAGS_enable_pir_api=0) they sit in sub-blocks, which the
region's rewrite walks; before, they ran float32. A region opened inside a branch decides
its own ops there, as in eager mode."""
import numpy as np
import paddle
import pytest

from amp_adapters.rules.isa import bf16_class, machine
from paddle_amp import dygraph as amp

pytestmark = pytest.mark.skipif(
    bf16_class(machine()) == "none", reason="the device truth (isa.bf16_class) says this CPU "
    "class has no oneDNN bf16 kernel: nothing runs bf16 to compare")


def _legacy_paddle3() -> bool:
    return paddle.__version__.startswith("3.") and not paddle.framework.use_pir_api()


class Branches(paddle.nn.Layer):
    """A bf16 region around a tensor-dependent ``if``; its else branch opens a region of its
    own that keeps the layer float32."""

    def __init__(self):
        super().__init__()
        self.a = paddle.nn.Linear(16, 16, bias_attr=False)
        self.b = paddle.nn.Linear(16, 16, bias_attr=False)

    def forward(self, x):
        with amp.auto_cast(dtype="bfloat16"):
            if x.mean() > 0:
                h = self.a(x)
            else:
                with amp.auto_cast(enable=False):
                    h = self.b(x)
            return h


class Loop(paddle.nn.Layer):
    """A bf16 region around a ``for`` over a tensor's range."""

    def __init__(self):
        super().__init__()
        self.a = paddle.nn.Linear(16, 16, bias_attr=False)
        self.c = paddle.nn.Linear(16, 16, bias_attr=False)

    def forward(self, x, n):
        with amp.auto_cast(dtype="bfloat16"):
            h = self.a(x)
            for _ in range(n):
                h = self.c(paddle.nn.functional.relu(h))
            return h


def _run(net, *inputs, backward: bool = True):
    out = net(*inputs)
    if not backward:
        return out.numpy(), []
    out.mean().backward()
    grads = [np.zeros(p.shape, "f4") if p.grad is None else p.grad.numpy().copy()
             for p in net.parameters()]
    for p in net.parameters():
        p.clear_gradient()
    return out.numpy(), grads


def _bf16_exact(a) -> bool:
    return bool((np.ascontiguousarray(a, np.float32).view(np.uint32) & 0xFFFF == 0).all())


def _x(sign: int):
    rng = np.random.default_rng(0)
    return paddle.to_tensor(sign * np.abs(rng.standard_normal((8, 16))).astype("f4"))


def _same(got, want) -> None:
    np.testing.assert_array_equal(got[0], want[0])
    for g, w in zip(got[1], want[1]):
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-7)


@pytest.mark.skipif(_legacy_paddle3(), reason="Paddle 3.3.1's legacy IR cannot convert a "
                    "tensor-dependent if (its logical_not takes no Variable), with or "
                    "without AMP")
def test_a_programs_ops_in_a_converted_if_are_decided_as_in_eager_mode():
    paddle.seed(0)
    net = Branches()
    cases = [(_x(sign), low) for sign, low in ((1, True), (-1, False))]
    eager = [_run(net, x) for x, _ in cases]  # (before to_static: it converts net in place)
    static = paddle.jit.to_static(net, full_graph=True)
    for (x, low), want in zip(cases, eager):  # one program, each branch taken
        assert _bf16_exact(want[0]) is low
        _same(_run(static, x), want)


def test_a_programs_ops_in_a_loop_over_a_tensor_range_are_decided_as_in_eager_mode():
    paddle.seed(0)
    net = Loop()
    # Paddle 3.3.1's backward through such a loop fails in both IRs, with or without AMP
    # ("middle_0 should exist"; "Getting 'tensor_desc' is not supported"): the forward only
    backward = not paddle.__version__.startswith("3.")
    x, counts = _x(1), [paddle.to_tensor(n) for n in (1, 3)]
    eager = [_run(net, x, n, backward=backward) for n in counts]
    static = paddle.jit.to_static(net, full_graph=True)
    for n, want in zip(counts, eager):
        assert _bf16_exact(want[0])
        _same(_run(static, x, n, backward=backward), want)
