"""A Gluon layer applied N times in one imperative (not hybridized) forward casts its weight
once per step, not N times (apache/mxnet#19019, where the native re-casts it at each use until
memory runs out), and the casts of a step do not outlive it: the next step casts the updated
weight anew. Counted from the casts executed and their shapes, never from measured memory.

The cast is made device-independent: a float16 weight read by an op the policy keeps float32
(``fp32_ops``) is cast up on every CPU class, as a float32 weight is cast down where a low
kernel runs; the emulated case rounds a float32 weight through float16 on every CPU class."""
import numpy as np
import mxnet as mx
import pytest
from mxnet import autograd, gluon, nd

import mxnet_amp as amp
from mxnet_amp import patching, stepcasts

UNITS, USES, BATCH = 64, 8, 4


class Reused(gluon.HybridBlock):
    """One Dense layer applied ``USES`` times (a weight-tied recurrence)."""

    def __init__(self, dtype):
        super().__init__()
        with self.name_scope():
            self.dense = gluon.nn.Dense(UNITS, in_units=UNITS, dtype=dtype)

    def hybrid_forward(self, F, x):
        for _ in range(USES):
            x = F.relu(self.dense(x))
        return x


@pytest.fixture
def casts(monkeypatch):
    """Every cast the wrappers execute: (input shape, input dtype, target dtype, output)."""
    done = []
    real = patching.cast

    def counted(x, dtype, name=None):
        out = real(x, dtype, name) if name is not None else real(x, dtype)
        done.append((tuple(x.shape), np.dtype(x.dtype).name if not _bf16(x) else "bfloat16",
                     dtype, out))
        return out
    monkeypatch.setattr(patching, "cast", counted)
    return done


def _bf16(x):
    return np.dtype(x.dtype).name == "void16" or str(x.dtype).endswith("V2")


def _weight_casts(done, net):
    w = net.dense.weight.shape
    return [c for c in done if c[0] == w]


def _bytes(done):
    return sum(int(np.prod(c[3].shape)) * np.dtype(c[3].dtype).itemsize for c in done)


SETUPS = {
    # a float16 weight, FullyConnected kept float32: the weight is cast up at each use today
    "float16 weight, float32 op": (dict(target_dtype="float16", fp32_ops=["FullyConnected"]),
                                   "float16"),
    # emulated float16: a float32 weight rounded through float16 (two casts) per use today
    "emulated float16": (dict(target_dtype="float16", emulate=True), "float32"),
}


@pytest.mark.parametrize("setup", sorted(SETUPS))
def test_a_layer_applied_n_times_casts_its_weight_once_per_step(setup, casts):
    kwargs, dtype = SETUPS[setup]
    amp.init(**kwargs)
    net = Reused(dtype)
    net.initialize()
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1})
    x = nd.random.uniform(shape=(BATCH, UNITS))
    per_step = []
    for _ in range(2):
        before = len(casts)
        with autograd.record():
            loss = net(x).astype("float32").sum()
        loss.backward()
        trainer.step(BATCH)
        per_step.append(_weight_casts(casts[before:], net))
    one = 2 if setup.startswith("emulated") else 1  # a round trip is two casts
    assert [len(s) for s in per_step] == [one, one]  # once per step, not USES times
    w = net.dense.weight
    assert _bytes(per_step[0][-1:]) == int(np.prod(w.shape)) * 4  # a float32 copy's bytes
    assert stepcasts.step_casts() is None  # nothing of the step is held after it


def test_the_next_step_casts_the_updated_weight():
    """A step's cast is not reused by the next: after an update, the output follows the new
    weight (as the same model computes without AMP)."""
    amp.init(target_dtype="float16", fp32_ops=["FullyConnected"])
    net = Reused("float16")
    net.initialize(mx.init.Uniform(0.1))
    x = nd.random.uniform(shape=(BATCH, UNITS))
    net(x)
    net.dense.weight.set_data(net.dense.weight.data() * 0.5)
    got = net(x).asnumpy()
    w = net.dense.weight.data().astype("float32").asnumpy()
    b = net.dense.bias.data().astype("float32").asnumpy()
    h = x.asnumpy()
    for _ in range(USES):
        h = np.maximum(h @ w.T + b, 0)
    np.testing.assert_allclose(got.astype("float32"), h, rtol=1e-3, atol=1e-5)


def test_gradients_of_a_reused_weight_add_up_over_its_uses():
    """The one cast feeds every use: the weight's gradient is the sum over them, as in the same
    model computed in float32 from the same weights."""
    amp.init(target_dtype="float16", fp32_ops=["FullyConnected"])
    net = Reused("float16")
    net.initialize(mx.init.Uniform(0.1))
    x = nd.random.uniform(shape=(BATCH, UNITS))
    with autograd.record():
        y = net(x).sum()
    y.backward()
    amp.reset()
    ref = Reused("float32")
    ref.initialize()
    ref.dense.weight.set_data(net.dense.weight.data().astype("float32"))
    ref.dense.bias.set_data(net.dense.bias.data().astype("float32"))
    with autograd.record():
        z = ref(x).sum()
    z.backward()
    np.testing.assert_allclose(net.dense.weight.grad().asnumpy().astype("float32"),
                               ref.dense.weight.grad().asnumpy(), rtol=2e-3, atol=1e-3)


def test_the_cast_report_counts_the_bytes_its_casts_write_per_step():
    """At the traced shapes: each parameter's cast (float16 -> float32: 4 bytes an element),
    and nothing for the casts-if-needed of values already float32 (MXNet runs them in
    place)."""
    amp.init(target_dtype="float16", fp32_ops=["FullyConnected"])
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Dense(32, in_units=16, dtype="float16"),
            gluon.nn.Dense(8, in_units=32, dtype="float16"))
    net.initialize()
    net.hybridize()
    net(nd.ones((4, 16)))
    casts = amp.cast_report(net).graph_casts
    assert casts.nbytes == 4 * (16 * 32 + 32 + 32 * 8 + 8)
    assert casts.unsized == 0
    assert "written by them per step" in amp.cast_report(net).summary()
