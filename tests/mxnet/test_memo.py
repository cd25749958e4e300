"""The imperative wrapper decides once per call signature; the memo follows policy and device."""
import json

import numpy as np
import mxnet as mx
from mxnet import gluon, nd

import mxnet_amp as amp
from mxnet_amp import kernels, patching


def test_memo_gives_new_decisions_for_a_new_policy_and_a_new_device():
    x16 = nd.ones((2, 2), dtype="float16")
    amp.init(target_precision_ops=["exp"])  # exp runs in float16 where a kernel exists
    assert nd.exp(x16).dtype == np.float16
    assert nd.exp(x16).dtype == np.float16  # the memoized decision, same answer
    shared = mx.Context("cpu_shared", 0)
    key = ("cpu_shared", "float16", "exp", False)  # forward; training asks backward after it
    kernels._probed[key] = False  # a device type without a float16 exp kernel
    try:
        assert nd.exp(x16.as_in_context(shared)).dtype == np.float32  # new device: new decision
        assert nd.exp(x16).dtype == np.float16  # the first device keeps its own
    finally:
        del kernels._probed[key]
    amp.reset()
    amp.init()  # native lists: exp is fp32
    assert nd.exp(x16).dtype == np.float32
    amp.reset()
    assert nd.exp(x16).dtype == np.float16  # no wrapper, no memo left


def test_memo_keys_on_the_attributes_the_policy_reads():
    x16 = nd.ones((2, 2), dtype="float16")
    amp.init()
    for _ in range(2):  # alternating attribute values, each its own decision
        assert nd.Activation(x16, act_type="softrelu").dtype == np.float32
        assert nd.Activation(x16, act_type="relu").dtype == np.float16
        assert nd.Activation(x16, "softrelu").dtype == np.float32  # by position too


def test_memo_keys_on_input_dtypes():
    amp.init()
    a16, a32 = nd.ones((2, 2), dtype="float16"), nd.ones((2, 2))
    assert nd.elemwise_add(a16, a16).dtype == np.float16
    assert nd.elemwise_add(a16, a32).dtype == np.float32
    assert nd.elemwise_add(a16, a16).dtype == np.float16


def test_parameter_casts_belong_to_one_traced_graph():
    amp.init(target_dtype="float16", fp32_ops=["elemwise_add"])

    class Twice(gluon.HybridBlock):  # one weight used by two ops
        def __init__(self):
            super().__init__()
            self.w = self.params.get("w", shape=(2, 2), dtype="float16")

        def hybrid_forward(self, F, x, w):
            return F.elemwise_add(x, w) + F.elemwise_add(w, x)

    nets = []
    for _ in range(2):
        net = Twice()
        net.initialize()
        net.hybridize()
        net(nd.ones((2, 2)))
        nets.append(net)
        assert patching._trace.casts is None  # the trace's cache ended with the trace
        assert not patching._param_casts  # and nothing went to the process-wide one
    for net in nets:
        nodes = json.loads(net._cached_graph[1].tojson(remove_amp_cast=False))["nodes"]
        sources = [nodes[n["inputs"][0][0]]["name"] for n in nodes if n["op"] == "amp_cast"]
        w = net.w.var().name
        assert sources.count(w) == 1  # the weight: cast once in this graph, for both uses
        # the traced input is float32 (type inference from the traced arrays): a cast to
        # float32 in front of it would be an identity, and none is put in
        assert sources.count("data") == 0
