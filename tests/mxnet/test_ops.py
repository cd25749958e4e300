"""Op wrappers: conditional fp32, promote in traced graphs, several losses."""
import json

import numpy as np
import mxnet as mx
from mxnet import autograd, gluon, nd

import mxnet_amp as amp
from mxnet_testutil import mlp


def test_conditional_fp32_depends_on_the_attribute():
    amp.init()
    x = nd.ones((2, 2), dtype="float16")
    assert nd.Activation(x, act_type="softrelu").dtype == np.float32  # softplus: fp32
    assert nd.Activation(x, act_type="relu").dtype == np.float16  # relu: follows
    amp.reset()
    amp.init(conditional_fp32_ops=[("Activation", "act_type", ["relu"])])
    assert nd.Activation(x, act_type="relu").dtype == np.float32


def test_traced_promote_gets_a_runtime_multicast():
    amp.init()
    a, b = mx.sym.var("a", dtype="float16"), mx.sym.var("b")
    out = mx.sym.broadcast_add(a, b)
    ops = [n["op"] for n in json.loads(out.tojson(remove_amp_cast=False))["nodes"]]
    assert "amp_multicast" in ops
    _, (dtype,), _ = out.infer_type(a="float16", b="float32")
    assert dtype == np.float32


def test_scale_loss_takes_a_list_of_losses():
    net = mlp()
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1})
    amp.init_trainer(trainer, 8.0)
    x = nd.ones((2, 4))
    with autograd.record():
        losses = [net(x).sum(), (net(x) ** 2).sum()]
        with amp.scale_loss(losses, trainer) as scaled:
            assert isinstance(scaled, list) and len(scaled) == 2
            for s, l in zip(scaled, losses):
                assert s.asscalar() == l.asscalar() * 8.0
            autograd.backward(scaled)
    trainer.step(2)
    assert amp.loss_scale(trainer).kind == "static" and not amp.last_step_skipped(trainer)


class _Tied(gluon.HybridBlock):
    """One weight used by two FullyConnected ops."""

    def __init__(self):
        super().__init__()
        self.w = self.params.get("w", shape=(4, 4))

    def hybrid_forward(self, F, x, w):
        h = F.FullyConnected(x, w, no_bias=True, num_hidden=4)
        return F.FullyConnected(h, w, no_bias=True, num_hidden=4)


def test_a_traced_weight_is_cast_once_not_per_use():
    amp.init(emulate=True)  # CPU: the FCs are emulated, so their inputs are rounded
    net = _Tied()
    net.initialize()
    net.hybridize()
    net(nd.ones((2, 4)))
    nodes = json.loads(net._cached_graph[1].tojson(remove_amp_cast=False))["nodes"]
    weight_casts = [n for n in nodes if n["op"] == "amp_cast"
                    and nodes[n["inputs"][0][0]]["name"] == net.w.name]
    assert len(weight_casts) == 1
    fcs = [n for n in nodes if n["op"] == "FullyConnected"]
    assert fcs[0]["inputs"][1] == fcs[1]["inputs"][1]  # both read the same rounded weight


def test_conditional_attribute_passed_by_position():
    """mx.nd.Activation(x, "softrelu"): the attribute decides, however it is passed."""
    amp.init()
    x = mx.nd.ones((2, 3), dtype="float16")
    assert mx.nd.Activation(x, "softrelu").dtype == np.float32
    assert mx.nd.Activation(x, act_type="softrelu").dtype == np.float32
    assert mx.nd.Activation(x, "relu").dtype == np.float16
