"""One policy, two Paddle runtimes: the same MLP (nn.Linear layers) makes the same GEMM
decisions under paddle_amp.dygraph (eager mode) and paddle_amp.decorate (a static program)
for the same policy: the same precision, and where both ran on this CPU, the same way."""
import numpy as np
import paddle
import pytest

import paddle_amp
from paddle_amp import dygraph as amp


class MLP(paddle.nn.Layer):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = paddle.nn.Linear(16, 32), paddle.nn.Linear(32, 4)

    def forward(self, x):
        return self.fc2(paddle.nn.functional.relu(self.fc1(x)))


def _static_report(policy):
    paddle.enable_static()
    try:
        main, startup = paddle.static.Program(), paddle.static.Program()
        with paddle.static.program_guard(main, startup), paddle.utils.unique_name.guard():
            x = paddle.static.data("x", [8, 16], "float32")
            loss = paddle.mean(MLP()(x))
            paddle_amp.decorate(paddle.optimizer.SGD(0.1), policy=policy).minimize(loss)
        return paddle_amp.cast_report(main)
    finally:
        paddle.disable_static()


@pytest.mark.parametrize("policy", ["O1", "O1-bf16", "O2-bf16"])
def test_eager_and_static_gemms_agree(policy):
    static = _static_report(policy)
    eager = amp.cast_report(MLP(), paddle.to_tensor(np.ones((8, 16), np.float32)),
                            policy=policy)
    assert eager.categories()["matmul"] == static.categories()["matmul"]
    assert eager.precisions()["matmul"] == static.precisions()["matmul"]
    assert eager.executions().get("matmul") == static.executions().get("matmul")
