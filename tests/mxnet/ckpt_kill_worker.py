"""Worker for the kill test: resume from DIR if it can, train to step N, checkpoint every step.

``python ckpt_kill_worker.py DIR N``. Prints (flushed, one per line):
``START <step> <fingerprint>`` after loading (step 0: fresh start; then
``FRESH <error>`` first if the checkpoint folder had no complete checkpoint),
``B <k>`` / ``E <k>`` around the save after step k with ``F <k> <fingerprint>``
before it, and ``DONE`` at the end. The fingerprint is the SHA-256 of every
parameter, every optimizer state array, the update counts and the loss-scale
state, so two runs agree on it only when they are bit-identical.
"""
import hashlib
import json
import sys

import numpy as np
import mxnet as mx
from mxnet import autograd, gluon, nd

import mxnet_amp as amp
from amp_adapters import CheckpointError, DynamicLossScale

INF_STEPS = {3, 7, 8}  # gradients get an inf after these steps' backward: the scale backs off


def build():
    mx.random.seed(0)
    amp.init(policy="O1", emulate=True)
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Dense(8, activation="relu", in_units=4), gluon.nn.Dense(3, in_units=8))
    net.initialize(mx.init.Xavier())
    net.hybridize()
    trainer = gluon.Trainer(net.collect_params(), "adam", {"learning_rate": 0.01})
    amp.init_trainer(trainer, DynamicLossScale(scale=2.0**10, growth_interval=2))
    return net, trainer


def fingerprint(net, trainer):
    h = hashlib.sha256()
    for name, p in sorted(net._collect_params_with_prefix().items()):
        h.update(name.encode() + p.data().asnumpy().tobytes())
    updater = trainer._updaters[0]
    for index in sorted(updater.states):
        for s in (updater.states[index] if isinstance(updater.states[index], (list, tuple))
                  else [updater.states[index]]):
            if s is not None:
                h.update(str(index).encode() + s.asnumpy().tobytes())
    opt = trainer._optimizer
    h.update(json.dumps([opt.num_update, sorted(opt._index_update_count.items())]).encode())
    h.update(json.dumps(amp.state_dict(trainer), sort_keys=True).encode())
    return h.hexdigest()[:16]


def step(net, trainer, k):
    """Training step k (1-based): its data depend on k only."""
    rs = np.random.RandomState(k)
    x, y = nd.array(rs.uniform(-1, 1, (4, 4))), nd.array(rs.randint(0, 3, 4))
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    with autograd.record():
        with amp.scale_loss(loss_fn(net(x), y), trainer) as scaled:
            scaled.backward()
    if k in INF_STEPS:
        net[0].weight.grad()[0, 0] = np.inf
    trainer.step(4)


def main(directory, n):
    net, trainer = build()
    net(nd.zeros((1, 4)))  # shapes known before a load
    try:
        start = amp.load_checkpoint(directory, net, trainer)
    except CheckpointError as e:
        if "no complete checkpoint" not in str(e) and "does not exist" not in str(e):
            raise
        print("FRESH", str(e).replace("\n", " "), flush=True)
        start = 0
    print("START", start, fingerprint(net, trainer), flush=True)
    for k in range(start + 1, n + 1):
        step(net, trainer, k)
        print("F", k, fingerprint(net, trainer), amp.loss_scale(trainer).scale, flush=True)
        print("B", k, flush=True)
        amp.save_checkpoint(directory, net, trainer, step=k)
        print("E", k, flush=True)
    print("DONE", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
