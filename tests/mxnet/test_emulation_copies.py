"""Emulation keeps no second copy per value in a traced Gluon graph (issue 40, point 4): a
value read by several emulated ops is rounded through float16 once, and every reader reads
that one float32 copy (before: one rounding per reader, an attention's q, k and v each
rounding the same activation). Counted from the casts the wrappers execute and their shapes,
never from measured memory; emulated float16 runs on every CPU class."""
import numpy as np
from mxnet import autograd, gluon, nd

import mxnet_amp as amp
from mxnet_amp import patching

UNITS, BATCH = 16, 4


class ThreeHeads(gluon.HybridBlock):
    """One activation read by three projections (an attention's q, k, v)."""

    def __init__(self):
        super().__init__()
        with self.name_scope():
            self.inner = gluon.nn.Dense(UNITS, in_units=UNITS)
            self.q = gluon.nn.Dense(UNITS, in_units=UNITS)
            self.k = gluon.nn.Dense(UNITS, in_units=UNITS)
            self.v = gluon.nn.Dense(UNITS, in_units=UNITS)

    def hybrid_forward(self, F, x):
        h = F.relu(self.inner(x))
        return self.q(h) + self.k(h) + self.v(h)


def test_a_value_read_by_three_emulated_ops_is_rounded_once_in_the_graph(monkeypatch):
    done = []
    real = patching.cast

    def counted(x, dtype, name=None):
        out = real(x, dtype, name) if name is not None else real(x, dtype)
        done.append((x.name if hasattr(x, "list_arguments") else None, dtype))
        return out
    monkeypatch.setattr(patching, "cast", counted)
    amp.init(target_dtype="float16", emulate=True)
    try:
        net = ThreeHeads()
        net.initialize()
        net.hybridize()
        x = nd.random.uniform(shape=(BATCH, UNITS))
        with autograd.record():
            loss = net(x).sum()
        loss.backward()
        to_low = [name for name, dtype in done if dtype == "float16" and name is not None]
        relu = [n for n in to_low if "relu" in n]
        assert len(relu) == 1, to_low  # h: one rounding for its three readers
        assert len(to_low) == len(set(to_low)), to_low  # no value rounded twice
        assert np.isfinite(net.inner.weight.grad().asnumpy()).all()
    finally:
        amp.reset()
