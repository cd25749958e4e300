"""The demo's Gluon trainer: the digits MLP, fp32 or under an AMP policy, through ``mxnet_amp``."""
from __future__ import annotations

import time
from typing import Callable, Optional

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon

from amp_adapters import Policy
from amp_adapters.services.timing import ratio_of
from mxnet_amp import cast_report, init, init_trainer, loss_scale, reset, scale_loss

from .data import DigitsData, evaluate
from .result import OnStep, Steps, TrainResult, gemm_summary, mode_label, run_steps


def train_digits(policy: Policy, data: DigitsData, *, lr: float = 0.1, k: float = 1.0,
                 on_step: Optional[OnStep] = None) -> TrainResult:
    """Train a hybridized Dense-ReLU-Dense on ``data`` (``digits_steps``)."""
    return run_steps(digits_steps(policy, data, lr=lr, k=k), on_step)


def digits_steps(policy: Policy, data: DigitsData, *, lr: float = 0.1,
                 k: float = 1.0) -> Steps:
    """The steps of a hybridized Dense-ReLU-Dense on ``data`` with SGD (loss / k, lr x k).

    ``policy`` O0 is the plain fp32 baseline (no ``init`` at all); otherwise
    ``init(policy=...)`` is active for this run only. One host sync per step
    (reading the loss). ``casts`` counts the cast nodes in the traced forward graph,
    emulation's round trips included.
    """
    ctx = mx.cpu()
    hidden = data.w1.shape[1]
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Dense(hidden, activation="relu", in_units=64),
            gluon.nn.Dense(10, in_units=hidden))
    net.initialize(ctx=ctx)
    for layer, w, b in ((net[0], data.w1, data.b1), (net[1], data.w2, data.b2)):
        layer.weight.set_data(mx.nd.array(w.T, ctx=ctx))  # Dense stores (out, in)
        layer.bias.set_data(mx.nd.array(b, ctx=ctx))
    amp = policy.enabled
    if amp:
        init(policy=policy)
    try:
        net.hybridize(static_alloc=True, static_shape=True)
        trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": lr * k})
        if amp:
            init_trainer(trainer)
        loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
        x_all = mx.nd.array(data.x_train, ctx=ctx)
        y_all = mx.nd.array(data.y_train, ctx=ctx)
        losses, scales, times = [], [], []
        for idx in data.batches:
            scale = loss_scale(trainer).scale if amp else 1.0  # telemetry, not timed
            t0 = time.perf_counter()
            rows = mx.nd.array(idx, ctx=ctx)
            x, y = mx.nd.take(x_all, rows), mx.nd.take(y_all, rows)
            loss = _train_step(net, loss_fn, trainer, amp, x, y, k)
            losses.append(float(loss.asscalar()) * k)  # the host sync of the step
            scales.append(scale)
            times.append(time.perf_counter() - t0)
            yield losses[-1], scale
        report = cast_report(net) if amp else None
        casts = report.num_casts if amp else 0  # counted in the traced graph, as the report
        skipped = loss_scale(trainer).skipped_steps if amp else 0
    finally:
        if amp:
            reset()
    weights = [p.data().asnumpy() for p in (net[0].weight, net[0].bias, net[1].weight,
                                            net[1].bias)]
    accuracy = evaluate(data, weights[0].T, weights[1], weights[2].T, weights[3])
    emulated = bool(report and any(d.emulated for d in report.decisions))
    fell_back = bool(report and any(d.lacks_kernel for d in report.decisions))
    return TrainResult("mxnet", mode_label(policy, emulated, fell_back), accuracy, tuple(losses),
                       tuple(scales), skipped, casts, float(np.median(times)))


def _train_step(net, loss_fn, trainer, amp: bool, x, y, k: float = 1.0):
    """One step: the loss (divided by ``k``) recorded, its backward (through ``scale_loss``
    where ``amp``), the update; the loss, not waited for."""
    with autograd.record():
        loss = loss_fn(net(x), y).mean() / k
        if amp:
            with scale_loss(loss, trainer) as scaled:
                autograd.backward(scaled)
    if not amp:
        loss.backward()
    trainer.step(1)
    return loss


def wait_all() -> None:
    """Wait for every operation MXNet has queued (a step's update runs after its loss)."""
    mx.nd.waitall()


def real_kernel(dtype: str) -> bool:
    """True if the MLP's GEMM (FullyConnected) has a real ``dtype`` kernel on this CPU, forward
    and backward (the backend's probe)."""
    from mxnet_amp.kernels import has_kernel
    return has_kernel("FullyConnected", mx.cpu(), dtype, backward=True)


# -- the speed table (amp_demo.speed) ------------------------------------------------------

def speed_row(policy: str, width: int, batch: int, layers: int, budget_s: float) -> dict:
    """The AMP step's time over float32's on the speed table's MLP (``amp_demo.speed``): the
    float32 net is traced before ``init`` patches MXNet, so it stays float32."""
    x = mx.nd.random.uniform(shape=(batch, width))
    y = mx.nd.array(np.random.default_rng(0).integers(0, 10, batch))
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()

    def net_and_trainer():
        net = gluon.nn.HybridSequential()
        for _ in range(layers):
            net.add(gluon.nn.Dense(width, activation="relu"))
        net.add(gluon.nn.Dense(10))
        net.initialize(mx.init.Xavier())
        net.hybridize(static_alloc=True, static_shape=True)
        return net, gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.01})

    def step(net, trainer, scaled):
        _train_step(net, loss_fn, trainer, scaled, x, y)
        mx.nd.waitall()  # the update too: MXNet runs it asynchronously, and a step that only
        # waited for its loss would hand its backward and update to the next step timed

    fp32 = net_and_trainer()
    step(*fp32, False)  # traced and cached in float32 before init patches MXNet
    init(policy=policy)
    low = net_and_trainer()
    init_trainer(low[1])
    ratio, spread = ratio_of(lambda: step(*low, True), lambda: step(*fp32, False),
                             warmup=3, budget_s=budget_s)
    decisions = cast_report(low[0]).decisions
    return {"ratio": ratio, "spread": spread, **gemm_summary(decisions, {"FullyConnected"})}


# -- the doctor's demo models (amp_demo.doctor_models: the planted problems) -------------------

from .doctor_models import FACTOR, LAYERED_FACTOR, NORM_AFTER, arrays, layered_arrays  # noqa: E402,E501


def layered_model(kind, hybridize=True, named=True):
    """(net, loss_fn) of a ``LAYERED`` doctor model: a HybridSequential of four Dense blocks,
    the LayerNorm after the third (paths ``0``, ``1``, ``2``, ``3`` the norm, ``4``), with the
    planted weights. ``named``: the blocks are named ``dense0``..``dense3`` and ``norm``;
    else Gluon names them from its process-wide counter, as a user's model is (another
    name in each build: ``hybridsequential1_dense2`` the second time)."""
    _, _, layers = layered_arrays(kind)
    net = gluon.nn.HybridSequential(**({"prefix": ""} if named else {}))
    with net.name_scope():
        for i, (w, b) in enumerate(layers):
            net.add(gluon.nn.Dense(w.shape[1], in_units=w.shape[0],
                                   **({"prefix": f"dense{i}_"} if named else {})))
            if i == NORM_AFTER:
                net.add(gluon.nn.LayerNorm(in_channels=w.shape[1],
                                           **({"prefix": "norm_"} if named else {})))
    net.initialize()
    for i, (w, b) in enumerate(layers):
        dense = net[i + (i > NORM_AFTER)]
        dense.weight.set_data(mx.nd.array(w.T))
        dense.bias.set_data(mx.nd.array(b))

    class Loss(gluon.HybridBlock):
        def hybrid_forward(self, F, pred, label):
            d = pred - label
            return F.mean(d * d) * LAYERED_FACTOR[kind]

    loss_fn = Loss(**({"prefix": "loss_"} if named else {}))
    if hybridize:
        net.hybridize()
        loss_fn.hybridize()
    return net, loss_fn


def doctor_model(kind, hybridize=True):
    """(net, loss_fn) as Gluon blocks with the planted weights."""
    _, _, params = arrays(kind)

    class Net(gluon.HybridBlock):
        def __init__(self):
            super().__init__(prefix="planted_")
            with self.name_scope():
                for name, value in params.items():
                    setattr(self, name, self.params.get(name, shape=value.shape))

        def hybrid_forward(self, F, x, **p):
            if kind == "reduction":
                return F.dot(x, p["w"])
            return F.dot(F.relu(F.dot(x, p["w1"])), p["w2"])

    class Loss(gluon.HybridBlock):
        def hybrid_forward(self, F, pred, label):
            d = pred - label
            return F.mean(d * d) * FACTOR[kind]

    net, loss_fn = Net(), Loss()
    net.initialize()
    for name, value in params.items():
        getattr(net, name).set_data(mx.nd.array(value))
    if hybridize:
        net.hybridize()
        loss_fn.hybridize()
    return net, loss_fn


def run_doctor(kind, policy, steps):
    """(report, recommendation) of ``mxnet_amp.doctor`` over ``steps`` steps of ``kind``."""
    import mxnet_amp

    init(policy=policy)
    try:
        net, loss_fn = doctor_model(kind)
        trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 1e-3})
        init_trainer(trainer)
        with mxnet_amp.doctor(net, loss_fn, trainer) as dr:
            for s in range(steps):
                x, y, _ = arrays(kind, s)
                with autograd.record():
                    loss = loss_fn(net(mx.nd.array(x)), mx.nd.array(y))
                    with scale_loss(loss, trainer) as scaled:
                        autograd.backward(scaled)
                trainer.step(1)
        return dr.report(), dr.recommendation()
    finally:
        reset()


# -- amp-adapters max-batch (amp_demo.memory.batch_step) -----------------------------------

def batch_workload(spec, policy: Policy, batch: int) -> Callable[[], None]:
    """One training step (momentum SGD, random data, complete when it returns) of the
    ``ModelSpec`` ``spec`` at ``batch`` as a hybridized Gluon net under ``policy`` (O0: plain
    float32, no ``init``); this process is the measuring one: ``init`` is not undone."""
    from .batch_models import CLASSES, LR, MOMENTUM
    amp = policy.enabled
    if amp:
        init(policy=policy)
    net = gluon.nn.HybridSequential()
    for width in spec.widths:
        net.add(gluon.nn.Dense(width, activation="relu") if spec.kind == "mlp" else
                gluon.nn.Conv2D(width, 3, padding=1, activation="relu"))
    if spec.kind == "cnn":
        net.add(gluon.nn.GlobalAvgPool2D())
    net.add(gluon.nn.Dense(CLASSES))
    net.initialize(mx.init.Xavier())
    net.hybridize(static_alloc=True, static_shape=True)
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": LR,
                                                         "momentum": MOMENTUM})
    if amp:
        init_trainer(trainer)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    x = mx.nd.random.uniform(shape=(batch, *spec.sample))
    y = mx.nd.array(np.random.default_rng(0).integers(0, CLASSES, batch))

    def step() -> None:
        _train_step(net, loss_fn, trainer, amp, x, y)
        mx.nd.waitall()
    return step
