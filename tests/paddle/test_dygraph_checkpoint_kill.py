"""SIGKILL a dygraph training loop (engine style: auto_cast O1, GradScaler, Adam) that
checkpoints every step with ``paddle_amp.dygraph.save_checkpoint``, at random points, >= 10
times per precision (at startup, inside a save, between steps): every resume is
bit-identical to the uninterrupted run (parameters, Adam's moments, the scaler's state), or a
clear "no complete checkpoint" error. In fp16 emulated (the scaler skips overflow steps and
backs off), and in bf16 where the device truth says it is native (the scaler turns itself
off, and a resume must too). The shared driver is tests/kill/driver.py, as for Paddle's
static programs and Gluon. It found two bugs: a resume whose first step was skipped saved no
Adam moments, and a bf16 run's checkpoint (its scaler off) refused the resume
(test_dygraph_checkpoint.py)."""
import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "kill"))

import driver  # noqa: E402
from dygraph_ckpt_kill_worker import device_low  # noqa: E402

WORKER = os.path.join(HERE, "dygraph_ckpt_kill_worker.py")
PATHS = [HERE, os.path.dirname(os.path.dirname(HERE))]
LOWS = sorted({"float16-emulated", device_low()})


@pytest.mark.parametrize("low", LOWS)
def test_kills_at_random_points_never_corrupt_a_resume(low, monkeypatch):
    monkeypatch.setenv("AMP_KILL_LOW", low)  # the workers (the zygote's children) inherit it
    driver.check_kills_never_corrupt(WORKER, PATHS, kills=10)
