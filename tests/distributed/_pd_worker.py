"""One Paddle static-graph data-parallel worker on CPU over gloo; an inf injected on one rank.

Started by pd_launch.py with PADDLE_TRAINER_ID / PADDLE_TRAINERS_NUM / PADDLE_TRAINER_ENDPOINTS /
PADDLE_CURRENT_ENDPOINT and AMP_GLOO_HTTP (the loopback rendezvous store the launcher serves);
writes one JSON object to $AMP_DIST_OUT.

argv: MODE [--steps N] [--inject-step K] [--inject-rank R]
MODE:
  local     check_finite_and_unscale on this rank's LOCAL grads (before the grad allreduce);
            the flag is NOT reduced                                    -> ranks diverge
  reduced   the same local check, then c_allreduce_max(found_inf) on ring 0 before
            update_loss_scaling and the update                         -> ranks agree
  implicit  c_allreduce_sum the grads first, then check the reduced grads: inf + x = inf,
            every rank gets the same found_inf without an extra collective
  fleet     paddle.distributed.fleet collective: fleet.init(is_collective=True) +
            fleet.distributed_optimizer(...).minimize (to record why it fails on a CPU build)

Why not fleet: on a CPU-only build fleet's collective meta-optimizer (RawProgramOptimizer) raises
"comm_id must be generated in paddlepaddle-xpu or paddlepaddle-xpu." (2.6.2) while building
c_gen_nccl_id/c_comm_init. The c_allreduce_* CPU kernels themselves work over gloo
(GlooWrapper, initialised here through GlooParallelContext, loopback only), so this harness builds the
data-parallel program itself: append_backward -> c_allreduce_sum(grads, ring 0) -> / nranks.
"""
import argparse
import hashlib
import json
import os
import sys
import time

T0 = time.time()
import numpy as np
import paddle

paddle.enable_static()
from paddle.base import core  # noqa: E402
from paddle.static.amp.amp_nn import check_finite_and_unscale, update_loss_scaling  # noqa: E402

RING = 0


def init_gloo(rank, nranks, store, init_timeout=30, run_timeout=60):
    """Initialise Paddle's process-global gloo context (GlooWrapper::GetInstance(), which the CPU
    c_allreduce_* kernels use) through core.GlooParallelContext, like
    paddle.distributed.gloo_init_parallel_env but loopback-only: the HTTP rendezvous store
    (`store`, host:port) is served by the launcher on 127.0.0.1, gloo's TCP pairs use iface "lo".
    Not core.Gloo(): that is a fresh GlooWrapper each call, not the global the kernels read.
    """
    host, port = store.split(":")
    assert host == "127.0.0.1", store
    _wait_port(host, int(port), init_timeout)
    st = core.GlooParallelStrategy()
    st.rank, st.rank_num = rank, nranks
    st.ip_address, st.ip_port = host, int(port)
    st.iface = "lo"
    st.init_seconds, st.run_seconds = init_timeout, run_timeout
    ctx = core.GlooParallelContext(st)
    ctx.init()
    return ctx


def init_comm(rank, nranks):
    """Paddle 2.6: global GlooWrapper (init_gloo). Paddle 3.x: the all_reduce kernel reads a
    CommContext for ring "0" instead: create it over gloo on a TCPStore at $PADDLE_MASTER
    (127.0.0.1:port, rank 0 serves it), GLOO_SOCKET_IFNAME=lo for the gloo pairs."""
    if _has_op("c_allreduce_sum"):
        store = os.environ.get("AMP_GLOO_HTTP")
        if store is None:       # under paddle.distributed.launch: rank 0 serves the store itself
            store = os.environ["PADDLE_MASTER"]
            if rank == 0:
                _spawn_store(int(store.split(":")[1]))
        return init_gloo(rank, nranks, store)
    assert os.environ["PADDLE_MASTER"].startswith("127.0.0.1:")
    # = paddle.distributed.collective._init_parallel_env("gloo") minus its ParallelEnv.device_id
    # lookup, which raises AttributeError on a CPU-only build
    store = core.create_or_get_global_tcp_store()
    core.CommContextManager.create_gloo_comm_context(store, str(RING), rank, nranks)
    return store


def _spawn_store(port):
    import atexit
    import subprocess
    kv = subprocess.Popen([sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                        "_gloo_kv.py"), str(port), "300"],
                          stdin=subprocess.DEVNULL)
    atexit.register(kv.kill)


def _wait_port(host, port, timeout):
    import socket
    deadline = time.time() + timeout
    while True:
        try:
            socket.create_connection((host, port), timeout=1).close()
            return
        except OSError:
            if time.time() > deadline:
                raise TimeoutError(f"gloo rendezvous {host}:{port} not up after {timeout}s")
            time.sleep(0.1)


_REDUCE_TYPE = {"sum": 0, "max": 1, "min": 2, "prod": 3}


def _has_op(name):
    from paddle.base.framework import OpProtoHolder
    return name in OpProtoHolder.instance().op_proto_map


def allreduce_(block, var, op="sum"):
    """In-place all-reduce of `var` over ring 0 (gloo on CPU).

    Paddle 2.6: op c_allreduce_<op> (X/Out). Paddle 3.x removed c_allreduce_* from the legacy op
    registry; the replacement is op all_reduce (x/out, attr reduce_type: 0 sum, 1 max, 2 min, 3 prod).
    """
    if _has_op(f"c_allreduce_{op}"):
        block.append_op(type=f"c_allreduce_{op}", inputs={"X": [var]}, outputs={"Out": [var]},
                        attrs={"ring_id": RING, "use_calc_stream": True})
    else:
        block.append_op(type="all_reduce", inputs={"x": [var]}, outputs={"out": [var]},
                        attrs={"ring_id": RING, "reduce_type": _REDUCE_TYPE[op]})
    return var


def reduce_found_inf(block, found_inf):
    """found_inf (bool[1]) -> max over all ranks (bool[1]). One 4-byte collective, no host sync."""
    as_int = paddle.cast(found_inf, "int32")
    allreduce_(block, as_int, "max")
    return paddle.cast(as_int, "bool")


def build(mode, nranks):
    main, startup = paddle.static.Program(), paddle.static.Program()
    main.random_seed = startup.random_seed = 1
    with paddle.static.program_guard(main, startup):
        block = main.global_block()
        x = paddle.static.data("x", [None, 4], "float32")
        y = paddle.static.data("y", [None, 1], "float32")
        inj = paddle.static.data("inj", [1], "float32")      # 0 normally, inf to inject
        scale = paddle.static.create_global_var([1], 1024.0, "float32", persistable=True,
                                                name="loss_scaling")
        good = paddle.static.create_global_var([1], 0, "int32", persistable=True, name="good_steps")
        bad = paddle.static.create_global_var([1], 0, "int32", persistable=True, name="bad_steps")
        h = paddle.static.nn.fc(x, 8, activation="relu")
        out = paddle.static.nn.fc(h, 1)
        loss = paddle.mean(paddle.square(out - y))
        scaled = loss * scale
        opt = paddle.optimizer.SGD(learning_rate=0.05)
        params_grads = paddle.static.append_backward(scaled)
        p0, g0 = params_grads[0]
        paddle.assign(g0 + inj, g0)                           # inject (x + 0 is exact)
        grads = [g for _, g in params_grads]
        if mode == "implicit":
            for g in grads:
                allreduce_(block, g, "sum")
            grads, found_inf = check_finite_and_unscale(grads, scale)
        else:
            grads, found_inf = check_finite_and_unscale(grads, scale)
            local_found = found_inf
            if mode == "reduced":
                found_inf = reduce_found_inf(block, found_inf)
            for g in grads:
                allreduce_(block, g, "sum")
        for g in grads:
            paddle.assign(g * (1.0 / nranks), g)
        # Paddle's own scale update: on found_inf it zeroes the grads (stop_update=False), which
        # makes SGD a bit-exact skip (p - lr*0 == p). Stateful optimizers need SkipUpdate.
        update_loss_scaling(grads, found_inf, scale, good, bad, incr_every_n_steps=4,
                            decr_every_n_nan_or_inf=1, incr_ratio=2.0, decr_ratio=0.5)
        opt.apply_gradients(list(zip([p for p, _ in params_grads], grads)))
    params = [p for p, _ in params_grads]
    fetch = {"loss": loss, "found_inf": found_inf, "scale": scale,
             "local_found": locals().get("local_found", found_inf)}
    return main, startup, fetch, params


def run_fleet():
    from paddle.distributed import fleet
    fleet.init(is_collective=True)
    main, startup = paddle.static.Program(), paddle.static.Program()
    with paddle.static.program_guard(main, startup):
        x = paddle.static.data("x", [None, 4], "float32")
        loss = paddle.mean(paddle.static.nn.fc(x, 1))
        dopt = fleet.distributed_optimizer(paddle.optimizer.SGD(0.05), fleet.DistributedStrategy())
        dopt.minimize(loss)
    return {"ops": [op.type for op in main.global_block().ops]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["local", "reduced", "implicit", "fleet"])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--inject-step", type=int, default=5)
    ap.add_argument("--inject-rank", type=int, default=0)
    a = ap.parse_args()
    rank = int(os.environ["PADDLE_TRAINER_ID"])
    nranks = int(os.environ["PADDLE_TRAINERS_NUM"])
    res = {"rank": rank, "nranks": nranks, "mode": a.mode, "paddle": paddle.__version__}
    if a.mode == "fleet":
        res.update(run_fleet())
    else:
        gloo = init_comm(rank, nranks)
        main_p, startup, fetch, params = build(a.mode, nranks)
        res["ops"] = [op.type for op in main_p.global_block().ops]
        exe = paddle.static.Executor(paddle.CPUPlace())
        exe.run(startup)
        rng = np.random.RandomState(100 + rank)                 # each rank its own data
        names = list(fetch)
        log = []
        for step in range(a.steps):
            xv = rng.randn(8, 4).astype("float32")
            yv = xv.sum(1, keepdims=True).astype("float32")
            iv = np.array([np.inf if (step == a.inject_step and rank == a.inject_rank) else 0.0],
                          "float32")
            outs = exe.run(main_p, feed={"x": xv, "y": yv, "inj": iv},
                           fetch_list=[fetch[n] for n in names] + params)
            vals = dict(zip(names, outs[:len(names)]))
            h = hashlib.sha256()
            for arr in outs[len(names):]:
                h.update(np.ascontiguousarray(arr).tobytes())
            log.append({"step": step, "loss": float(vals["loss"]),
                        "found": bool(np.asarray(vals["found_inf"]).reshape(-1)[0]),
                        "local_found": bool(np.asarray(vals["local_found"]).reshape(-1)[0]),
                        "scale": float(np.asarray(vals["scale"]).reshape(-1)[0]),
                        "digest": h.hexdigest()[:16],
                        "params_finite": bool(all(np.isfinite(o).all() for o in outs[len(names):]))})
        res["steps"] = log
        res["final_digest"] = log[-1]["digest"]
        res["final_scale"] = log[-1]["scale"]
    res["worker_s"] = round(time.time() - T0, 3)
    out = os.environ.get("AMP_DIST_OUT")
    if out:
        with open(out, "w") as f:
            json.dump(res, f)
    else:                      # under paddle.distributed.launch: one line in log_dir/workerlog.N
        print("RESULT " + json.dumps({k: v for k, v in res.items() if k != "ops"}), flush=True)


if __name__ == "__main__":
    main()
