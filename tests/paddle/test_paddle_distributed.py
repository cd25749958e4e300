"""Data parallel: every worker takes the same skip decision when one worker's gradient overflows.

Two real workers (paddle_dist_worker.py, gloo on 127.0.0.1, launched by
tests/distributed/pd_launch.py) train the same program through paddle_amp with Momentum; the
gradients are summed *after* paddle_amp's check, so each worker checks only its own gradients,
and worker 0 alone gets an inf at step INJECT. Each job takes a few seconds and is killed after
TIMEOUT seconds at the latest.
"""
import os
import sys
from pathlib import Path

import paddle
import pytest

import paddle_amp
from paddle_helpers import is_pir, mlp, pir_mode

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO / "tests" / "distributed"))
import pd_launch  # noqa: E402

STEPS, INJECT, TIMEOUT = 10, 3, 60
# the flag reduction paddle_amp inserts: int32 cast, all-reduce max, cast back to bool
REDUCTION = ["cast", "c_allreduce_max" if "c_allreduce_max" in
             paddle.base.framework.OpProtoHolder.instance().op_proto_map else "all_reduce:1",
             "cast"]


def _run(mode):
    env = {"PYTHONPATH": os.pathsep.join([str(REPO), str(HERE), os.environ.get("PYTHONPATH", "")]),
           "FLAGS_enable_pir_api": "1" if pir_mode() else "0"}  # the session's IR
    results = pd_launch.launch([sys.executable, str(HERE / "paddle_dist_worker.py"), mode,
                                str(STEPS), str(INJECT)], nproc=2, timeout=TIMEOUT, extra_env=env)
    a, b = sorted(results, key=lambda r: r["rank"])
    return a, b


def test_overflow_on_one_worker_is_skipped_by_all():
    a, b = _run("auto")  # found_inf_ring_id=None: on, since PADDLE_TRAINERS_NUM=2
    assert a["ring_id"] == b["ring_id"] == 0 and a["flag_ops"] == REDUCTION
    # only worker 0 saw the inf in its own gradients ...
    assert [s["local_found"] for s in a["steps"]] == [i == INJECT for i in range(STEPS)]
    assert not any(s["local_found"] for s in b["steps"])
    # ... yet both skipped that step (parameters and velocity unchanged), with the same loss-scale
    # state and bit-identical parameters and optimizer state at every step, before and after
    for r in (a, b):
        skipped = [s["amp"]["skipped_steps"] for s in r["steps"]]
        assert skipped == [int(i >= INJECT) for i in range(STEPS)]
        assert r["steps"][INJECT]["digest"] == r["steps"][INJECT - 1]["digest"]
        assert len({s["digest"] for s in r["steps"]}) == STEPS - 1  # every other step moved
        assert all(s["finite"] for s in r["steps"])
    assert [s["amp"] for s in a["steps"]] == [s["amp"] for s in b["steps"]]
    assert [s["digest"] for s in a["steps"]] == [s["digest"] for s in b["steps"]]
    scales = [s["amp"]["scale"] for s in a["steps"]]
    assert scales == [1024.0] * INJECT + [512.0] * 4 + [1024.0] * (STEPS - INJECT - 4)


def test_without_found_inf_reduction_workers_diverge():
    a, b = _run("off")  # found_inf_ring_id=False: each worker decides on its own gradients
    assert a["ring_id"] is None and a["flag_ops"] == []
    assert [s["digest"] for s in a["steps"][:INJECT]] == [s["digest"] for s in b["steps"][:INJECT]]
    assert a["steps"][INJECT]["amp"]["skipped_steps"] == 1   # worker 0 skips ...
    assert b["steps"][INJECT]["amp"]["skipped_steps"] == 0   # ... worker 1 applies inf + g
    assert a["steps"][INJECT]["amp"]["scale"] != b["steps"][INJECT]["amp"]["scale"]
    assert a["steps"][INJECT]["digest"] != b["steps"][INJECT]["digest"]
    assert not b["steps"][-1]["finite"]


def _build(**kw):
    _, _, loss = mlp()
    opt = paddle_amp.decorate(paddle.optimizer.Momentum(0.1), **kw)
    opt.minimize(loss)
    ops = loss.block.program.global_block().ops
    if is_pir(loss.block.program):
        return opt, [op.attrs()["ring_id"] for op in ops if op.name() == "pd_op.all_reduce_"]
    return opt, [op.attr("ring_id") for op in ops if op.type in ("c_allreduce_max", "all_reduce")]


@pytest.mark.parametrize("world, trainers, setting, ring", [
    (2, None, None, 0),      # auto: paddle.distributed.get_world_size() > 1
    (1, "2", None, 0),       # auto: PADDLE_TRAINERS_NUM > 1 (paddle.distributed.launch sets it)
    (1, None, None, None),   # auto: one process
    (2, "2", False, None),   # off
    (1, None, 3, 3),         # that ring
])
def test_found_inf_ring_id_setting(static, monkeypatch, world, trainers, setting, ring):
    # a stub: Paddle caches the world size of its first get_world_size() call for the process
    monkeypatch.setattr(paddle.distributed, "get_world_size", lambda: world)
    if trainers is None:
        monkeypatch.delenv("PADDLE_TRAINERS_NUM", raising=False)
    else:
        monkeypatch.setenv("PADDLE_TRAINERS_NUM", trainers)
    opt, reduce_ops = _build(found_inf_ring_id=setting)
    assert opt.found_inf_ring_id == ring
    assert reduce_ops == ([] if ring is None else [ring])


def test_found_inf_ring_id_must_be_a_ring(static):
    with pytest.raises(TypeError, match="found_inf_ring_id must be"):
        paddle_amp.decorate(paddle.optimizer.Momentum(0.1), found_inf_ring_id="0")
