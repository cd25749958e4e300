"""Worker for the dygraph kill test: resume from DIR if it can, train to step N, checkpoint
every step with ``paddle_amp.dygraph.save_checkpoint``.

``python dygraph_ckpt_kill_worker.py DIR N``; prints the same protocol as
tests/mxnet/ckpt_kill_worker.py (START / FRESH / F / B / E / DONE). The loop is
a training engine's (PaddleClas, PaddleSeg): ``auto_cast`` at O1, a
``GradScaler``, Adam, ``scaler.scale(loss).backward(); scaler.minimize(...)``,
in bf16 where the device truth (``bf16_class(machine())``) says oneDNN runs it
natively, else fp16 emulated, or as ``AMP_KILL_LOW`` names (the test's label).
Each step's region must have run as the label says (a kernel, or emulated), or
the worker fails. In fp16 some steps overflow (the scaler skips them and backs
off); in bf16 the dynamic scaler turns itself off at its first ``scale()``, as
the native's does, and a resume must turn a fresh one off the same way. The
fingerprint is the SHA-256 of every parameter, every optimizer state value
(Adam's moments, beta powers, the learning rate) and the scaler's whole state,
so two runs agree on it only when they are bit-identical.
"""
import hashlib
import os
import sys

# The IR under test, as tests/paddle/conftest.py picks it (read before Paddle is imported).
os.environ["FLAGS_enable_pir_api"] = "1" if os.environ.get("AMP_TEST_IR") == "pir" else "0"
os.environ.setdefault("GLOG_minloglevel", "2")

import numpy as np  # noqa: E402
import paddle  # noqa: E402

from amp_adapters import CheckpointError  # noqa: E402
from amp_adapters.rules.isa import bf16_class, machine  # noqa: E402
from paddle_amp import dygraph as amp  # noqa: E402
from paddle_amp.dygraph.checkpoint import optimizer_state  # noqa: E402

OVERFLOW_STEPS = {3, 7, 8}  # fp16: the loss is inf, the scaler skips the step and backs off
# (dtype, emulate, how each lowered op runs), by the label the test gives (AMP_KILL_LOW)
RUNS = {"bfloat16-kernel": ("bfloat16", False, "kernel"),
        "float16-emulated": ("float16", True, "emulated")}


def device_low() -> str:
    """bf16 on oneDNN's kernels where the device truth says they are native, else fp16
    emulated."""
    return "bfloat16-kernel" if bf16_class(machine()) == "native" else "float16-emulated"


LOW = RUNS[os.environ.get("AMP_KILL_LOW") or device_low()]


def build():
    paddle.seed(7)
    model = paddle.nn.Sequential(paddle.nn.Linear(8, 16), paddle.nn.ReLU(),
                                 paddle.nn.Linear(16, 1))
    opt = paddle.optimizer.Adam(1e-2, parameters=model.parameters())
    model, opt = amp.decorate(models=model, optimizers=opt, level="O1")
    return model, opt, amp.GradScaler(init_loss_scaling=8.0, incr_every_n_steps=2,
                                      decr_every_n_nan_or_inf=1)


def fingerprint(model, opt, scaler):
    h = hashlib.sha256()
    for name, value in sorted(model.state_dict(use_hook=False).items()):
        h.update(name.encode() + value.numpy().tobytes())
    for name, value in sorted(optimizer_state(opt).items()):  # moments a load parked too
        data = np.array(value).tobytes() if hasattr(value, "shape") else repr(value).encode()
        h.update(name.encode() + data)
    h.update(repr(scaler.loss_scale()).encode())
    return h.hexdigest()[:16]


def step(model, opt, scaler, k):
    """Training step k (1-based): its data depend on k only."""
    rs = np.random.RandomState(k)
    x = paddle.to_tensor(rs.uniform(-1, 1, (4, 8)).astype(np.float32))
    y = paddle.to_tensor(rs.uniform(-1, 1, (4, 1)).astype(np.float32))
    dtype, emulate, runs = LOW
    with amp.auto_cast(level="O1", dtype=dtype, emulate=emulate) as frame:
        loss = paddle.nn.functional.mse_loss(model(x), y)
    ran = {d.execution for d in frame.ran.values()}
    if ran != {runs}:
        raise AssertionError(f"step {k} ran {ran}, not {runs} ({dtype}) as the device says")
    if k in OVERFLOW_STEPS and scaler.is_enable():  # bf16: the scaler turned itself off
        loss = loss * float("inf")
    scaled = scaler.scale(loss)
    scaled.backward()
    scaler.minimize(opt, scaled)
    opt.clear_grad()


def main(directory, n):
    paddle.disable_static()
    model, opt, scaler = build()
    try:
        start = amp.load_checkpoint(directory, model, opt, scaler)
    except CheckpointError as e:
        if "no complete checkpoint" not in str(e) and "does not exist" not in str(e):
            raise
        print("FRESH", str(e).replace("\n", " "), flush=True)
        start = 0
    print("START", start, fingerprint(model, opt, scaler), flush=True)
    for k in range(start + 1, n + 1):
        step(model, opt, scaler, k)
        print("F", k, fingerprint(model, opt, scaler), scaler.loss_scale()[1].scale, flush=True)
        print("B", k, flush=True)
        amp.save_checkpoint(directory, model, opt, scaler, step=k)
        print("E", k, flush=True)
    print("DONE", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
