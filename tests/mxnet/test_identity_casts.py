"""A hybridized graph under a policy that lowers nothing holds no cast: a cast-if-needed to
float32 in front of a value that type inference says is float32 already is an identity,
and not free (MXNet copies a graph input through it and plans its buffers around it: a
CNN's peak was 1.07x of fp32's under `auto` where it lowers nothing, issue 40). The graph is
traced again when the block is then called with arrays of another dtype, and casts them.
Counted from the casts the wrappers put into the graph, never from measured memory."""
import numpy as np
from mxnet import autograd, gluon, nd

import mxnet_amp as amp
from mxnet_amp import patching

UNITS, BATCH = 16, 4


def _net():
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Dense(UNITS, in_units=UNITS, activation="relu"),
            gluon.nn.Dense(UNITS, in_units=UNITS))
    net.initialize()
    net.hybridize()
    return net


def test_a_policy_that_lowers_nothing_puts_no_cast_into_the_graph(monkeypatch):
    traced = []
    real = patching.cast

    def counted(x, dtype, name=None):
        if hasattr(x, "list_arguments"):
            traced.append((x.name, dtype))
        return real(x, dtype, name) if name is not None else real(x, dtype)
    monkeypatch.setattr(patching, "cast", counted)
    amp.init(target_dtype="float16", fp32_ops=["FullyConnected"])  # every GEMM float32
    try:
        net = _net()
        x = nd.random.uniform(shape=(BATCH, UNITS))
        with autograd.record():
            loss = net(x).sum()
        loss.backward()
        assert traced == []  # before: a cast to float32 in front of each Dense's input
        # called with float16 arrays: traced again, the input cast to float32 for the GEMM
        want = net(x).asnumpy()
        got = net(x.astype("float16"))
        assert [d for _, d in traced] and all(d == "float32" for _, d in traced)
        np.testing.assert_allclose(got.astype("float32").asnumpy(), want, rtol=1e-2, atol=1e-2)
    finally:
        amp.reset()
