"""One data-parallel Paddle worker (static program, CPU, gloo) for test_paddle_distributed.

Started by tests/distributed/pd_launch.launch, which sets PADDLE_TRAINER_ID / PADDLE_TRAINERS_NUM /
PADDLE_MASTER / AMP_GLOO_HTTP (all on 127.0.0.1) and $AMP_DIST_OUT, where this writes one JSON.

    python paddle_dist_worker.py auto|off STEPS INJECT_STEP

The program is in the IR FLAGS_enable_pir_api selects (the test passes the session's IR).
Each worker builds the same MLP program with ``paddle_amp.decorate(Momentum)`` (a stateful
optimizer, so an overflow step runs the true-skip path: the optimizer in a conditional block),
``found_inf_ring_id`` left to auto (``auto``: on, ring 0, since PADDLE_TRAINERS_NUM=2) or False
(``off``). The gradients are summed over the workers by hand (c_allreduce_sum on Paddle 2.6,
all_reduce on 3.x, then / nranks) *after* paddle_amp's check, so the check sees this worker's
local gradients: the case where only the reduced flag keeps the workers together. Worker 0 adds
inf to one gradient (through the feed) at INJECT_STEP only.
"""
import hashlib
import json
import os
import socket
import sys
import time

os.environ.setdefault("FLAGS_enable_pir_api", "0")

import numpy as np  # noqa: E402
import paddle  # noqa: E402
from paddle.base import core  # noqa: E402
from paddle.base.framework import OpProtoHolder  # noqa: E402

import paddle_amp  # noqa: E402
from paddle_amp.ir import kind as program_ir  # noqa: E402
from paddle_amp.ir.pir.opnames import legacy_name  # noqa: E402
from paddle_helpers import AMP_STATE_PREFIXES, mlp  # noqa: E402

RING = 0
IN_DIM = 4
# paddle_amp's own ops between the check and the first reader of found_inf (the flag reduction)
FLAG_OPS = ("logical_or", "cast", "c_allreduce_max", "all_reduce")


def _has_op(name):
    return name in OpProtoHolder.instance().op_proto_map


def init_comm(rank, nranks):
    """The ring-0 communicator over gloo, loopback only (what paddle.distributed.init_parallel_env
    would do on GPU with NCCL; on a CPU build it cannot, see /work/notes/dist_findings.md §2).

    Paddle 2.6: the CPU c_allreduce_* kernels read the process-global GlooWrapper, which only
    GlooParallelContext.init() sets up; its HTTP rendezvous store is served by the launcher
    ($AMP_GLOO_HTTP): init() holds the GIL while it waits, so the store cannot be a thread here.
    Paddle 3.x: the all_reduce kernel reads a gloo CommContext for ring "0" on a TCPStore at
    $PADDLE_MASTER (rank 0 serves it); GLOO_SOCKET_IFNAME=lo keeps the gloo pairs on loopback.
    """
    if _has_op("c_allreduce_sum"):
        host, port = os.environ["AMP_GLOO_HTTP"].split(":")
        assert host == "127.0.0.1", host
        deadline = time.time() + 30
        while True:  # the store is up before the workers start; wait anyway
            try:
                socket.create_connection((host, int(port)), timeout=1).close()
                break
            except OSError:
                if time.time() > deadline:
                    raise
                time.sleep(0.1)
        st = core.GlooParallelStrategy()
        st.rank, st.rank_num = rank, nranks
        st.ip_address, st.ip_port, st.iface = host, int(port), "lo"
        st.init_seconds, st.run_seconds = 30, 60  # bound a hang inside a collective
        ctx = core.GlooParallelContext(st)
        ctx.init()
        return ctx
    assert os.environ["PADDLE_MASTER"].startswith("127.0.0.1:"), os.environ["PADDLE_MASTER"]
    store = core.create_or_get_global_tcp_store()
    core.CommContextManager.create_gloo_comm_context(store, str(RING), rank, nranks)
    return store


def pir_flag_ops(block):
    """``flag_ops`` of a PIR block: (the last op of the flag reduction, its op names)."""
    ops = block.ops
    at = next(i for i, op in enumerate(ops) if op.name() == "pd_op.check_finite_and_unscale_")
    out, last = [], ops[at]
    for op in ops[at + 1:]:
        if op.name().startswith("builtin."):  # the split of the unscaled-gradients vector
            continue
        name = legacy_name(op.name())
        if name not in FLAG_OPS:
            break
        out.append(name + (f":{op.attrs()['reduce_type']}" if name == "all_reduce" else ""))
        last = op
    return last, out


def pir_insert_grad_allreduce(block, grads, nranks):
    """``insert_grad_allreduce`` for a PIR block: in-place all-reduce and scale of each
    gradient right after paddle_amp's check and flag reduction."""
    last, _ = pir_flag_ops(block)
    paddle.pir.set_insertion_point_after(last)
    for g in grads:
        paddle._C_ops.all_reduce_(g, RING, 0)  # 0 = sum
        paddle._C_ops.scale_(g, 1.0 / nranks, 0.0, True)
    paddle.pir.reset_insertion_point_to_end()


def flag_ops(block):
    """paddle_amp's ops right after its check (the flag reduction, if any), as "type[:reduce]"."""
    at = next(i for i, op in enumerate(block.ops) if op.type == "check_finite_and_unscale") + 1
    out = []
    while block.ops[at].type in FLAG_OPS:
        op = block.ops[at]
        out.append(op.type + (f":{op.attr('reduce_type')}" if op.type == "all_reduce" else ""))
        at += 1
    return at, out


def insert_grad_allreduce(block, grads, nranks):
    """Sum the gradients over ring 0 and divide by ``nranks``, right after paddle_amp's check
    (and its flag reduction), before the overflow branch and the optimizer."""
    at, _ = flag_ops(block)
    for g in grads:
        if _has_op("c_allreduce_sum"):
            block._insert_op(at, type="c_allreduce_sum", inputs={"X": [g]}, outputs={"Out": [g]},
                             attrs={"ring_id": RING, "use_calc_stream": True})
        else:
            block._insert_op(at, type="all_reduce", inputs={"x": [g]}, outputs={"out": [g]},
                             attrs={"ring_id": RING, "reduce_type": 0})
        block._insert_op(at + 1, type="scale", inputs={"X": [g]}, outputs={"Out": [g]},
                         attrs={"scale": 1.0 / nranks, "bias": 0.0, "bias_after_scale": True})
        at += 2


def build(ring_setting, nranks):
    main, startup = paddle.static.Program(), paddle.static.Program()
    main.random_seed = startup.random_seed = 1  # the same initial parameters on every worker
    with paddle.static.program_guard(main, startup):
        x, y, loss = mlp(in_dim=IN_DIM, hidden=8)
        inj = paddle.static.data("inj", [1], "float32")  # 0, or inf to inject
        opt = paddle_amp.decorate(
            paddle.optimizer.Momentum(learning_rate=0.05, momentum=0.9),
            init_loss_scaling=1024.0, incr_every_n_steps=4, decr_every_n_nan_or_inf=1,
            found_inf_ring_id=ring_setting)
        params_grads = opt.backward(loss)
        _, g0 = params_grads[0]
        paddle.assign(g0 + inj, g0)  # g + 0 is exact
        opt.apply_optimize(loss, startup, params_grads)
        block = main.global_block()
        if program_ir(main) == "pir":
            reduction = pir_flag_ops(block)[1]
            pir_insert_grad_allreduce(block, [g for _, g in params_grads], nranks)
            check = next(op for op in block.ops
                         if op.name() == "pd_op.check_finite_and_unscale_")
            return main, startup, opt, loss, check.result(1), reduction
        reduction = flag_ops(block)[1]
        insert_grad_allreduce(block, [g for _, g in params_grads], nranks)
    check = next(op for op in block.ops if op.type == "check_finite_and_unscale")
    local_found = check.output("FoundInfinite")[0]
    return main, startup, opt, loss, local_found, reduction


def state_digest(program, scope):
    """sha256 of every parameter and optimizer state (velocity, learning rate), by name."""
    h = hashlib.sha256()
    finite = True
    if program_ir(program) == "pir":
        for name, tensor in sorted(program.state_dict("all", scope).items()):
            if not name.startswith(AMP_STATE_PREFIXES):
                arr = np.array(tensor)
                h.update(name.encode() + arr.tobytes())
                finite = finite and bool(np.isfinite(arr).all())
        return h.hexdigest(), finite
    for var in sorted(program.list_vars(), key=lambda v: v.name):
        if var.persistable and var.type == core.VarDesc.VarType.LOD_TENSOR \
                and not var.name.startswith(AMP_STATE_PREFIXES):
            arr = np.array(scope.find_var(var.name).get_tensor())
            h.update(var.name.encode() + arr.tobytes())
            finite = finite and bool(np.isfinite(arr).all())
    return h.hexdigest(), finite


def main(mode, steps, inject_step):
    rank = int(os.environ["PADDLE_TRAINER_ID"])
    nranks = int(os.environ["PADDLE_TRAINERS_NUM"])
    comm = init_comm(rank, nranks)  # noqa: F841 - keep the communicator alive
    paddle.enable_static()
    main_p, startup, opt, loss, local_found, reduction = build(
        {"auto": None, "off": False}[mode], nranks)
    exe = paddle.static.Executor(paddle.CPUPlace())
    scope = paddle.static.global_scope()
    exe.run(startup)
    opt.amp_init(paddle.CPUPlace())
    rng = np.random.RandomState(100 + rank)  # each worker its own data
    log = []
    for step in range(steps):
        x = rng.randn(8, IN_DIM).astype("float32")
        inj = np.float32(np.inf if (step == inject_step and rank == 0) else 0.0)
        loss_v, found_v = exe.run(main_p, feed={"x": x, "y": x.sum(1, keepdims=True),
                                               "inj": np.array([inj], "float32")},
                                  fetch_list=[loss, local_found])
        digest, finite = state_digest(main_p, scope)
        amp = opt.state_dict()
        log.append({"amp": amp.get("state", amp), "digest": digest, "finite": finite})
        log[-1]["local_found"] = bool(np.asarray(found_v).reshape(-1)[0])
        log[-1]["loss"] = float(np.asarray(loss_v).reshape(-1)[0])
    with open(os.environ["AMP_DIST_OUT"], "w") as f:
        json.dump({"rank": rank, "paddle": paddle.__version__, "ring_id": opt.found_inf_ring_id,
                   "flag_ops": reduction, "steps": log}, f)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
