"""A frozen weight (``grad_req='null'``) while its bias trains: no skip on clean steps.

Why it skipped (issue 22): MXNet 1.9.1's oneDNN ``FullyConnected`` backward on CPU
computes the bias gradient together with the weight gradient and skips both when the
weight's gradient request is ``null``, so the bias gradient is never written. Natively it
stays 0 (the bias silently never trains: ``test_native_mxnet_drops_the_bias_gradient``
shows it). Under AMP the bias reaches the op through a cast (fp16 rounding when emulated,
bf16 for real), whose gradient buffer is fresh and uninitialised: its garbage (often
inf/NaN) became the bias gradient, the overflow check saw it and clean steps were skipped
while the scale fell (1024 -> 1-2). ``mxnet_amp._mx.fc_split_bias`` runs exactly that case as
the op without its bias plus ``broadcast_add``, whose backward writes the bias gradient."""
import mxnet as mx
import numpy as np
import pytest
from mxnet import autograd, gluon, nd

import mxnet_amp as amp
from amp_adapters import DynamicLossScale
from mxnet_amp.kernels import has_kernel


def _net(hybridize, freeze=True):
    mx.random.seed(0)
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Dense(8, activation="relu", in_units=4), gluon.nn.Dense(3, in_units=8))
    net.initialize(mx.init.Xavier())
    if hybridize:
        net.hybridize()
    if freeze:
        net[0].weight.grad_req = "null"
    return net


def _batch(step):
    rs = np.random.RandomState(step)
    return nd.array(rs.uniform(-1, 1, (4, 4))), nd.array(rs.randint(0, 3, 4))


def test_native_mxnet_drops_the_bias_gradient():
    """The root cause, in MXNet alone (no AMP): the bias gradient of a frozen weight's
    layer is not computed (0 here; the same layer with a trained weight gets 2 per unit)."""
    x = nd.array(np.random.RandomState(0).uniform(-1, 1, (2, 4)))
    grads = {}
    for freeze in (False, True):
        dense = gluon.nn.Dense(3, in_units=4)
        dense.initialize()
        if freeze:
            dense.weight.grad_req = "null"
        with autograd.record():
            loss = dense(x).sum()
        loss.backward()
        grads[freeze] = dense.bias.grad().asnumpy()
    assert grads[False].tolist() == [2.0, 2.0, 2.0]
    if grads[True].tolist() == [2.0, 2.0, 2.0]:
        pytest.skip("this MXNet build computes the bias gradient of a frozen weight")
    assert grads[True].tolist() == [0.0, 0.0, 0.0]


def _train_12_steps(net):
    """12 SGD steps under a DynamicLossScale(1024); (trainer, [was each step skipped])."""
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1})
    amp.init_trainer(trainer, DynamicLossScale(scale=1024.0))
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    skipped = []
    for step in range(12):
        x, y = _batch(step)
        with autograd.record():
            with amp.scale_loss(loss_fn(net(x), y), trainer) as scaled:
                scaled.backward()
        trainer.step(4)
        skipped.append(amp.last_step_skipped(trainer))
    return trainer, skipped


@pytest.mark.parametrize("hybridize", [False, True])
def test_clean_steps_never_skip_with_a_frozen_weight(hybridize):
    amp.init(emulate=True)
    net = _net(hybridize)
    frozen, bias = net[0].weight.data().asnumpy().copy(), net[0].bias.data().asnumpy().copy()
    trainer, skipped = _train_12_steps(net)
    assert skipped == [False] * 12
    assert amp.loss_scale(trainer).scale == 1024.0
    assert amp.loss_scale(trainer).skipped_steps == 0
    assert net[0].weight.data().asnumpy().tobytes() == frozen.tobytes()
    assert not np.array_equal(net[0].bias.data().asnumpy(), bias)  # the bias trains


@pytest.mark.parametrize("hybridize", [False, True])
def test_the_bias_gradient_is_the_one_of_a_trained_weight(hybridize):
    """Frozen or not, a layer's bias gradient is the same number (emulated fp16)."""
    amp.init(emulate=True)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    grads = []
    for freeze in (False, True):
        net = _net(hybridize, freeze)
        x, y = _batch(0)
        with autograd.record():
            loss = loss_fn(net(x), y) * 1024
        loss.backward()
        grads.append(net[0].bias.grad().asnumpy())
    assert np.isfinite(grads[1]).all() and np.abs(grads[0]).sum() > 0
    np.testing.assert_allclose(grads[1], grads[0], rtol=1e-3, atol=1e-3)


def test_real_bfloat16_with_a_frozen_weight():
    if not has_kernel("FullyConnected", mx.cpu(), "bfloat16"):
        pytest.skip("no bfloat16 FullyConnected kernel on this CPU (oneDNN bf16 needs "
                    "avx512_core/avx512_bf16; probed with mxnet_amp.kernels.has_kernel)")
    amp.init(target_dtype="bfloat16")
    trainer, _ = _train_12_steps(_net(False))
    assert amp.loss_scale(trainer).skipped_steps == 0
