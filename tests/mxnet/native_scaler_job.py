"""A toolkit's use of ``trainer._amp_loss_scaler`` (as Sockeye does), for either AMP module.

``run(amp)`` trains a small Gluon MLP with ``amp`` (``mxnet_amp`` or the native
``mxnet.contrib.amp``, already ``init``-ed) and returns plain values:

- ``interval``: ``_scale_seq_len = 4`` right after ``init_trainer``, then 9 clean steps;
  per step the scale the loss was multiplied by (read from the scaled loss) and the
  fields ``(_loss_scale, _next_loss_scale, _unskipped)`` after ``trainer.step``;
- ``resume``: ``_scale_seq_len = 3``, overflows injected at ``INF_STEPS``; the three fields
  pickled after ``K`` steps (the checkpoint), the scales used by steps K..N-1 in the
  uninterrupted run and in a fresh trainer given the checkpoint back by tuple assignment.

Run as a script it inits the native (float16, with empty op lists: on a CPU the native's
float16 FullyConnected exists only with CuDNN, and the loss scaler is what is compared here)
and prints the JSON of ``run`` for it: the native's global ``init`` patches MXNet, so it
runs in its own process.
"""
import json
import pickle
import sys

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon

K, N = 6, 14
INF_STEPS = (3, 5, 11)  # an overflow right before the checkpoint: the native's fields differ


def build(amp):
    mx.random.seed(0)
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Dense(8, activation="relu", in_units=4), gluon.nn.Dense(3, in_units=8))
    net.initialize(mx.init.Xavier())
    net.hybridize()
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.01})
    amp.init_trainer(trainer)
    return net, trainer


def train_step(amp, net, trainer, step, inf=False):
    """One step; returns the scale the loss was multiplied by."""
    rs = np.random.RandomState(step)
    x, y = mx.nd.array(rs.uniform(-1, 1, (4, 4))), mx.nd.array(rs.randint(0, 3, 4))
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    with autograd.record():
        loss = loss_fn(net(x), y)
        with amp.scale_loss(loss, trainer) as scaled:
            autograd.backward(scaled)
    used = float(scaled.sum().asscalar() / loss.sum().asscalar())
    if inf:
        trainer._params[0].grad()[:] = np.inf
    trainer.step(4)
    return used


def fields(trainer):
    s = trainer._amp_loss_scaler
    return [s._loss_scale, s._next_loss_scale, s._unskipped]


def run(amp):
    net, trainer = build(amp)
    trainer._amp_loss_scaler._scale_seq_len = 4
    start = fields(trainer) + [trainer._amp_loss_scaler._scale_seq_len,
                               trainer._amp_loss_scaler._max_loss_scale,
                               trainer._amp_loss_scaler.loss_scale]
    used, after = [], []
    for step in range(9):
        used.append(train_step(amp, net, trainer, step))
        after.append(fields(trainer))
    interval = {"start": start, "used": used, "after": after}

    net, trainer = build(amp)
    trainer._amp_loss_scaler._scale_seq_len = 3
    full, ckpt = [], None
    for step in range(N):
        if step == K:
            ckpt = pickle.dumps(fields(trainer))
        full.append(train_step(amp, net, trainer, step, step in INF_STEPS))
    net, trainer = build(amp)
    trainer._amp_loss_scaler._scale_seq_len = 3
    restore(trainer, pickle.loads(ckpt))
    resumed = [train_step(amp, net, trainer, step, step in INF_STEPS) for step in range(K, N)]
    resume = {"checkpoint": pickle.loads(ckpt), "full": full, "resumed": resumed}
    return {"interval": interval, "resume": resume}


def restore(trainer, saved):
    """What Sockeye does on resume: the three fields back, in this order."""
    (trainer._amp_loss_scaler._loss_scale,
     trainer._amp_loss_scaler._next_loss_scale,
     trainer._amp_loss_scaler._unskipped) = saved


def native_accepts_any_attribute(amp):
    """The native scaler is a plain object: a misspelt field is set and ignored."""
    _, trainer = build(amp)
    trainer._amp_loss_scaler._scale_seqlen = 4
    return trainer._amp_loss_scaler._scale_seq_len == 2000


if __name__ == "__main__":
    from mxnet.contrib import amp as native
    native.init(target_precision_ops=[], conditional_fp32_ops=[], fp32_ops=[])
    out = run(native)
    out["typo_ignored"] = native_accepts_any_attribute(native)
    print(json.dumps(out))
    sys.stdout.flush()
