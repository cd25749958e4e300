"""The demo's Paddle dygraph trainer: the digits MLP as ``paddle.nn`` layers in eager mode, fp32
or under an AMP policy, through ``paddle_amp.dygraph`` (the ``paddle.amp`` drop-in), written
as a training engine writes it: ``decorate``, ``auto_cast``, ``GradScaler``."""
from __future__ import annotations

import time
from typing import Callable, Optional

import numpy as np
import paddle

from amp_adapters import Policy
from paddle_amp import dygraph as amp

from .data import DigitsData, evaluate
from .result import OnStep, Steps, TrainResult, mode_label, run_steps

FRAMEWORK = "paddle-dygraph"


def train_digits(policy: Policy, data: DigitsData, *, lr: float = 0.1, k: float = 1.0,
                 on_step: Optional[OnStep] = None) -> TrainResult:
    """Train Linear-ReLU-Linear on ``data`` in eager mode (``digits_steps``)."""
    return run_steps(digits_steps(policy, data, lr=lr, k=k), on_step)


def _linear(w: np.ndarray, b: np.ndarray) -> paddle.nn.Linear:
    """A Linear holding ``w`` (in, out: Paddle's layout, as the data's) and ``b``."""
    assign = paddle.nn.initializer.Assign
    return paddle.nn.Linear(*w.shape, weight_attr=paddle.ParamAttr(initializer=assign(w)),
                            bias_attr=paddle.ParamAttr(initializer=assign(b)))


def digits_steps(policy: Policy, data: DigitsData, *, lr: float = 0.1,
                 k: float = 1.0) -> Steps:
    """The steps of Linear-ReLU-Linear on ``data`` with SGD (loss / k, lr x k), in dynamic mode
    while they run.

    ``policy`` O0 is the plain fp32 loop (no ``paddle_amp.dygraph`` at all). Otherwise
    ``decorate(..., policy=)``, each forward under ``auto_cast(policy=)`` and a
    ``GradScaler(policy=)`` (its ``[loss_scale]``): the same policy as the other rows. One
    host sync per step (reading the loss). ``casts`` counts the casts the report of one
    forward plans (eager mode has no graph to count them in), each of emulation's round
    trips through the low dtype as two, as a program counts them."""
    was_static = not paddle.in_dynamic_mode()
    paddle.disable_static()
    try:
        return (yield from _steps(policy, data, lr, k))
    finally:
        if was_static:
            paddle.enable_static()


def _steps(policy: Policy, data: DigitsData, lr: float, k: float) -> Steps:
    model = paddle.nn.Sequential(_linear(data.w1, data.b1), paddle.nn.ReLU(),
                                 _linear(data.w2, data.b2))
    opt = paddle.optimizer.SGD(learning_rate=lr * k, parameters=model.parameters())
    on = policy.enabled
    if on:
        model, opt = amp.decorate(model, opt, level=policy.level, policy=policy)
        scaler = amp.GradScaler(policy=policy)
    x_all = paddle.to_tensor(data.x_train)
    y_all = paddle.to_tensor(data.y_train.reshape(-1, 1))
    losses, scales, times = [], [], []
    for idx in data.batches:
        scale = float(scaler.loss_scale()[1].scale) if on else 1.0  # telemetry, not timed
        t0 = time.perf_counter()
        rows = paddle.to_tensor(idx)
        x, y = paddle.gather(x_all, rows), paddle.gather(y_all, rows)
        if on:
            with amp.auto_cast(policy=policy):
                logits = model(x)
            loss = paddle.nn.functional.cross_entropy(logits.astype("float32"), y).mean() / k
            scaled = scaler.scale(loss)
            scaled.backward()
            scaler.minimize(opt, scaled)
        else:
            loss = paddle.nn.functional.cross_entropy(model(x), y).mean() / k
            loss.backward()
            opt.step()
        opt.clear_grad()
        losses.append(float(loss.item()) * k)  # the host sync of the step
        scales.append(scale)
        times.append(time.perf_counter() - t0)
        yield losses[-1], scale
    report = amp.cast_report(model, x_all[:2], policy=policy) if on else None
    skipped = scaler.loss_scale()[1].skipped_steps if on else 0
    weights = [p.numpy() for p in model.parameters()]  # w1, b1, w2, b2
    emulated = bool(report and any(d.emulated for d in report.decisions))
    fell_back = bool(report and any(d.lacks_kernel for d in report.decisions))
    return TrainResult(FRAMEWORK, mode_label(policy, emulated, fell_back),
                       evaluate(data, *weights), tuple(losses), tuple(scales), skipped,
                       _casts(report) if on else 0, float(np.median(times)))


def _casts(report) -> int:
    """The casts of one forward: planned casts, and two per value rounded (emulation)."""
    return sum(d.num_casts + 2 * (sum(d.round_inputs) + bool(d.round_outputs))
               for d in report.decisions)


def real_kernel(dtype: str) -> bool:
    """True if the MLP's GEMM (``linear``, ``matmul``) runs on a real ``dtype`` kernel here in
    eager mode, forward and backward (the backend's answer, ``kernels.lowp_kernels``)."""
    from paddle_amp.dygraph.kernels import lowp_kernels
    return "matmul_v2" in lowp_kernels(dtype)


# -- amp-adapters max-batch (amp_demo.memory.batch_step) -----------------------------------

class _ImageMean(paddle.nn.Layer):
    """(batch, channels, height, width) -> (batch, channels): the mean over the image."""

    def forward(self, h):
        return h.mean(axis=[2, 3])


def batch_workload(spec, policy: Policy, batch: int) -> Callable[[], None]:
    """One training step (momentum SGD, random data) of the ``ModelSpec`` ``spec`` at
    ``batch`` as eager ``paddle.nn`` layers under ``policy`` (O0: no ``paddle_amp.dygraph``),
    as ``digits_steps`` runs it."""
    from .batch_models import CLASSES, LR, MOMENTUM
    paddle.disable_static()
    nn = paddle.nn
    layers, width_in = [], spec.sample[0]
    for width in spec.widths:
        layers += [nn.Linear(width_in, width) if spec.kind == "mlp" else
                   nn.Conv2D(width_in, width, 3, padding=1), nn.ReLU()]
        width_in = width
    if spec.kind == "cnn":  # the mean over the image, as the static program takes it
        layers.append(_ImageMean())
    model = nn.Sequential(*layers, nn.Linear(width_in, CLASSES))
    opt = paddle.optimizer.Momentum(LR, MOMENTUM, parameters=model.parameters())
    on = policy.enabled
    if on:
        model, opt = amp.decorate(model, opt, level=policy.level, policy=policy)
        scaler = amp.GradScaler(policy=policy)
    x = paddle.rand([batch, *spec.sample])
    y = paddle.randint(0, CLASSES, [batch, 1])

    def step() -> None:
        if on:
            with amp.auto_cast(policy=policy):
                logits = model(x)
            loss = paddle.nn.functional.cross_entropy(logits.astype("float32"), y).mean()
            scaled = scaler.scale(loss)
            scaled.backward()
            scaler.minimize(opt, scaled)
        else:
            loss = paddle.nn.functional.cross_entropy(model(x), y).mean()
            loss.backward()
            opt.step()
        opt.clear_grad()
        loss.item()  # the step is done when its loss is read
    return step


# -- the doctor's demo models (amp_demo.doctor_models: the planted problems) -------------------

class _PlantedLoss(paddle.nn.Layer):
    """The planted models' loss, a Layer (the doctor watches its calls): the mean squared
    error times the kind's factor (``doctor_models.FACTOR``)."""

    def __init__(self, factor: float) -> None:
        super().__init__()
        self.factor = factor

    def forward(self, pred, label):
        d = pred - label
        return paddle.mean(d * d) * self.factor


def doctor_model(kind: str):
    """(model, loss_fn) of the planted ``kind`` in eager mode, as a user writes it: Linear
    layers without bias holding the planted weights, ``relu(x @ w1) @ w2`` as
    ``Sequential(Linear(w1), ReLU(), Linear(w2))`` (paths ``0`` and ``2``), ``x @ w`` as one
    Linear (``0``)."""
    from .doctor_models import FACTOR, arrays
    paddle.disable_static()
    _, _, params = arrays(kind)
    assign = paddle.nn.initializer.Assign
    linears = [paddle.nn.Linear(*w.shape, weight_attr=paddle.ParamAttr(initializer=assign(w)),
                                bias_attr=False) for w in params.values()]
    layers = linears if len(linears) == 1 else [linears[0], paddle.nn.ReLU(), linears[1]]
    return paddle.nn.Sequential(*layers), _PlantedLoss(FACTOR[kind])


def engine_steps(model, loss_fn, opt, scaler, policy: Policy, batches) -> None:
    """A user's eager loop over ``batches`` ((x, y) arrays): the forward in an ``auto_cast``
    region under ``policy``, the scaled loss's backward, ``scaler.minimize``."""
    for x, y in batches:
        with amp.auto_cast(policy=policy):
            loss = loss_fn(model(paddle.to_tensor(x)), paddle.to_tensor(y))
        scaled = scaler.scale(loss)
        scaled.backward()
        scaler.minimize(opt, scaled)
        opt.clear_grad()


def run_doctor(kind: str, policy: Policy, steps: int):
    """(report, recommendation) of ``paddle_amp.dygraph.doctor`` over ``steps`` steps of the
    planted ``kind``, trained as an engine trains (SGD, ``auto_cast``, ``GradScaler``)."""
    from .doctor_models import arrays
    was_static = not paddle.in_dynamic_mode()
    model, loss_fn = doctor_model(kind)
    opt = paddle.optimizer.SGD(1e-3, parameters=model.parameters())
    scaler = amp.GradScaler(policy=policy)
    try:
        with amp.doctor(model, loss_fn, opt, policy=policy, scaler=scaler) as dr:
            engine_steps(model, loss_fn, opt, scaler, policy,
                         (arrays(kind, s)[:2] for s in range(steps)))
            return dr.report(), dr.recommendation()
    finally:
        if was_static:
            paddle.enable_static()
