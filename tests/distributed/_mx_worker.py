"""One dist_sync worker: a tiny Gluon model, a dynamic loss scale, an inf injected on one rank.

Run only through mx_launch.launch (needs the DMLC env and $AMP_DIST_OUT).

argv: MODE [--steps N] [--inject-step K] [--inject-rank R] [--devices D] [--kv TYPE]
MODE decides how a worker turns its gradients into "skip this step or not":
  local     check this worker's own grads BEFORE allreduce, then allreduce, skip/update on the
            local answer                                        -> workers diverge
  implicit  allreduce grads (update_on_kvstore=False), check the REDUCED grads: inf+x = inf, so
            every worker sees the same answer with no extra message
  reduced   check local grads (all devices, one fused multi_all_finite), pushpull a 1-element
            flag under a reserved key (summed on the server), skip on flag>0; on a skipped step
            nobody pushes gradients at all                      -> workers agree
  server    update_on_kvstore=True (optimizer on the server) + reduced flag; the flag key is
            then run through the server's optimizer too (demonstrates why that is unsafe)
  contrib   update_on_kvstore=True + mxnet.contrib.amp's LossScaler attached to the Trainer:
            its overflow check runs AFTER the server already applied the inf gradient
"""
import argparse
import hashlib
import json
import os
import sys
import time

T0 = time.time()
import faulthandler
faulthandler.dump_traceback_later(float(os.environ.get("AMP_DIST_STACKS_AFTER", "60")), exit=False)
import numpy as np
import mxnet as mx
from mxnet import autograd, gluon, nd
from mxnet.ndarray import multi_all_finite

from amp_adapters import DynamicLossScale

FLAG_KEY = 1 << 24   # reserved int key: a kvstore refuses mixed str/int keys and Trainer uses ints 0..n-1


def all_finite(arrays):
    """One fused multi_all_finite over every array -> 1-element NDArray (1.0 = all finite). No host sync."""
    out = nd.ones((1,), ctx=arrays[0].context)
    for i in range(0, len(arrays), 200):
        chunk = arrays[i:i + 200]
        multi_all_finite(*chunk, num_arrays=len(chunk), init_output=False, out=out)
    return out


def grads_all_devices(params):
    g = []
    for p in params.values():
        if p.grad_req != "null":
            g.extend(x.as_in_context(mx.cpu(0)) if x.context != mx.cpu(0) else x for x in p.list_grad())
    return g


def reduce_found_inf(kv, found_inf_nd):
    """Sum a 1-element found_inf flag over all workers (one tiny pushpull). Returns the NDArray."""
    if kv is None or kv.num_workers == 1 and "dist" not in kv.type:
        return found_inf_nd
    kv.pushpull(FLAG_KEY, found_inf_nd, out=found_inf_nd)
    return found_inf_nd


def init_dist_trainer(trainer, kv):
    """Initialise the Trainer's kvstore keys on every worker before the first step.

    Gluon does this lazily inside the first step()/allreduce_grads(): rank 0 pushes each
    initial weight and every worker pulls it back, with nothing making the pull wait for rank
    0's push. Observed here: ~1 run in 8 a worker pulled before the init landed and trained
    from different (zero) weights, diverging from step 0. So: init, wait until rank 0's pushes
    are acknowledged, barrier, then re-pull the weights everywhere.
    """
    trainer._init_kvstore()
    if trainer._params_to_init:
        trainer._init_params()
    mx.nd.waitall()                 # rank 0: its init pushes are acknowledged by the server
    kv._barrier()
    for i, p in enumerate(trainer._params):      # Trainer's kvstore key for p is its index i
        kv.pull(i, p.list_data(), priority=-i)
    mx.nd.waitall()


def digest(trainer, params, update_on_kvstore):
    h = hashlib.sha256()
    for name in sorted(params):
        for d in params[name].list_data():
            h.update(d.asnumpy().tobytes())
    if not update_on_kvstore:
        for upd in trainer._updaters:
            for k in sorted(upd.states):
                st = upd.states[k]
                for s in (st if isinstance(st, (list, tuple)) else [st]):
                    if s is not None:
                        h.update(s.asnumpy().tobytes())
    return h.hexdigest()[:16]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["local", "implicit", "reduced", "server", "contrib"])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--inject-step", type=int, default=5)
    ap.add_argument("--inject-rank", type=int, default=0)
    ap.add_argument("--devices", type=int, default=1)
    ap.add_argument("--kv", default="dist_sync")
    ap.add_argument("--delay-rank0", type=float, default=0.0,
                    help="rank 0 sleeps this long before its first gradient allreduce (race probe)")
    ap.add_argument("--lazy-init", action="store_true",
                    help="leave kvstore/param init to the first step (MXNet's default; racy)")
    a = ap.parse_args()

    kv = mx.kv.create(a.kv)
    rank, nworkers = kv.rank, kv.num_workers
    ctxs = [mx.cpu(i) for i in range(a.devices)]
    update_on_kvstore = a.mode in ("server", "contrib")

    mx.random.seed(0)
    np.random.seed(0)
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Dense(8, activation="relu", in_units=4), gluon.nn.Dense(1, in_units=8))
    net.initialize(mx.init.Xavier(), ctx=ctxs)
    params = net.collect_params()
    trainer = gluon.Trainer(params, "sgd", {"learning_rate": 0.05, "momentum": 0.9, "wd": 1e-4},
                            kvstore=kv, update_on_kvstore=update_on_kvstore)
    if a.mode == "contrib":
        from mxnet.contrib.amp.loss_scaler import LossScaler
        trainer._amp_loss_scaler = LossScaler()       # what amp.init_trainer(trainer) attaches
    if a.mode in ("reduced", "server"):
        kv.init(FLAG_KEY, nd.zeros((1,)))
    bs = 8
    if update_on_kvstore:
        # the server's optimizer gets rescale_grad at kvstore init and it may never change after
        # (Trainer raises UserWarning 'Possible change in the `batch_size`...'): fix it now.
        trainer._scale = 1.0 if a.mode == "server" else 1.0 / 2.0 ** 10
        trainer._optimizer.rescale_grad = trainer._scale / (bs * a.devices * nworkers)
    if not a.lazy_init:
        init_dist_trainer(trainer, kv)
    init_digest = digest(trainer, params, True)   # params before step 0 (after init if eager)
    loss_fn = gluon.loss.L2Loss()
    ls = DynamicLossScale(scale=2.0 ** 10, growth_interval=4)
    rng = np.random.RandomState(100 + rank)         # each worker its own data
    log = []
    syncs = 0
    for step in range(a.steps):
        x = rng.randn(bs * a.devices, 4).astype("float32")
        y = x.sum(1, keepdims=True).astype("float32")
        xs = gluon.utils.split_and_load(nd.array(x), ctxs)
        ys = gluon.utils.split_and_load(nd.array(y), ctxs)
        scale = ls.scale
        with autograd.record():
            losses = [loss_fn(net(xi), yi) * scale for xi, yi in zip(xs, ys)]
        autograd.backward(losses)
        if step == a.inject_step and rank == a.inject_rank:
            g = list(params.values())[0].list_grad()[-1]      # last device of this worker
            g[0, 0] = np.inf
        rescale = 1.0 / (scale * bs * a.devices * nworkers)   # unscale + mean
        local_found = None
        if a.mode == "local":
            local_found = not bool(all_finite(grads_all_devices(params)).asscalar() > 0); syncs += 1
            trainer.allreduce_grads()
            found = local_found
        elif a.mode == "implicit":
            trainer.allreduce_grads()
            found = not bool(all_finite(grads_all_devices(params)).asscalar() > 0); syncs += 1
        elif a.mode in ("reduced", "server"):
            fin = all_finite(grads_all_devices(params))
            flag = 1.0 - fin                       # 1.0 = this worker found inf/nan
            flag = reduce_found_inf(kv, flag)
            fval = float(flag.asscalar()); syncs += 1
            found = fval > 0
            local_found = fval            # number of workers that found inf
            if not found and a.mode == "reduced":
                if step == 0 and rank == 0 and a.delay_rank0:
                    time.sleep(a.delay_rank0)
                trainer.allreduce_grads()
        if a.mode == "contrib":
            # amp.scale_loss would set trainer._scale = 1/scale; dist + update_on_kvstore forbids
            # changing rescale_grad after kvstore init, so the scale stays fixed in this mode.
            trainer._scale = 1.0 / scale
            trainer.step(bs * a.devices * nworkers)   # push grads -> server updates -> pull weights
            sc = trainer._amp_loss_scaler                # ... and only then _update() checks
            found = sc._next_loss_scale < sc._loss_scale
            skipped = found                              # "skipped", but the server already applied it
        elif a.mode == "server":
            if not found:
                for p in params.values():                # unscale on the worker: rescale_grad on the
                    for g in p.list_grad():              # server must stay constant
                        g *= 1.0 / scale
                trainer._scale = 1.0
                trainer.step(bs * a.devices * nworkers)
            skipped = found
        else:
            if not found:
                _update(trainer, rescale)
            skipped = found
        if a.mode != "contrib":
            ls = ls.adjust(found)
        d = digest(trainer, params, update_on_kvstore)
        finite = bool(np.all([np.isfinite(p.data(ctxs[0]).asnumpy()).all() for p in params.values()]))
        log.append({"step": step, "local_found": local_found, "found": found, "skipped": skipped,
                    "scale": float(ls.scale), "digest": d, "params_finite": finite})
    extra = {}
    if a.mode == "server":
        probe = nd.zeros((1,))
        kv.pull(FLAG_KEY, out=probe)
        extra["flag_key_after"] = float(probe.asscalar())
    res = {"rank": rank, "mode": a.mode, "num_workers": nworkers, "kv_type": kv.type,
           "devices": a.devices, "host_syncs_for_flag": syncs, "steps": log,
           "init_digest": init_digest, "final_digest": log[-1]["digest"], "final_scale": float(ls.scale),
           "worker_s": round(time.time() - T0, 3), **extra}
    with open(os.environ["AMP_DIST_OUT"], "w") as f:
        json.dump(res, f)
    faulthandler.cancel_dump_traceback_later()


def _update(trainer, rescale):
    """trainer.update with rescale_grad = rescale (unscale by loss scale and average over workers)."""
    trainer._optimizer.rescale_grad = rescale
    trainer._update(ignore_stale_grad=True)


if __name__ == "__main__":
    main()
