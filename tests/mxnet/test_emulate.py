"""emulate=True: float16 numerics on CPU; tiny gradients vanish without loss scaling."""
import numpy as np
import mxnet as mx
from mxnet import autograd, gluon, nd

import mxnet_amp as amp
from amp_adapters import DynamicLossScale

TINY = 1e-9  # the loss factor: gradients ~1e-9 are below float16's smallest subnormal (6e-8)


def _grads(emulate, scaled):
    amp.init(emulate=emulate)
    mx.random.seed(0)
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Dense(4, in_units=4))
    net.initialize(mx.init.Uniform(1.0))
    net.hybridize()
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1})
    amp.init_trainer(trainer, DynamicLossScale(scale=2.0**16))
    x = nd.array(np.random.RandomState(0).uniform(0.5, 1, (2, 4)))
    with autograd.record():
        loss = net(x).sum() * TINY
        if scaled:
            with amp.scale_loss(loss, trainer) as s:
                s.backward()
        else:
            loss.backward()
    if scaled:
        amp.unscale(trainer)
    grads = [p.grad().asnumpy() for p in net.collect_params().values()]
    report = amp.cast_report(net)
    amp.reset()
    return grads, report


def test_gradients_underflow_without_scaling_and_survive_with_it():
    exact, _ = _grads(emulate=False, scaled=False)
    assert all(np.abs(g).min() > 0 for g in exact)  # fp32: tiny but not zero
    flushed, report = _grads(emulate=True, scaled=False)
    assert all((g == 0).all() for g in flushed)  # rounded through float16: all zero
    fc = report.decisions[0]
    assert fc.emulated and "EMULATED float16" in fc.reason
    assert "emulated float16" in report.format()
    kept, _ = _grads(emulate=True, scaled=True)
    for g, ref in zip(kept, exact):
        np.testing.assert_allclose(g, ref, rtol=2e-3)  # float16 rounding, not zero


def test_emulation_overflows_like_float16():
    amp.init(emulate=True)
    x = nd.array([[70000.0, 1.0]])
    w, b = nd.ones((1, 2)), nd.zeros((1,))
    out = nd.FullyConnected(x, w, b, num_hidden=1)  # the input rounds to inf in float16
    assert out.dtype == np.float32 and np.isinf(out.asnumpy()).all()
    amp.reset()
    assert np.isfinite(nd.FullyConnected(x, w, b, num_hidden=1).asnumpy()).all()
