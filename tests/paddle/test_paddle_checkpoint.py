"""Checkpoint and resume in a new process: the same scale trajectory and final parameters."""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import paddle

import paddle_amp
from paddle_helpers import RESUME_STEPS, resume_build, resume_run

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
SPLIT = 4


def test_resume_in_new_process_continues_exactly(static, tmp_path):
    opt = resume_build(paddle_amp)
    static.exe.run(static.startup)
    first = resume_run(static, opt, range(SPLIT))
    paddle.static.save(static.main, str(tmp_path / "model"))
    (tmp_path / "amp.json").write_text(json.dumps(opt.state_dict()))
    rest = resume_run(static, opt, range(SPLIT, RESUME_STEPS))  # the uninterrupted run
    states = [s["state"] for s in first + rest]  # state_dict format 1: {"state": {...}, ...}
    assert states[-1]["skipped_steps"] > states[SPLIT - 1]["skipped_steps"]
    assert len({s["scale"] for s in states}) > 2

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(REPO), str(HERE), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, str(HERE / "paddle_resume_worker.py"),
                           str(tmp_path), str(SPLIT)], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads((tmp_path / "resumed.json").read_text()) == rest
    resumed = np.load(tmp_path / "resumed.npz")
    final = static.state()
    assert sorted(resumed.files) == sorted(final)
    for name in final:
        assert np.array_equal(resumed[name], final[name]), name
