"""The four claim families as Paddle static programs (legacy IR), fp32 or under one AMP policy."""
from __future__ import annotations

import math

import numpy as np
import paddle

import paddle_amp
from amp_adapters import Policy

from .claim_data import LR, MOMENTUM, SHAPES, ClaimData, Outcome, test_metrics

D = 16  # transformer width


def _forward(family: str, x):
    F = paddle.nn.functional
    fc = paddle.static.nn.fc
    if family == "mlp":
        return fc(fc(x, 64, activation="relu"), 10)
    if family == "cnn":
        h = paddle.static.nn.conv2d(x, 8, 3, padding=1, act="relu")
        return fc(paddle.flatten(F.max_pool2d(h, 2), 1), 10)
    if family == "lstm":
        h, _ = paddle.nn.LSTM(8, 32)(x)
        return fc(h[:, -1, :], 10)
    x = fc(x, D, num_flatten_dims=2)  # pixels + one-hot position -> width D
    q, k, v = (fc(x, D, num_flatten_dims=2) for _ in range(3))
    att = F.softmax(paddle.matmul(q, k, transpose_y=True) * (1 / math.sqrt(D)), axis=-1)
    x = paddle.static.nn.layer_norm(x + fc(paddle.matmul(att, v), D, num_flatten_dims=2),
                                    begin_norm_axis=2)
    h = fc(F.gelu(fc(x, 2 * D, num_flatten_dims=2)), D, num_flatten_dims=2)
    x = paddle.static.nn.layer_norm(x + h, begin_norm_axis=2)
    return fc(paddle.mean(x, axis=1), 10)


def train(family: str, policy: Policy, data: ClaimData, k: float = 1.0) -> Outcome:
    """Train ``family`` with SGD+momentum on ``data`` (loss / k, lr x k) under ``policy``."""
    was_dynamic = paddle.in_dynamic_mode()
    paddle.enable_static()
    try:
        return _train(family, policy, data, k)
    finally:
        if was_dynamic:
            paddle.disable_static()


def _train(family: str, policy: Policy, data: ClaimData, k: float) -> Outcome:
    main, startup, scope = paddle.static.Program(), paddle.static.Program(), paddle.static.Scope()
    main.random_seed = startup.random_seed = 1  # nonzero: 0 means a fresh random seed
    on = policy.enabled
    with paddle.static.program_guard(main, startup), paddle.utils.unique_name.guard():
        x = paddle.static.data("x", [None, *SHAPES[family]], "float32")
        y = paddle.static.data("y", [None, 1], "int64")
        logits = _forward(family, x)
        loss = paddle.mean(paddle.nn.functional.cross_entropy(logits, y))
        opt = paddle.optimizer.Momentum(learning_rate=LR * k, momentum=MOMENTUM)
        if on:
            opt = paddle_amp.decorate(opt, policy=policy)
        opt.minimize(loss * (1.0 / k))
        test_program = main.clone(for_test=True)
    place = paddle.CPUPlace()
    exe = paddle.static.Executor(place)
    x_train = data.shaped(family, data.x_train)
    with paddle.static.scope_guard(scope):
        exe.run(startup)
        if on:
            opt.amp_init(place, scope=scope)
        for idx in data.batches:
            exe.run(main, feed={"x": x_train[idx], "y": data.y_train[idx].reshape(-1, 1)},
                    fetch_list=[])
        out, = exe.run(test_program, feed={"x": data.shaped(family, data.x_test),
                                           "y": data.y_test.reshape(-1, 1)},
                       fetch_list=[logits])
        state = opt.loss_scale(scope) if on else None
    acc, test_loss = test_metrics(np.asarray(out, dtype=np.float32), data.y_test)
    return Outcome(acc, test_loss, state.skipped_steps if state else 0,
                   state.scale if state else 1.0)
