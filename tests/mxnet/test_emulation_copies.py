"""Emulation keeps no second copy per value in a traced Gluon graph (issue 40, point 4): a
value read by several emulated ops is rounded through float16 once, and every reader reads
that one float32 copy (before: one rounding per reader, an attention's q, k and v each
rounding the same activation). Counted from the casts the wrappers execute and their shapes,
never from measured memory; emulated float16 runs on every CPU class."""
import numpy as np
from hypothesis import given, settings, strategies as st
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


# ---- imperative (not hybridized) Gluon: the step's casts (``stepcasts``) ----------------

class Heads(gluon.Block):
    """ThreeHeads run imperatively; ``write`` runs between the first and second reader."""

    def __init__(self, write=None):
        super().__init__()
        self.write = write
        with self.name_scope():
            self.inner = gluon.nn.Dense(UNITS, in_units=UNITS)
            self.q = gluon.nn.Dense(UNITS, in_units=UNITS)
            self.k = gluon.nn.Dense(UNITS, in_units=UNITS)
            self.v = gluon.nn.Dense(UNITS, in_units=UNITS)

    def forward(self, x):
        h = nd.relu(self.inner(x))
        q = self.q(h)
        if self.write is not None:
            self.write(h)
        return q + self.k(h) + self.v(h)


def _roundings(monkeypatch):
    """Every array rounded through float16 by the wrappers: [(input array, output)]."""
    done = []
    real = patching.cast

    def counted(x, dtype, name=None):
        out = real(x, dtype, name) if name is not None else real(x, dtype)
        if dtype == "float16" and not hasattr(x, "list_arguments"):
            done.append((x, out))
        return out
    monkeypatch.setattr(patching, "cast", counted)
    return done


def _emulated_heads(write=None):
    amp.init(target_dtype="float16", emulate=True)
    net = Heads(write)
    net.initialize()
    return net, nd.random.uniform(shape=(BATCH, UNITS))


def test_an_activation_read_by_three_imperative_ops_is_rounded_once(monkeypatch):
    done = _roundings(monkeypatch)
    net, x = _emulated_heads()
    with autograd.record():
        loss = net(x).sum()
    loss.backward()
    rounded = [id(a) for a, _ in done]
    assert len(rounded) == len(set(rounded)), len(rounded)  # before: h rounded by q, k and v
    assert np.isfinite(net.inner.weight.grad().asnumpy()).all()


def test_a_write_under_pause_between_readers_is_read_by_the_next_one(monkeypatch):
    """MXNet refuses an in-place write to a value of the recorded graph, but not under
    ``autograd.pause()``: the reader after it rounds the written value, not a stale one."""
    def zero(h):
        with autograd.pause():
            h[:] = 0
    net, x = _emulated_heads(zero)
    with autograd.record():
        out = net(x)
    q = net.q(nd.relu(net.inner(x)))
    want = q + net.k.bias.data() + net.v.bias.data()  # k and v read the zeros
    np.testing.assert_allclose(out.asnumpy(), want.asnumpy(), rtol=1e-3, atol=1e-3)


def test_outside_a_recorded_graph_each_reader_rounds_what_it_reads(monkeypatch):
    """No version counter tells a written array: an inference forward shares nothing."""
    done = _roundings(monkeypatch)
    net, x = _emulated_heads()
    net(x)
    h_reads = [a for a, _ in done if a is not x and a.shape == (BATCH, UNITS)]
    assert len({id(a) for a in h_reads}) < len(h_reads)  # h: one rounding per reader


class Script(gluon.Block):
    """Reads one activation by a Dense (``"read"``) and writes it in place under
    ``autograd.pause()`` (``"write"``) in the order of ``actions``."""

    def __init__(self, actions):
        super().__init__()
        self.actions = actions
        with self.name_scope():
            self.inner = gluon.nn.Dense(UNITS, in_units=UNITS)
            self.reader = gluon.nn.Dense(UNITS, in_units=UNITS)

    def forward(self, x):
        h = nd.relu(self.inner(x))
        outs = []
        for act in self.actions:
            if act == "read":
                outs.append(self.reader(h))
            else:
                with autograd.pause():
                    h[:] = h * 0.5 + 0.25
        return nd.concat(*outs, dim=0) if outs else h


@settings(max_examples=8, deadline=None)
@given(st.lists(st.sampled_from(["read", "write"]), min_size=1, max_size=6))
def test_a_recorded_forward_reads_what_an_unrecorded_one_reads_whatever_the_writes(actions):
    """Sharing a rounding never changes a value: recorded (shared) and not (per reader)."""
    amp.reset()
    amp.init(target_dtype="float16", emulate=True)
    try:
        net = Script(actions)
        net.initialize()
        x = nd.random.uniform(shape=(BATCH, UNITS))
        plain = net(x).asnumpy()
        with autograd.record():
            shared = net(x).asnumpy()
        np.testing.assert_array_equal(shared, plain)
    finally:
        amp.reset()


def test_an_array_is_in_the_recorded_graph_until_a_backward_frees_it():
    from mxnet_amp.stepcasts import in_recorded_graph
    w, x = nd.ones((2, 2)), nd.ones((2, 2))
    w.attach_grad()
    with autograd.record():
        h = nd.relu(w * 2)
        assert in_recorded_graph(h) and in_recorded_graph(w) and not in_recorded_graph(x)
        h.sum().backward()
        assert not in_recorded_graph(h)  # writable again: a cast of it is not shared after
