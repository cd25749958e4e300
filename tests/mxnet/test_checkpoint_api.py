"""save_checkpoint / load_checkpoint (MXNet): a round trip; clear errors that change nothing."""
import mxnet as mx
import numpy as np
import pytest
from mxnet import autograd, gluon, nd

import mxnet_amp as amp
from amp_adapters import CheckpointError, DynamicLossScale


def _build(units=3, optimizer="adam", with_amp=True):
    mx.random.seed(0)
    net = gluon.nn.Dense(units, in_units=4)
    net.initialize(mx.init.Xavier())
    trainer = gluon.Trainer(net.collect_params(), optimizer, {"learning_rate": 0.01})
    if with_amp:
        amp.init_trainer(trainer, DynamicLossScale(scale=2.0**10, growth_interval=2))
    return net, trainer


def _step(net, trainer, k):
    x = nd.array(np.random.RandomState(k).uniform(-1, 1, (2, 4)))
    with autograd.record():
        loss = net(x).sum()
        with amp.scale_loss(loss, trainer) as scaled:
            scaled.backward()
    trainer.step(2)


def _weights(net):
    return {k: p.data().asnumpy().copy() for k, p in net.collect_params().items()}


def test_round_trip_continues_bit_identically(tmp_path):
    net, trainer = _build()
    for k in range(3):
        _step(net, trainer, k)
    amp.save_checkpoint(tmp_path, net, trainer)
    for k in range(3, 5):
        _step(net, trainer, k)
    expected, state = _weights(net), amp.state_dict(trainer)

    net2, trainer2 = _build()
    assert amp.load_checkpoint(tmp_path, net2, trainer2) == 3  # total_steps by default
    for k in range(3, 5):
        _step(net2, trainer2, k)
    for name, w in _weights(net2).items():
        assert w.tobytes() == expected[name.replace(net2.prefix, net.prefix)].tobytes()
    assert amp.state_dict(trainer2) == state


@pytest.mark.parametrize("other, needle", [
    (dict(units=5), "parameter .*weight has shape"),
    (dict(optimizer="sgd"), "the optimizer was 'Adam' when it was saved, is 'SGD' now"),
    (dict(with_amp=False), "saved from a trainer with AMP loss scaling"),
])
def test_mismatch_is_a_clear_error_and_changes_nothing(tmp_path, other, needle):
    net, trainer = _build()
    _step(net, trainer, 0)
    amp.save_checkpoint(tmp_path, net, trainer)
    net2, trainer2 = _build(**other)
    before = _weights(net2)
    with pytest.raises(CheckpointError, match=needle):
        amp.load_checkpoint(tmp_path, net2, trainer2)
    after = _weights(net2)
    assert all(before[k].tobytes() == after[k].tobytes() for k in before)


def test_policy_of_init_is_checked(tmp_path):
    net, trainer = _build()
    amp.save_checkpoint(tmp_path, net, trainer)
    amp.init(policy="O1-bf16")
    with pytest.raises(CheckpointError, match="another policy"):
        amp.load_checkpoint(tmp_path, net, trainer)
    assert amp.load_checkpoint(tmp_path, net, trainer, check_policy=False) == 0


def test_no_checkpoint_and_bad_arguments(tmp_path):
    net, trainer = _build()
    with pytest.raises(CheckpointError, match="does not exist"):
        amp.load_checkpoint(tmp_path / "none", net, trainer)
    with pytest.raises(TypeError, match="trainer must be a mxnet.gluon.Trainer"):
        amp.save_checkpoint(tmp_path, net, "trainer")
    with pytest.raises(TypeError, match="net must be a mxnet.gluon.Block"):
        amp.load_checkpoint(tmp_path, None, trainer)
    net3, trainer3 = _build(with_amp=False)
    with pytest.raises(TypeError, match="needs step="):
        amp.save_checkpoint(tmp_path, net3, trainer3)
    amp.save_checkpoint(tmp_path, net3, trainer3, step=7)
    assert amp.load_checkpoint(tmp_path, net3, trainer3) == 7
