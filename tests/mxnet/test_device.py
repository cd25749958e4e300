"""Device-aware: on CPU (no float16 GEMM/conv kernels) amp.init() trains instead of crashing."""
import logging

import numpy as np
import pytest
import mxnet as mx
from mxnet import autograd, gluon, nd

import mxnet_amp as amp
from mxnet_amp.kernels import has_kernel


def _conv_net():
    mx.random.seed(1)
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Conv2D(4, 3, activation="relu"), gluon.nn.Dense(16, activation="tanh"),
            gluon.nn.Dense(3))
    net.initialize(mx.init.Xavier())
    net.hybridize()
    return net


def test_kernels_are_probed_on_the_device():
    cpu = mx.cpu()
    assert not has_kernel("FullyConnected", cpu, "float16")
    assert not has_kernel("Convolution", cpu, "float16")
    assert not has_kernel("_npi_matmul", cpu, "float16")
    assert has_kernel("softmax", cpu, "float16") and has_kernel("relu", cpu, "float16")


def test_hybridized_conv_dense_trains_on_cpu_and_report_says_why(caplog):
    caplog.set_level(logging.WARNING, logger="mxnet_amp")
    amp.init()
    net = _conv_net()
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.2, "momentum": 0.9})
    amp.init_trainer(trainer)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    rs = np.random.RandomState(0)
    x, y = nd.array(rs.uniform(size=(8, 1, 6, 6))), nd.array(rs.randint(0, 3, 8))
    losses = []
    for _ in range(8):
        with autograd.record():
            loss = loss_fn(net(x), y)
            with amp.scale_loss(loss, trainer) as scaled:
                autograd.backward(scaled)
        trainer.step(8)
        losses.append(float(loss.mean().asscalar()))
    assert np.isfinite(losses).all() and losses[-1] < losses[0]
    assert amp.loss_scale(trainer).skipped_steps == 0

    report = amp.cast_report(net)
    rows = {d.op: d for d in report.decisions}
    for op in ("Convolution", "FullyConnected"):
        assert rows[op].category == "lower" and rows[op].run_dtype == "float32"
        assert f"no float16 kernel for {op} on this device" in rows[op].reason
    assert rows["Activation"].canonical in {"relu", "tanh"}
    fallback_logs = [r.getMessage() for r in caplog.records if r.name == "mxnet_amp"]
    assert sum(m.startswith("FullyConnected ") for m in fallback_logs) == 1  # once per op
    assert sum(m.startswith("Convolution ") for m in fallback_logs) == 1


def test_bfloat16_needs_no_loss_scale():
    amp.init(target_dtype="bfloat16")
    net = gluon.nn.Dense(2, in_units=3)
    net.initialize()
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1})
    amp.init_trainer(trainer)
    assert amp.loss_scale(trainer).kind == "none" and amp.loss_scale(trainer).scale == 1.0


def test_cast_report_needs_a_traced_block_and_a_policy():
    net = gluon.nn.Dense(2, in_units=3)
    net.initialize()
    net.hybridize()
    with pytest.raises(RuntimeError, match="no AMP policy"):
        amp.cast_report(net)
    amp.init()
    with pytest.raises(RuntimeError, match="hybridize.*forward"):
        amp.cast_report(net)
    net(nd.ones((1, 3)))
    assert [d.canonical for d in amp.cast_report(net).decisions] == ["linear"]
