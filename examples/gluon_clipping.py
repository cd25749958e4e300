"""Gradient clipping under loss scaling: `amp.unscale(trainer)` first, then clip the true gradients.

Clipping the *scaled* gradients would clip at max_norm * scale, i.e. not at all.
`unscale` divides every gradient on every device by the scale, once per step;
`trainer.step` then applies no further unscaling and still skips overflow steps.

    python examples/gluon_clipping.py
"""
from amp_adapters.services.quiet import quiet_frameworks

quiet_frameworks()  # framework log noise off: glog INFO lines, "Cannot decide type", ...

import mxnet as mx  # noqa: E402
from mxnet import autograd, gluon  # noqa: E402

import mxnet_amp as amp  # noqa: E402
from amp_adapters import DynamicLossScale  # noqa: E402

amp.init(policy="O1", emulate=True)  # emulated fp16 on a CPU
net = gluon.nn.Dense(1, in_units=8)
net.initialize(mx.init.Constant(1.0))  # gradient norm about 24: clipping to 1 bites
trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.01})
amp.init_trainer(trainer, DynamicLossScale(scale=1024.0))
x, y = mx.nd.ones((16, 8)), mx.nd.zeros((16, 1))
max_norm = 1.0
for step in range(5):
    with autograd.record():
        loss = gluon.loss.L2Loss()(net(x), y).mean()
        with amp.scale_loss(loss, trainer) as scaled:
            autograd.backward(scaled)
    amp.unscale(trainer)  # now the gradients are the true ones
    grads = [p.grad() for p in net.collect_params().values()]
    norm = gluon.utils.clip_global_norm(grads, max_norm)  # returns the norm before clipping
    clipped = sum(float((g ** 2).sum().asscalar()) for g in grads) ** 0.5
    trainer.step(1)
    print(f"step {step}: gradient norm {norm:.1f} -> {clipped:.3f} (max {max_norm}), "
          f"scale {amp.loss_scale(trainer).scale:g}, skipped {amp.last_step_skipped(trainer)}")
