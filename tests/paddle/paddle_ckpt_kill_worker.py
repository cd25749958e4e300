"""Worker for the kill test: resume from DIR if it can, train to step N, checkpoint every step.

``python ckpt_kill_worker.py DIR N``; prints the same protocol as
tests/mxnet/ckpt_kill_worker.py (START / FRESH / F / B / E / DONE). The
fingerprint is the SHA-256 of every persistable of the program (parameters,
Adam moments and beta powers, learning rate, the loss-scale vars). The IR is
``AMP_TEST_IR``'s (legacy unless "pir"), as in the rest of the suite.
"""
import hashlib
import os
import sys

# The IR under test, as tests/paddle/conftest.py picks it (read before Paddle is imported).
os.environ["FLAGS_enable_pir_api"] = "1" if os.environ.get("AMP_TEST_IR") == "pir" else "0"
os.environ.setdefault("GLOG_minloglevel", "2")

import numpy as np  # noqa: E402
import paddle  # noqa: E402

import paddle_amp  # noqa: E402
from amp_adapters import CheckpointError  # noqa: E402
from paddle_helpers import Static, batch, is_pir, mlp  # noqa: E402

OVERFLOW_STEPS = {3, 7, 8}


def fingerprint(env):
    h = hashlib.sha256()
    if is_pir(env.main):  # every persistable value, the loss-scale state included
        for name, tensor in sorted(env.main.state_dict("all", env.scope).items()):
            h.update(name.encode() + np.array(tensor).tobytes())
        return h.hexdigest()[:16]
    for var in sorted(env.main.list_vars(), key=lambda v: v.name):
        if var.persistable and var.type == paddle.base.core.VarDesc.VarType.LOD_TENSOR:
            found = env.scope.find_var(var.name)
            if found is not None and found.get_tensor()._is_initialized():
                h.update(var.name.encode() + np.array(found.get_tensor()).tobytes())
    return h.hexdigest()[:16]


def main(directory, n):
    paddle.enable_static()
    env = Static.new(seed=7)
    with paddle.static.program_guard(env.main, env.startup), \
            paddle.static.scope_guard(env.scope):
        _, _, loss = mlp()
        opt = paddle_amp.decorate(paddle.optimizer.Adam(0.01), init_loss_scaling=8.0,
                                  incr_every_n_steps=2, decr_every_n_nan_or_inf=1)
        opt.minimize(loss)
        env.exe.run(env.startup)
        opt.amp_init(paddle.CPUPlace())
        try:
            start = opt.load_checkpoint(directory, env.main)
        except CheckpointError as e:
            if "no complete checkpoint" not in str(e) and "does not exist" not in str(e):
                raise
            print("FRESH", str(e).replace("\n", " "), flush=True)
            start = 0
        print("START", start, fingerprint(env), flush=True)
        for k in range(start + 1, n + 1):
            env.run(batch(k, overflow=k in OVERFLOW_STEPS))
            print("F", k, fingerprint(env), opt.loss_scale().scale, flush=True)
            print("B", k, flush=True)
            opt.save_checkpoint(directory, env.main, step=k)
            print("E", k, flush=True)
    print("DONE", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
