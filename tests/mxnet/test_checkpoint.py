"""Checkpoint at step k, resume in a new process: the same scale trajectory and weights."""
import json
import os
import subprocess
import sys

import mxnet as mx

import mxnet_amp as amp
import ckpt_job

K, N = 4, 9


def test_resume_in_new_process_matches_uninterrupted_run(tmp_path):
    net, trainer = ckpt_job.build()
    scales = ckpt_job.train(net, trainer, 0, N, ckpt_dir=str(tmp_path), ckpt_at=K)
    final_state = amp.state_dict(trainer)
    assert amp.loss_scale(trainer).skipped_steps == len(ckpt_job.INF_STEPS)
    moves = list(zip(scales, scales[1:]))
    assert any(b > a for a, b in moves) and any(b < a for a, b in moves)  # grew and backed off

    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [os.path.dirname(ckpt_job.__file__), os.getcwd(), os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run([sys.executable, ckpt_job.__file__, str(tmp_path), str(K), str(N)],
                         env=env, capture_output=True, text=True, check=True, timeout=120)
    resumed_scales, resumed_state = json.loads(out.stdout.strip().splitlines()[-1])
    assert resumed_scales == scales[K:]
    assert resumed_state == final_state

    resumed = mx.nd.load(str(tmp_path / "resumed.params"))
    for name, p in net._collect_params_with_prefix().items():
        assert resumed[name].asnumpy().tobytes() == p.data().asnumpy().tobytes(), name
