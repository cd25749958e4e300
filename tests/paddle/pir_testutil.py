"""Shared by the PIR tests: programs built in either IR in one process, deterministic
parameters identical in both IRs, and the small models the PIR tests use."""
import contextlib
import re

import numpy as np
import paddle
from paddle.base import unique_name

import paddle_amp
from paddle_helpers import Static, batch, is_pir, mlp, white_list_model  # noqa: F401


OPTIMIZERS = {
    "sgd": lambda: paddle.optimizer.SGD(0.05),
    "sgd_l2": lambda: paddle.optimizer.SGD(0.05, weight_decay=paddle.regularizer.L2Decay(0.01)),
    "momentum": lambda: paddle.optimizer.Momentum(0.05, momentum=0.9),
    "adam": lambda: paddle.optimizer.Adam(0.01),
    "adamw": lambda: paddle.optimizer.AdamW(0.01, weight_decay=0.1),
    "lamb": lambda: paddle.optimizer.Lamb(0.01),
    "momentum_clip": lambda: paddle.optimizer.Momentum(
        0.05, momentum=0.9, grad_clip=paddle.nn.ClipGradByGlobalNorm(1.0)),
}


def phi_or_none(legacy: str):
    try:
        return paddle.base.core._get_phi_kernel_name(legacy)
    except Exception:  # noqa: BLE001 - a legacy op with no phi kernel
        return None


@contextlib.contextmanager
def built(ir: str, seed: int = 7):
    """A fresh Static env whose programs are in ``ir`` ('pir' or 'legacy'), in one process."""
    paddle.enable_static()
    guard = paddle.pir_utils.OldIrGuard() if ir == "legacy" else contextlib.nullcontext()
    try:
        with guard:
            env = Static.new(seed)
            with paddle.static.program_guard(env.main, env.startup), \
                    paddle.static.scope_guard(env.scope), unique_name.guard():
                yield env
    finally:
        paddle.disable_static()


def natural(name: str) -> list:
    """Sort key that orders fc_9 before fc_10, so two runs' names line up by position."""
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]


def params(program) -> list:
    if is_pir(program):
        return sorted((op.result(0).name for op in program.global_block().ops
                       if op.name() == "builtin.parameter"), key=natural)
    return sorted((p.name for p in program.global_block().all_parameters()), key=natural)


def by_position(state: dict) -> list:
    return [state[k] for k in sorted(state, key=natural)]


def same_init(env) -> None:
    """Deterministic parameters, identical in both IRs (the initializers' streams are not)."""
    for i, name in enumerate(params(env.main)):
        tensor = env.scope.find_var(name).get_tensor()
        shape = np.array(tensor).shape
        tensor.set(np.random.RandomState(i).uniform(-0.5, 0.5, shape).astype("float32"),
                   paddle.CPUPlace())


def train(ir: str, optimizer: str, steps: int, overflow=(), **decorate):
    with built(ir) as env:
        _, _, loss = mlp()
        opt = paddle_amp.decorate(OPTIMIZERS[optimizer](), **decorate)
        opt.minimize(loss)
        env.exe.run(env.startup)
        same_init(env)
        opt.amp_init(paddle.CPUPlace())
        losses = [float(np.asarray(env.run(batch(s, overflow=s in overflow), [loss])[0]).ravel()[0])
                  for s in range(steps)]
        return losses, opt.state_dict(), env.state(), paddle_amp.cast_report(env.main)


def casts(program) -> list:
    return [op for op in program.global_block().ops if op.name() == "pd_op.cast"]


def layernorm_model():
    """fc -> layer_norm -> scale -> fc: layer_norm stays fp32; scale has a CPU fp16 kernel."""
    x = paddle.static.data("x", [None, 8], "float32")
    y = paddle.static.data("y", [None, 1], "float32")
    h = paddle.nn.LayerNorm(16)(paddle.static.nn.fc(x, 16))
    out = paddle.static.nn.fc(paddle.scale(h, 0.5), 1)
    diff = out - y
    return out, paddle.mean(diff * diff)
