"""One dist_sync worker for test_distributed: an inf on one rank must be skipped by all ranks.

Run through tests/distributed/mx_launch.launch (sets the DMLC env and $AMP_DIST_OUT).
"""
import hashlib
import json
import os

import numpy as np
import mxnet as mx
from mxnet import autograd, gluon, nd

import mxnet_amp as amp
from amp_adapters import DynamicLossScale

INJECT_STEP, STEPS = 2, 5


def init_kvstore_eagerly(trainer, kv):
    """Gluon initialises the kvstore keys lazily in the first step, where a worker can pull
    before rank 0's initial weights landed (an MXNet race, seen ~1 run in 8 in the research
    prototype, tests/distributed/_mx_worker.py --lazy-init in git history). Init, wait,
    barrier, re-pull."""
    trainer._init_kvstore()
    if trainer._params_to_init:
        trainer._init_params()
    mx.nd.waitall()
    kv._barrier()
    for i, p in enumerate(trainer._params):
        kv.pull(i, p.list_data(), priority=-i)
    mx.nd.waitall()


def main():
    kv = mx.kv.create("dist_sync")
    mx.random.seed(0)
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Dense(8, activation="relu", in_units=4), gluon.nn.Dense(1, in_units=8))
    net.initialize(mx.init.Xavier())
    net.hybridize()
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.05, "momentum": 0.9},
                            kvstore=kv, update_on_kvstore=False)
    amp.init_trainer(trainer, DynamicLossScale(scale=2.0**10))
    init_kvstore_eagerly(trainer, kv)
    rs = np.random.RandomState(100 + kv.rank)  # each worker its own data
    log = []
    for step in range(STEPS):
        x = nd.array(rs.randn(8, 4))
        with autograd.record():
            loss = ((net(x) - x.sum(axis=1, keepdims=True)) ** 2).mean()
            with amp.scale_loss(loss, trainer) as scaled:
                scaled.backward()
        if step == INJECT_STEP and kv.rank == 0:
            net[0].weight.grad()[0, 0] = np.inf
        trainer.step(1)
        digest = hashlib.sha256(b"".join(p.data().asnumpy().tobytes()
                                         for p in net.collect_params().values())).hexdigest()
        log.append({"skipped": amp.last_step_skipped(trainer),
                    "scale": amp.loss_scale(trainer).scale, "digest": digest})
    with open(os.environ["AMP_DIST_OUT"], "w") as f:
        json.dump({"rank": kv.rank, "steps": log}, f)


if __name__ == "__main__":
    main()
