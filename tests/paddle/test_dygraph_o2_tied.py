"""O2 with a parameter tied between layers (a head sharing an embedding's weight): its plan
sees every layer that reads it, whichever is defined first, so an embedding's weight is
never stored bf16 because a Linear holding it first would run it low."""
import numpy as np
import paddle
import pytest

from paddle_amp import dygraph as amp


class Tied(paddle.nn.Layer):
    def __init__(self, head_first):
        super().__init__()
        if head_first:
            self.head = paddle.nn.Linear(8, 16, bias_attr=False)
            self.embed = paddle.nn.Embedding(8, 16)
        else:
            self.embed = paddle.nn.Embedding(8, 16)
            self.head = paddle.nn.Linear(8, 16, bias_attr=False)
        self.embed.weight = self.head.weight  # one Parameter, two readers

    def forward(self, ids):
        return paddle.matmul(self.embed(ids), self.head.weight, transpose_y=True)


@pytest.mark.parametrize("head_first", [False, True])
def test_a_tied_weight_is_planned_by_all_its_readers(head_first):
    paddle.seed(0)
    model = Tied(head_first)
    opt = paddle.optimizer.Adam(parameters=model.parameters())
    model, opt = amp.decorate(model, opt, level="O2", dtype="bfloat16")
    assert model.head.weight.dtype == paddle.float32  # the embedding reads it: float32
    ids = paddle.to_tensor(np.array([1, 2, 3], np.int64))
    with amp.auto_cast(level="O2", dtype="bfloat16"):
        assert model.embed(ids).dtype == paddle.float32
        out = model(ids)
    out.mean().backward()
    opt.step()
