"""Resume a checkpoint in a new process: ``python paddle_resume_worker.py CKPT_DIR FIRST_STEP``.

Rebuilds the program, loads parameters, optimizer state and the loss-scale
state_dict, runs the remaining steps and writes the trajectory and the final
parameters to CKPT_DIR/resumed.json and CKPT_DIR/resumed.npz.
"""
import json
import os
import sys

os.environ.setdefault("FLAGS_enable_pir_api", "0")

import numpy as np  # noqa: E402
import paddle  # noqa: E402

import paddle_amp  # noqa: E402
from paddle_helpers import RESUME_STEPS, Static, resume_build, resume_run  # noqa: E402


def main(ckpt: str, first: int) -> None:
    paddle.enable_static()
    env = Static.new(seed=123)  # a different init: everything must come from the checkpoint
    with paddle.static.program_guard(env.main, env.startup), paddle.static.scope_guard(env.scope):
        opt = resume_build(paddle_amp)
        env.exe.run(env.startup)
        paddle.static.load(env.main, os.path.join(ckpt, "model"), env.exe)
        with open(os.path.join(ckpt, "amp.json")) as f:
            opt.load_state_dict(json.load(f))
        trajectory = resume_run(env, opt, range(first, RESUME_STEPS))
        np.savez(os.path.join(ckpt, "resumed.npz"), **env.state())
    with open(os.path.join(ckpt, "resumed.json"), "w") as f:
        json.dump(trajectory, f)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
