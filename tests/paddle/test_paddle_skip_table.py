"""The legacy IR's skip table reads what each optimizer op does, not the optimizer's type."""
import paddle
import pytest

from paddle_amp.ir.legacy.skip import skip_of
from paddle_helpers import mlp

pytestmark = pytest.mark.legacy_ir


@pytest.mark.parametrize("make, kinds", [
    (lambda: paddle.optimizer.SGD(0.1), {"fold"}),               # param - lr * grad
    (lambda: paddle.optimizer.Adam(0.01), {"self"}),             # reads SkipUpdate
    (lambda: paddle.optimizer.Momentum(0.1, momentum=0.9), {"guard"}),  # velocity moves
    (lambda: paddle.optimizer.SGD(0.1, weight_decay=paddle.regularizer.L2Decay(0.01)),
     {"fold"}),                                                   # decay: not persistable
])
def test_each_optimizer_op_is_looked_up_by_what_it_reads(static, make, kinds):
    _, _, loss = mlp()
    found_inf = paddle.static.data("found_inf", [1], "bool")
    optimizer = make()
    optimizer._set_auxiliary_var("found_inf", found_inf)
    block = static.main.global_block()
    start = len(block.ops)
    optimizer.minimize(loss)
    lr = optimizer._global_learning_rate()
    looked_up = [skip_of(block, op, found_inf, lr) for op in block.ops[start:]]
    assert set(looked_up) - {None} == kinds
    # ops that write no persistable (the backward, weight decay) need no skip at all
    assert None in looked_up
