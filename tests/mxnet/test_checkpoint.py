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


def test_every_state_dict_corruption_is_refused_and_changes_nothing():
    import sys
    from pathlib import Path

    import numpy as np
    import pytest
    from mxnet import gluon

    from amp_adapters import AmpConfigError
    from mxnet_testutil import backward, batch, mlp
    sys.path.insert(0, str(Path(__file__).parents[1] / "core"))
    from scaler_cases import CORRUPTIONS, corrupt

    running = amp.DynamicLossScale(hysteresis=2, max_scale=float("inf"), scale=8.0)
    net = mlp()
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1})
    amp.init_trainer(trainer, running)
    backward(net, trainer, *batch(0))
    trainer._params[0].grad()[0] = np.inf
    trainer.step(4)
    before = amp.state_dict(trainer)
    good = {"loss_scale": corrupt(("state", "total_steps"), 9,
                                  corrupt(("state", "scale"), 4.0, before["loss_scale"])),
            "last_step_skipped": False}
    cases = [(lambda d, p=p, v=v: {**d, "loss_scale": corrupt(p, v, d["loss_scale"])}, p[-1],
              shown) for p, v, shown in CORRUPTIONS]
    cases += [(lambda d: {k: v for k, v in d.items() if k != "last_step_skipped"},
               "last_step_skipped", "'last_step_skipped'"),
              (lambda d: {**d, "extra": 1}, "extra", "'extra'"),
              (lambda d: {**d, "last_step_skipped": 1}, "last_step_skipped", "1")]
    for make, key, shown in cases:
        with pytest.raises(AmpConfigError) as e:
            amp.load_state_dict(trainer, make(good))
        assert key in str(e.value) and shown in str(e.value), str(e.value)
        assert amp.state_dict(trainer) == before, key
    amp.load_state_dict(trainer, good)
    assert amp.loss_scale(trainer).state.as_dict() == good["loss_scale"]["state"]
    # the trainer keeps its own config: a checkpoint of another config is refused, not applied
    other = amp.DynamicLossScale(scale=8.0).state_dict()
    with pytest.raises(AmpConfigError, match="hysteresis"):
        amp.load_state_dict(trainer, {"loss_scale": other, "last_step_skipped": False})
    assert amp.loss_scale(trainer).hysteresis == 2
