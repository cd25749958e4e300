"""A training + inference script written against mxnet.contrib.amp (its names only).

test_dropin runs it with the one import line changed to ``import mxnet_amp as amp``.
"""
import numpy as np
import mxnet as mx
from mxnet import autograd, gluon, nd
from mxnet.contrib import amp

amp.init()
net = gluon.nn.HybridSequential()
net.add(gluon.nn.Dense(16, activation="relu"), gluon.nn.Dense(3))
net.initialize(mx.init.Xavier(), ctx=mx.cpu())
net.hybridize()
trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1, "momentum": 0.9})
amp.init_trainer(trainer)
loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
rs = np.random.RandomState(0)
x, y = nd.array(rs.uniform(size=(16, 5))), nd.array(rs.randint(0, 3, 16))
losses = []
for epoch in range(10):
    with autograd.record():
        loss = loss_fn(net(x), y)
        with amp.scale_loss(loss, trainer) as scaled_loss:
            autograd.backward(scaled_loss)
    amp.unscale(trainer)
    gluon.utils.clip_global_norm([p.grad() for p in net.collect_params().values()], 5.0)
    trainer.step(16)
    losses.append(loss.mean().asscalar())
assert losses[-1] < losses[0], losses

inference = amp.convert_hybrid_block(net, target_dtype="float16", ctx=mx.cpu())
np.testing.assert_allclose(inference(x).asnumpy(), net(x).asnumpy(), rtol=1e-2, atol=1e-3)
assert "FullyConnected" in amp.list_lp16_ops("float16")
assert "softmax" in amp.list_fp32_ops("float16")
assert "relu" in amp.list_lp16_fp32_ops("float16")
assert "broadcast_add" in amp.list_widest_type_cast("float16")
assert ("Activation", "act_type", ["softrelu"]) in amp.list_conditional_fp32_ops("float16")
assert "SoftmaxOutput" in amp.list_loss_output_functions("float16")
assert amp.list_lp16_ops("bfloat16")
RESULT = losses
