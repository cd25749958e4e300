"""Data parallel in eager mode: one worker's overflow skips the step on every worker.

Two real workers (this file run as a script, ``paddle.distributed.init_parallel_env`` with
gloo on 127.0.0.1, launched by tests/distributed/pd_launch.py) train the same MLP with
Momentum through paddle_amp.dygraph's GradScaler, without DataParallel (each checks its own
gradients, as under ``no_sync`` accumulation or sharded gradients); worker 0 alone gets an
inf at step INJECT. Each job takes a few seconds and is killed after TIMEOUT at the latest.
"""
import hashlib
import json
import os
import sys
from pathlib import Path

STEPS, INJECT, TIMEOUT = 6, 2, 90


def _worker() -> None:
    import numpy as np
    import paddle
    import paddle.distributed as dist

    from paddle_amp import dygraph as amp

    dist.init_parallel_env()
    rank = dist.get_rank()
    paddle.seed(0)
    net = paddle.nn.Sequential(paddle.nn.Linear(4, 8), paddle.nn.ReLU(), paddle.nn.Linear(8, 1))
    opt = paddle.optimizer.Momentum(0.05, parameters=net.parameters())
    scaler = amp.GradScaler(init_loss_scaling=1024.0)
    x = paddle.to_tensor(np.ones((4, 4), np.float32))
    steps = []
    for i in range(STEPS):
        with amp.auto_cast(dtype="float16", emulate=True):
            loss = net(x).mean()
        if rank == 0 and i == INJECT:
            loss = loss * float("inf")
        scaled = scaler.scale(loss)
        scaled.backward()
        scaler.minimize(opt, scaled)
        opt.clear_grad()
        digest = hashlib.sha256(b"".join(p.numpy().tobytes() for p in net.parameters()))
        config, state = scaler.loss_scale()
        steps.append({"digest": digest.hexdigest(), "scale": state.scale,
                      "skipped": state.skipped_steps})
    with open(os.environ["AMP_DIST_OUT"], "w") as f:
        json.dump({"rank": rank, "steps": steps}, f)


def test_an_overflow_on_one_worker_is_skipped_by_all():
    repo = Path(__file__).resolve().parents[2]
    sys.path.insert(0, str(repo / "tests" / "distributed"))
    import pd_launch
    env = {"PYTHONPATH": os.pathsep.join([str(repo), os.environ.get("PYTHONPATH", "")])}
    results = pd_launch.launch([sys.executable, str(Path(__file__).resolve()), "worker"],
                               nproc=2, timeout=TIMEOUT, extra_env=env)
    a, b = sorted(results, key=lambda r: r["rank"])
    assert a["steps"] == b["steps"]  # the same parameters and scale at every step
    assert [s["skipped"] for s in a["steps"]] == [int(i >= INJECT) for i in range(STEPS)]
    assert a["steps"][INJECT]["digest"] == a["steps"][INJECT - 1]["digest"]
    assert [s["scale"] for s in a["steps"]] == [1024.0] * INJECT + [512.0] * (STEPS - INJECT)


if __name__ == "__main__" and sys.argv[1:] == ["worker"]:
    _worker()
