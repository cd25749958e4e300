"""A model whose forward opens paddle_amp.dygraph.auto_cast still converts and runs under
paddle.jit.to_static (the AST translator, and SOT where Paddle has it), close to eager mode.
(The program itself runs float32 for now: docs/dygraph.md, "Not built yet".)"""
import numpy as np
import paddle
import pytest

from paddle_amp import dygraph as amp


class Net(paddle.nn.Layer):
    def __init__(self):
        super().__init__()
        self.fc1 = paddle.nn.Linear(16, 32)
        self.fc2 = paddle.nn.Linear(32, 4)

    def forward(self, x):
        with amp.auto_cast(dtype="bfloat16"):
            return self.fc2(paddle.nn.functional.relu(self.fc1(x)))


@pytest.mark.parametrize("full_graph", [True, False])
def test_to_static_converts_a_forward_that_opens_a_region(full_graph):
    paddle.seed(0)
    net = Net()
    x = paddle.to_tensor(np.random.default_rng(0).standard_normal((8, 16)).astype(np.float32))
    eager = net(x).numpy()
    static = paddle.jit.to_static(net, full_graph=full_graph)
    out = static(x)
    out.mean().backward()
    np.testing.assert_allclose(out.numpy(), eager, rtol=5e-2, atol=5e-2)
    assert net.fc1.weight.grad is not None and np.isfinite(net.fc1.weight.grad.numpy()).all()
