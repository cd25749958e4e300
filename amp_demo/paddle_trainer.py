"""The demo's Paddle trainer: the digits MLP as a static program, fp32 or under an AMP policy,
through ``paddle_amp``."""
from __future__ import annotations

import contextlib

import time
from typing import Callable, Optional

import numpy as np
import paddle

from amp_adapters import Policy
from amp_adapters.services.timing import ratio_of
from paddle_amp import cast_report, decorate

from .data import DigitsData, evaluate
from .result import OnStep, Steps, TrainResult, gemm_summary, mode_label, run_steps


def train_digits(policy: Policy, data: DigitsData, *, lr: float = 0.1, k: float = 1.0,
                 on_step: Optional[OnStep] = None) -> TrainResult:
    """Train fc-relu-fc on ``data`` (``digits_steps``)."""
    return run_steps(digits_steps(policy, data, lr=lr, k=k), on_step)


def digits_steps(policy: Policy, data: DigitsData, *, lr: float = 0.1,
                 k: float = 1.0) -> Steps:
    """The steps of fc-relu-fc on ``data`` with SGD (loss / k, lr x k) in a fresh program and
    scope (static mode while they run).

    ``policy`` O0 is the plain fp32 program (no ``decorate``). One host sync per
    step (fetching the loss); the scale is read from the scope. ``casts`` counts
    the forward cast ops in the program, emulation's round trips included.
    """
    was_dynamic = paddle.in_dynamic_mode()
    paddle.enable_static()
    try:
        return (yield from _steps(policy, data, lr, k))
    finally:
        if was_dynamic:
            paddle.disable_static()


def _param(name: str, value: np.ndarray) -> paddle.ParamAttr:
    return paddle.ParamAttr(name=name, initializer=paddle.nn.initializer.Assign(value))


def _steps(policy: Policy, data: DigitsData, lr: float, k: float) -> Steps:
    main, startup, scope = paddle.static.Program(), paddle.static.Program(), paddle.static.Scope()
    amp = policy.enabled
    with paddle.static.program_guard(main, startup), paddle.utils.unique_name.guard():
        x = paddle.static.data("x", [None, 64], "float32")
        y = paddle.static.data("y", [None, 1], "int64")
        h = paddle.static.nn.fc(x, data.w1.shape[1], activation="relu",
                                weight_attr=_param("w1", data.w1), bias_attr=_param("b1", data.b1))
        logits = paddle.static.nn.fc(h, 10, weight_attr=_param("w2", data.w2),
                                     bias_attr=_param("b2", data.b2))
        loss = paddle.mean(paddle.nn.functional.cross_entropy(logits, y))
        opt = paddle.optimizer.SGD(learning_rate=lr * k)
        if amp:
            opt = decorate(opt, policy=policy)
        opt.minimize(loss * (1.0 / k))
    place = paddle.CPUPlace()
    exe = paddle.static.Executor(place)
    losses, scales, times = [], [], []
    with paddle.static.scope_guard(scope):
        exe.run(startup)
        if amp:
            opt.amp_init(place, scope=scope)
        for idx in data.batches:
            scale = opt.loss_scale(scope).scale if amp else 1.0  # telemetry, not timed
            t0 = time.perf_counter()
            feed = {"x": data.x_train[idx], "y": data.y_train[idx].reshape(-1, 1)}
            (value,) = exe.run(main, feed=feed, fetch_list=[loss])
            if amp:
                opt.check_guard(scope)  # stop, naming the culprits, instead of skipping forever
            losses.append(float(np.asarray(value).reshape(())))
            scales.append(scale)
            times.append(time.perf_counter() - t0)
            yield losses[-1], scale
        weights = [np.array(scope.find_var(n).get_tensor()) for n in ("w1", "b1", "w2", "b2")]
        skipped = opt.loss_scale(scope).skipped_steps if amp else 0
    report = cast_report(main) if amp else None
    emulated = bool(report and any(d.emulated for d in report.decisions))
    fell_back = bool(report and any(d.lacks_kernel for d in report.decisions))
    casts = report.num_casts if amp else 0  # counted in the program, as the report does
    return TrainResult("paddle", mode_label(policy, emulated, fell_back), evaluate(data, *weights),
                       tuple(losses), tuple(scales), skipped, casts, float(np.median(times)))


def real_kernel(dtype: str) -> bool:
    """True if the MLP's GEMM (``fc`` lowers to matmul_v2, or mul) has a real ``dtype`` kernel
    on this CPU, forward and backward (the backend's answer, ``lowp_kernels``)."""
    from paddle_amp.kernels import lowp_kernels
    return bool({"matmul_v2", "mul"} & lowp_kernels("CPU", dtype))


# -- the speed table (amp_demo.speed) ------------------------------------------------------

def speed_row(policy: str, width: int, batch: int, layers: int, budget_s: float) -> dict:
    """The AMP step's time over float32's on the speed table's MLP (``amp_demo.speed``), two
    programs in their own scopes, run in turn."""
    paddle.enable_static()
    rng = np.random.default_rng(0)
    feed = {"x": rng.standard_normal((batch, width)).astype(np.float32),
            "y": rng.integers(0, 10, (batch, 1))}
    exe = paddle.static.Executor(paddle.CPUPlace())

    def program(amp_policy):
        main, startup, scope = (paddle.static.Program(), paddle.static.Program(),
                                paddle.static.Scope())
        with paddle.static.program_guard(main, startup), paddle.utils.unique_name.guard():
            x = paddle.static.data("x", [None, width], "float32")
            y = paddle.static.data("y", [None, 1], "int64")
            h = x
            for _ in range(layers):
                h = paddle.static.nn.fc(h, width, activation="relu")
            loss = paddle.mean(paddle.nn.functional.cross_entropy(paddle.static.nn.fc(h, 10), y))
            opt = paddle.optimizer.SGD(0.01)
            if amp_policy:
                opt = decorate(opt, policy=amp_policy)
            opt.minimize(loss)
        with paddle.static.scope_guard(scope):
            exe.run(startup)
            if amp_policy:
                opt.amp_init(paddle.CPUPlace(), scope=scope)

        def step():
            with paddle.static.scope_guard(scope):
                exe.run(main, feed=feed, fetch_list=[loss])
        return main, step

    _, fp32 = program(None)
    main, low = program(policy)
    ratio, spread = ratio_of(low, fp32, warmup=3, budget_s=budget_s)
    decisions = cast_report(main).decisions
    return {"ratio": ratio, "spread": spread, **gemm_summary(decisions, {"matmul_v2", "mul"})}


# -- amp-adapters max-batch (amp_demo.memory.batch_step) -----------------------------------

def batch_workload(spec, policy: Policy, batch: int) -> Callable[[], None]:
    """One training step (momentum SGD, random data) of the ``ModelSpec`` ``spec`` at
    ``batch`` as a static program in its own scope, under ``policy`` (O0: no ``decorate``)."""
    from .batch_models import CLASSES, LR, MOMENTUM
    paddle.enable_static()
    main, startup, scope = paddle.static.Program(), paddle.static.Program(), paddle.static.Scope()
    amp = policy.enabled
    with paddle.static.program_guard(main, startup), paddle.utils.unique_name.guard():
        h = paddle.static.data("x", [None, *spec.sample], "float32")
        y = paddle.static.data("y", [None, 1], "int64")
        channels = spec.sample[0]
        for width in spec.widths:
            if spec.kind == "mlp":
                h = paddle.static.nn.fc(h, width, activation="relu")
            else:
                h = paddle.nn.functional.relu(paddle.nn.Conv2D(channels, width, 3, padding=1)(h))
                channels = width
        if spec.kind == "cnn":
            h = paddle.mean(h, axis=[2, 3])
        logits = paddle.cast(paddle.static.nn.fc(h, CLASSES), "float32")
        loss = paddle.mean(paddle.nn.functional.cross_entropy(logits, y))
        opt = paddle.optimizer.Momentum(LR, MOMENTUM)
        if amp:
            opt = decorate(opt, policy=policy)
        opt.minimize(loss)
    exe = paddle.static.Executor(paddle.CPUPlace())
    with paddle.static.scope_guard(scope):
        exe.run(startup)
        if amp:
            opt.amp_init(paddle.CPUPlace(), scope=scope)
    rng = np.random.default_rng(0)
    feed = {"x": rng.random((batch, *spec.sample), np.float32),
            "y": rng.integers(0, CLASSES, (batch, 1))}

    def step() -> None:
        with paddle.static.scope_guard(scope):
            exe.run(main, feed=feed, fetch_list=[loss])
    return step


# -- the doctor's demo models (amp_demo.doctor_models: the planted problems) -------------------

from .doctor_models import B, D, FACTOR, arrays  # noqa: E402
from .doctor_models import policy as doctor_policy  # noqa: E402


def doctor_program(kind, policy=None, optimizer=None):
    """(main, startup, loss, decorated optimizer, executor) in the legacy program IR, with the
    planted weights; run ``startup`` is done and ``amp_init`` called."""
    paddle.enable_static()
    x0, _, params = arrays(kind)
    main, startup = paddle.static.Program(), paddle.static.Program()
    with paddle.static.program_guard(main, startup), paddle.utils.unique_name.guard():
        x = paddle.static.data("x", [B, D], "float32")
        label = paddle.static.data("label", [B, 1], "float32")
        p = {n: paddle.static.create_parameter(
                 v.shape, "float32", name=n,
                 default_initializer=paddle.nn.initializer.Assign(v)) for n, v in params.items()}
        if kind == "reduction":
            pred = x @ p["w"]
        else:
            pred = paddle.nn.functional.relu(x @ p["w1"]) @ p["w2"]
        d = pred - label
        loss = paddle.mean(d * d) * FACTOR[kind]
    return _minimized(main, startup, loss, optimizer, policy or doctor_policy(kind))


def _minimized(main, startup, loss, optimizer, policy):
    """(main, loss, the decorated optimizer, an executor): ``loss`` minimized under
    ``policy`` by ``optimizer`` (default SGD 1e-3), the startup run, ``amp_init`` called."""
    with paddle.static.program_guard(main, startup):
        opt = decorate(optimizer or paddle.optimizer.SGD(1e-3), policy=policy)
        opt.minimize(loss)
    exe = paddle.static.Executor(paddle.CPUPlace())
    exe.run(startup)
    opt.amp_init(paddle.CPUPlace())
    return main, loss, opt, exe


def layered_program(kind, policy=None, optimizer=None, layers=False):
    """(main, loss, decorated optimizer, executor) of a ``LAYERED`` doctor model: four
    ``paddle.static.nn.fc`` layers named ``dense0``..``dense3`` (parameters ``dense2.w_0``...,
    the names a layer rule matches in both IRs) and a layer norm after ``dense2``. With
    ``layers``: built as a user's model is, a ``paddle.nn.Sequential`` of four ``Linear`` and
    a ``LayerNorm`` after the third (paths ``0``, ``1``, ``2``, ``3`` the norm, ``4``), its
    parameters named by Paddle's counter (``linear_2.w_0``; others in each build)."""
    from .doctor_models import LAYERED_FACTOR, NORM_AFTER, layered_arrays
    paddle.enable_static()
    _, _, weights = layered_arrays(kind)
    main, startup = paddle.static.Program(), paddle.static.Program()
    names = contextlib.nullcontext() if layers else paddle.utils.unique_name.guard()
    with paddle.static.program_guard(main, startup), names:
        h = paddle.static.data("x", [B, D], "float32")
        label = paddle.static.data("label", [B, 1], "float32")
        if layers:
            blocks = []
            for i, (w, b) in enumerate(weights):
                blocks.append(paddle.nn.Linear(
                    w.shape[0], w.shape[1],
                    weight_attr=paddle.ParamAttr(initializer=paddle.nn.initializer.Assign(w)),
                    bias_attr=paddle.ParamAttr(initializer=paddle.nn.initializer.Assign(b))))
                if i == NORM_AFTER:
                    blocks.append(paddle.nn.LayerNorm(w.shape[1]))
            h = paddle.nn.Sequential(*blocks)(h)
        for i, (w, b) in enumerate(() if layers else weights):
            h = paddle.static.nn.fc(
                h, w.shape[1], name=f"dense{i}",
                weight_attr=paddle.ParamAttr(name=f"dense{i}.w_0",
                                             initializer=paddle.nn.initializer.Assign(w)),
                bias_attr=paddle.ParamAttr(name=f"dense{i}.b_0",
                                           initializer=paddle.nn.initializer.Assign(b)))
            if i == NORM_AFTER:
                h = paddle.nn.functional.layer_norm(h, [w.shape[1]])
        d = h - label
        loss = paddle.mean(d * d) * LAYERED_FACTOR[kind]
    return _minimized(main, startup, loss, optimizer, policy or doctor_policy(kind))


def layered_feed(kind, step):
    from .doctor_models import layered_arrays
    x, y, _ = layered_arrays(kind, step)
    return {"x": x, "label": y}


def doctor_feed(kind, step):
    x, y, _ = arrays(kind, step)
    return {"x": x, "label": y}


def run_doctor(kind, policy, steps):
    """(report, recommendation) of ``paddle_amp.doctor`` over ``steps`` steps of ``kind``."""
    from paddle_amp.doctor import doctor

    with paddle.static.scope_guard(paddle.static.Scope()):
        main, loss, opt, exe = doctor_program(kind, policy)
        with doctor(opt, exe) as dr:
            for s in range(steps):
                exe.run(main, feed=doctor_feed(kind, s), fetch_list=[loss])
    paddle.disable_static()
    return dr.report(), dr.recommendation()
