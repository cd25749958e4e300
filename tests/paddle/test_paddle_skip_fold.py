"""SGD's true skip is folded into the update (zeroed grads, learning rate 0), not a sub-block."""
import numpy as np
import paddle
import pytest

import paddle_amp
from paddle_helpers import batch, mlp

# the legacy IR's SGD fold and conditional_block; under PIR SGD skips through pd_op.if
pytestmark = pytest.mark.legacy_ir


def _changed(a: dict, b: dict) -> list:
    return [k for k in a if not np.array_equal(a[k], b[k], equal_nan=True)]


SGDS = {
    "plain": lambda: paddle.optimizer.SGD(0.1),
    "l2": lambda: paddle.optimizer.SGD(0.1, weight_decay=paddle.regularizer.L2Decay(0.01)),
    "clip_by_value": lambda: paddle.optimizer.SGD(0.1, grad_clip=paddle.nn.ClipGradByValue(1.0)),
}


@pytest.mark.parametrize("name", sorted(SGDS))
def test_sgd_skips_bit_exact_without_a_conditional_block(static, name):
    _, _, loss = mlp()
    opt = paddle_amp.decorate(SGDS[name](), init_loss_scaling=2.0**10)
    opt.minimize(loss)
    main = static.main.global_block()
    sgd_ops = [op for op in main.ops if op.type == "sgd"]
    assert len(sgd_ops) == 4  # two fc layers: weights and biases, all in the main block
    assert not any(op.type == "sgd" for b in static.main.blocks[1:] for op in b.ops)
    lr = {op.input("LearningRate")[0] for op in sgd_ops}
    assert len(lr) == 1 and not main.var(lr.pop()).persistable  # the folded rate
    static.exe.run(static.startup)
    static.run(batch(0))
    before = static.state()
    static.run(batch(1, overflow=True))
    assert not _changed(before, static.state()), "SGD moved a weight on an overflow step"
    assert opt.loss_scale().skipped_steps == 1
    static.run(batch(2))
    assert _changed(before, static.state()), "the next finite step updates again"


def test_momentum_keeps_its_conditional_block(static):
    """Momentum's velocity moves on a zero gradient: its ops still run only on finite steps."""
    _, _, loss = mlp()
    paddle_amp.decorate(paddle.optimizer.Momentum(0.1, momentum=0.9)).minimize(loss)
    assert not any(op.type == "momentum" for op in static.main.global_block().ops)
    assert any(op.type == "momentum" for b in static.main.blocks[1:] for op in b.ops)
