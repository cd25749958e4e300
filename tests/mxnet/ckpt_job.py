"""Training job for the checkpoint test: run steps [start, stop), optionally checkpoint or resume.

Imported by the test for the uninterrupted run; run as a script (a new
process) to resume from a checkpoint: ``python ckpt_job.py DIR START STOP``.
"""
import json
import os
import sys

import numpy as np
import mxnet as mx
from mxnet import autograd, gluon, nd

import mxnet_amp as amp
from amp_adapters import DynamicLossScale

INF_STEPS = {2, 5}  # steps whose gradients get an inf (the scale backs off there)


def build():
    mx.random.seed(0)
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Dense(8, activation="relu", in_units=4), gluon.nn.Dense(3, in_units=8))
    net.initialize(mx.init.Xavier())
    net.hybridize()
    trainer = gluon.Trainer(net.collect_params(), "adam", {"learning_rate": 0.01})
    amp.init_trainer(trainer, DynamicLossScale(scale=2.0**10, growth_interval=2))
    return net, trainer


def train(net, trainer, start, stop, ckpt_dir=None, ckpt_at=None):
    """Returns the scale used at each step."""
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    scales = []
    for step in range(start, stop):
        if step == ckpt_at:
            net.save_parameters(os.path.join(ckpt_dir, "net.params"))
            trainer.save_states(os.path.join(ckpt_dir, "trainer.states"))
            with open(os.path.join(ckpt_dir, "amp.json"), "w") as f:
                json.dump(amp.state_dict(trainer), f)
        rs = np.random.RandomState(step)
        x, y = nd.array(rs.uniform(-1, 1, (4, 4))), nd.array(rs.randint(0, 3, 4))
        with autograd.record():
            with amp.scale_loss(loss_fn(net(x), y), trainer) as scaled:
                scaled.backward()
        if step in INF_STEPS:
            net[0].weight.grad()[0, 0] = np.inf
        scales.append(amp.loss_scale(trainer).scale)
        trainer.step(4)
    return scales


def resume(ckpt_dir, start, stop):
    net, trainer = build()
    net.load_parameters(os.path.join(ckpt_dir, "net.params"))
    trainer.load_states(os.path.join(ckpt_dir, "trainer.states"))
    with open(os.path.join(ckpt_dir, "amp.json")) as f:
        amp.load_state_dict(trainer, json.load(f))
    scales = train(net, trainer, start, stop)
    net.save_parameters(os.path.join(ckpt_dir, "resumed.params"))
    return scales, amp.state_dict(trainer)


if __name__ == "__main__":
    directory, begin, end = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    print(json.dumps(resume(directory, begin, end)))
