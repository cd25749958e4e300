"""Single process, 2 CPU contexts, kvstore 'device' (or 'local'): inf injected on context 1 only.

python tests/distributed/_mx_device_launch.py [device|local] [repeats]
Prints, per run: steps where the check fired when it looks at ALL contexts' reduced grads vs at
context 0's LOCAL grads only (what mxnet.contrib.amp's has_overflow reads: p._grad[0]), and a
digest of the final parameters, so repeated runs show whether multi-context training is
deterministic on this build.
"""
import hashlib
import json
import os
import sys

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MXNET_CPU_WORKER_NTHREADS", "1")
import numpy as np
import mxnet as mx
from mxnet import autograd, gluon, nd
from mxnet.ndarray import multi_all_finite


def all_finite(arrays):
    out = nd.ones((1,), ctx=mx.cpu(0))
    multi_all_finite(*arrays, num_arrays=len(arrays), init_output=False, out=out)
    return out


def run(kvtype, steps=12, inject_step=4):
    ctxs = [mx.cpu(0), mx.cpu(1)]
    mx.random.seed(0)
    np.random.seed(0)
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Dense(8, activation="relu", in_units=4), gluon.nn.Dense(1, in_units=8))
    net.initialize(mx.init.Xavier(), ctx=ctxs)
    params = net.collect_params()
    tr = gluon.Trainer(params, "sgd", {"learning_rate": 0.05, "momentum": 0.9},
                       kvstore=kvtype, update_on_kvstore=False)
    rng = np.random.RandomState(7)
    log = []
    for step in range(steps):
        x = rng.randn(16, 4).astype("float32")
        y = x.sum(1, keepdims=True)
        xs = gluon.utils.split_and_load(nd.array(x), ctxs)
        ys = gluon.utils.split_and_load(nd.array(y), ctxs)
        with autograd.record():
            ls = [gluon.loss.L2Loss()(net(a), b) for a, b in zip(xs, ys)]
        autograd.backward(ls)
        if step == inject_step:
            list(params.values())[0].list_grad()[1][0, 0] = np.inf   # context 1 only
        dev0_local = not all_finite([p.list_grad()[0] for p in params.values()]).asscalar() > 0
        tr.allreduce_grads()
        reduced_all = not all_finite([g.copyto(mx.cpu(0)) for p in params.values()
                                      for g in p.list_grad()]).asscalar() > 0
        if not reduced_all:
            tr.update(16)
        log.append((dev0_local, reduced_all))
    h = hashlib.sha256()
    for p in params.values():
        for d in p.list_data():
            h.update(d.asnumpy().tobytes())
    return {"kv": kvtype, "dev0_local_found": [i for i, l in enumerate(log) if l[0]],
            "reduced_found": [i for i, l in enumerate(log) if l[1]],
            "contexts_identical": all(np.array_equal(p.list_data()[0].asnumpy(), p.list_data()[1].asnumpy())
                                      for p in params.values()),
            "digest": h.hexdigest()[:16]}


if __name__ == "__main__":
    kv = sys.argv[1] if len(sys.argv) > 1 else "device"
    for _ in range(int(sys.argv[2]) if len(sys.argv) > 2 else 3):
        print(json.dumps(run(kv)), flush=True)
