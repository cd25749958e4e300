"""The same planted model gives the same finding, and an equivalent verified fix, in MXNet and
in Paddle (fp16 emulated on this CPU in both); the layered models, the same fix by the same
layer path in the three runtimes (Gluon, a Paddle program, Paddle's eager mode)."""
import importlib.util
from pathlib import Path

import mxnet as mx
import paddle
import pytest

from amp_adapters.services.doctor import recommend
from mxnet import autograd, gluon

import mxnet_amp
from mxnet_amp.doctor import doctor as mx_doctor
from paddle_amp.doctor import doctor as pd_doctor

_spec = importlib.util.spec_from_file_location(
    "doctor_planted", Path(__file__).resolve().parents[1] / "doctor_planted.py")
P = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(P)


def _mxnet(kind, model=P.mxnet_model, arrays=P.arrays):
    mxnet_amp.init(policy=P.policy(kind))
    net, loss_fn = model(kind)
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 1e-3})
    mxnet_amp.init_trainer(trainer)
    with mx_doctor(net, loss_fn, trainer) as dr:
        for s in range(2):
            x, y, _ = arrays(kind, s)
            with autograd.record():
                loss = loss_fn(net(mx.nd.array(x)), mx.nd.array(y))
                with mxnet_amp.scale_loss(loss, trainer) as scaled:
                    autograd.backward(scaled)
            trainer.step(1)
    mxnet_amp.reset()
    return dr


def _paddle(kind, model=P.paddle_model, feed=P.paddle_feed):
    with paddle.static.scope_guard(paddle.static.Scope()):
        main, loss, opt, exe = model(kind)
        with pd_doctor(opt, exe) as dr:
            for s in range(2):
                exe.run(main, feed=feed(kind, s), fetch_list=[loss])
    paddle.disable_static()
    return dr


def _equivalent(rm, rp):
    """The two frameworks' fixes are the same fix: both verified, the same loss scale and
    precision settings, the same share of the model kept low. (A layer's name, and where a
    block ends, are each framework's own: MXNet's finest unit is a Gluon block.)"""
    assert rm.verified and rp.verified, (rm, rp)
    assert rm.keeps == rp.keeps, (rm, rp)
    mp, pp = rm.policy, rp.policy
    assert (mp.dtype, mp.level, mp.emulate, mp.loss_scale) == \
        (pp.dtype, pp.level, pp.emulate, pp.loss_scale)
    return True


def _finding(rep, f):
    index = rep.op_named(f.name).index if f.op else None
    return (f.kind, f.canonical, f.action, f.value, index)


@pytest.mark.parametrize("kind", P.KINDS)
def test_the_same_planted_model_gives_the_same_finding(kind):
    m, p = _mxnet(kind), _paddle(kind)
    rm, rp = m.report(), p.report()
    assert [_finding(rm, f) for f in rm.findings()] == [_finding(rp, f) for f in rp.findings()]
    assert rm.findings(), "the planted problem must be found"
    # the bf16 candidate reads each framework's kernels here (MXNet 1.9.1 has no bf16 dot,
    # Paddle a bf16 matmul): the fixed candidates are compared, with none offered
    assert _equivalent(*(recommend(dr.report(), dr.policy, dr.replay) for dr in (m, p)))
    assert [s.overflow for s in rm.steps] == [s.overflow for s in rp.steps]
    assert [(r.canonical, r.precision, r.emulated) for r in rm.ops] == \
        [(r.canonical, r.precision, r.emulated) for r in rp.ops]
    if kind in P.PLANTED_CANONICAL:
        first = rm.findings()[0]
        assert first.canonical == P.PLANTED_CANONICAL[kind] and rm.op_named(first.name).index == 0


def _dygraph(kind):
    """The layered model as eager Layers, in a user's loop with ``paddle_amp.dygraph``."""
    from paddle_amp import dygraph as amp
    model, loss_fn = P.paddle_dygraph_layered(kind)
    opt = paddle.optimizer.SGD(1e-3, parameters=model.parameters())
    policy = P.policy(kind)
    scaler = amp.GradScaler(policy=policy)
    with amp.doctor(model, loss_fn, opt, policy=policy, scaler=scaler) as dr:
        P.paddle_dygraph_steps(kind, model, loss_fn, opt, scaler, policy, 2)
    return dr


@pytest.mark.parametrize("kind", P.LAYERED)
def test_the_layered_models_get_the_same_fix_by_name(kind):
    """Built as users build them (a Gluon HybridSequential, a paddle.nn.Sequential in a
    program and in eager mode, names from each framework's counter), the same layer has the
    same path, ``2``, in the three runtimes, and gets the same fix."""
    m = _mxnet(kind, lambda k: P.mxnet_layered(k, named=False), P.layered_arrays)
    p = _paddle(kind, lambda k: P.paddle_layered(k, layers=True), P.paddle_layered_feed)
    m, p, d = m.recommendation(), p.recommendation(), _dygraph(kind).recommendation()
    assert m.verified and p.verified and d.verified
    assert m.policy.mxnet_layers.fp32 == p.policy.paddle_layers.fp32 == \
        d.policy.paddle_layers.fp32 == (set() if kind == "layer_backward" else {"2"})
    assert m.policy.loss_scale == p.policy.loss_scale == d.policy.loss_scale
    assert m.policy.ops == p.policy.ops == d.policy.ops == P.policy(kind).ops
    # the same share of the same four layers stays low (MXNet's FullyConnected is one
    # 'linear' op; Paddle's fc is a 'matmul' and an add; eager mode's Linear a 'matmul')
    def strip(keeps):
        return [k.replace("linear", "T").replace("matmul", "T") for k in keeps]
    assert strip(m.keeps) == strip(p.keeps) == strip(d.keeps) and m.keeps
