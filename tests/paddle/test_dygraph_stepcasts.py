"""paddle_amp.dygraph casts or rounds a tensor once per step however many ops read it (issue
40, point 4, in the eager runtime): a Linear applied N times in one forward casts its weight
once (apache/mxnet#19019); an activation read by three emulated projections is rounded into
one float32 copy, not three (emulation keeps no second copy per tensor); and the casts of a
step are released before the next begins. Counted from the casts executed and their shapes,
never from measured memory.

Emulated float16 runs on every CPU class; bf16 casts the weight only where the device truth
(``isa.bf16_class``) has oneDNN's bf16 GEMM (natively or emulated by oneDNN), and then
once."""
import gc
import weakref

import numpy as np
import paddle
import pytest

from amp_adapters.rules.isa import bf16_class, machine
from paddle_amp import dygraph as amp
from paddle_amp.dygraph import kernels, stepcasts

UNITS, USES, BATCH = 32, 8, 4
BF16_GEMM = bf16_class(machine()) != "none"  # oneDNN runs it (natively or emulated)


class Reused(paddle.nn.Layer):
    """One Linear applied ``USES`` times (a weight-tied recurrence)."""

    def __init__(self):
        super().__init__()
        self.dense = paddle.nn.Linear(UNITS, UNITS)

    def forward(self, x):
        for _ in range(USES):
            x = paddle.nn.functional.relu(self.dense(x))
        return x


class ThreeHeads(paddle.nn.Layer):
    """One activation read by three projections (an attention's q, k, v)."""

    def __init__(self):
        super().__init__()
        self.inner = paddle.nn.Linear(UNITS, UNITS)
        self.q, self.k, self.v = (paddle.nn.Linear(UNITS, UNITS) for _ in range(3))

    def forward(self, x):
        h = paddle.nn.functional.relu(self.inner(x))
        return self.q(h) + self.k(h) + self.v(h)


@pytest.fixture
def casts(monkeypatch):
    """Every cast the region executes: (input shape, target dtype, output, a weak reference
    to the output)."""
    done = []
    real = kernels.rounding_cast

    def counting():
        cast = real()

        def counted(x, name):
            out = cast(x, name)
            done.append((tuple(x.shape), name, out, weakref.ref(out)))
            return out
        return counted
    monkeypatch.setattr(kernels, "rounding_cast", counting)
    return done


def _bytes(done):
    return sum(int(np.prod(c[2].shape)) * c[2].element_size() for c in done)


REGIONS = {"emulated float16": dict(policy="O1", emulate=True),
           "bfloat16": dict(policy="O1-bf16")}


@pytest.mark.parametrize("region", sorted(REGIONS))
def test_a_linear_applied_n_times_casts_its_weight_once_per_step(region, casts):
    paddle.seed(0)
    net = Reused()
    opt = paddle.optimizer.SGD(0.1, parameters=net.parameters())
    x = paddle.rand([BATCH, UNITS])
    weight = tuple(net.dense.weight.shape)
    per_step, weight_bytes = [], []
    for _ in range(2):
        casts.clear()
        with amp.auto_cast(**REGIONS[region]):
            loss = net(x).mean()
        loss.backward()
        opt.step()
        opt.clear_grad()
        mine = [c for c in casts if c[0] == weight]
        per_step.append(len(mine))
        weight_bytes.append(_bytes(mine))
    if region == "bfloat16" and not BF16_GEMM:
        assert per_step == [0, 0]  # float32 here: nothing cast
        return
    # the weight is cast once per step (emulated: through float16 and back, two casts), not
    # once per use (USES times), and the next step casts the updated weight anew
    once = 2 if region == "emulated float16" else 1
    assert per_step == [once, once]
    size = UNITS * UNITS
    assert weight_bytes == [size * (2 + 4)] * 2 if once == 2 else [size * 2] * 2


def test_emulation_rounds_an_activation_read_by_three_ops_into_one_copy(casts):
    paddle.seed(0)
    net = ThreeHeads()
    x = paddle.rand([BATCH, UNITS])
    with amp.auto_cast(policy="O1", emulate=True):
        out = net(x)
    to_low = [c for c in casts if c[1] == "float16"]
    # rounded inputs: x, the inner weight, h (once for three readers), q/k/v's weights; and
    # the four outputs
    inputs_rounded = len(to_low) - 4
    assert inputs_rounded == 1 + 1 + 1 + 3, [c[0] for c in to_low]
    out.mean().backward()  # the shared copy carries every reader's gradient
    assert net.inner.weight.grad is not None


def test_the_casts_of_a_step_are_released_before_the_next_begins(casts):
    paddle.seed(0)
    net = Reused()
    opt = paddle.optimizer.SGD(0.1, parameters=net.parameters())
    x = paddle.rand([BATCH, UNITS])
    with amp.auto_cast(policy="O1", emulate=True):
        loss = net(x).mean()
        assert stepcasts.step_casts() is None  # the forward returned: its step is closed
    first = [c[3] for c in casts]
    casts.clear()
    loss.backward()
    opt.step()
    opt.clear_grad()
    del loss
    gc.collect()
    assert first and all(ref() is None for ref in first)  # none outlives its step
    with amp.auto_cast(policy="O1", emulate=True):
        net(x).mean().backward()
    assert len([c for c in casts if c[0] == tuple(net.dense.weight.shape)]) == 2


def test_an_activation_written_in_place_between_its_readers_is_rounded_anew(casts):
    paddle.seed(0)
    a, b = paddle.nn.Linear(UNITS, UNITS), paddle.nn.Linear(UNITS, UNITS)

    class InPlace(paddle.nn.Layer):
        def __init__(self):
            super().__init__()
            self.a, self.b = a, b

        def forward(self, x):
            h = self.a(x) * 1.0
            first = self.b(h)
            h.scale_(2.0)  # a new value in the same tensor
            return first, self.b(h)

    x = paddle.rand([BATCH, UNITS])
    with amp.auto_cast(policy="O1", emulate=True):
        first, second = InPlace()(x)
    np.testing.assert_allclose((second - b.bias).numpy(), 2 * (first - b.bias).numpy(),
                               rtol=1e-2, atol=1e-2)


def test_a_region_that_casts_nothing_leaves_layer_calls_unwrapped():
    """The step's cast sharing wraps ``Layer.__call__`` only in a region whose wrapped ops may
    cast: putting it in and taking it out cost a float32-keeping step at width 64 about a
    fifth of its time (bench section dygraph_dispatch)."""
    native = paddle.nn.Layer.__call__
    with amp.auto_cast(custom_black_list={"matmul_v2", "conv2d"}, dtype="bfloat16"):
        assert paddle.nn.Layer.__call__ is native
    with amp.auto_cast(dtype="float16", emulate=True):  # rounds: casts to share
        assert getattr(paddle.nn.Layer.__call__, "__amp_original__", None) is native
    assert paddle.nn.Layer.__call__ is native
