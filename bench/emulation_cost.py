"""Figure 5: what fp16 emulation costs, emulated-fp16 training step vs the fp32 step.

The 1.05M-parameter MLP (512-1024-512-10, batch 64, SGD momentum) in each
framework: a plain fp32 copy and an O1 copy with ``emulate=True`` (each GEMM's
inputs and outputs rounded through fp16, arithmetic in fp32; dynamic loss
scaling on), stepped interleaved. Target: at most 1.5x.
"""
from __future__ import annotations

import numpy as np

from amp_adapters import Policy
from bench.timing import interleaved, ratio

EMULATED = Policy.preset("O1", emulate=True)
rs = np.random.RandomState(0)
X = rs.uniform(size=(64, 512)).astype(np.float32)
Y = rs.randint(0, 10, 64)


def mxnet_row(steps: int) -> str:
    import mxnet as mx
    from mxnet import autograd, gluon

    import mxnet_amp

    def build():
        mx.random.seed(0)
        net = gluon.nn.HybridSequential()
        net.add(gluon.nn.Dense(1024, activation="relu", in_units=512),
                gluon.nn.Dense(512, activation="relu", in_units=1024),
                gluon.nn.Dense(10, in_units=512))
        net.initialize(mx.init.Xavier())
        net.hybridize(static_alloc=True, static_shape=True)
        return net, gluon.Trainer(net.collect_params(), "sgd",
                                  {"learning_rate": 0.01, "momentum": 0.9})

    x, y = mx.nd.array(X), mx.nd.array(Y)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()

    def stepper(net, trainer, amp):
        def step():
            with autograd.record():
                loss = loss_fn(net(x), y).mean()
                if amp:
                    with mxnet_amp.scale_loss(loss, trainer) as scaled:
                        autograd.backward(scaled)
            if not amp:
                loss.backward()
            trainer.step(1)
            mx.nd.waitall()  # the update too (asynchronous): else the next step timed pays it
        return step

    plain_net, plain_trainer = build()
    plain = stepper(plain_net, plain_trainer, False)
    plain()  # trace the fp32 graph before init patches the ops
    mxnet_amp.init(policy=EMULATED)
    try:
        net, trainer = build()
        mxnet_amp.init_trainer(trainer)
        stats = interleaved({"fp32": plain, "emulated": stepper(net, trainer, True)},
                            steps=steps)
    finally:
        mxnet_amp.reset()
    return f"| MXNet | {ratio(stats, 'emulated', 'fp32')} |"


def paddle_row(steps: int) -> str:
    import os

    os.environ.setdefault("FLAGS_enable_pir_api", "0")
    import paddle

    import paddle_amp

    paddle.enable_static()
    exe = paddle.static.Executor(paddle.CPUPlace())
    feed = {"x": X, "y": Y.reshape(-1, 1).astype(np.int64)}

    def build(policy):
        main, startup, scope = (paddle.static.Program(), paddle.static.Program(),
                                paddle.static.Scope())
        with paddle.static.program_guard(main, startup), paddle.utils.unique_name.guard():
            x = paddle.static.data("x", [64, 512], "float32")
            y = paddle.static.data("y", [64, 1], "int64")
            h = paddle.static.nn.fc(x, 1024, activation="relu")
            h = paddle.static.nn.fc(h, 512, activation="relu")
            loss = paddle.mean(paddle.nn.functional.cross_entropy(paddle.static.nn.fc(h, 10), y))
            opt = paddle.optimizer.Momentum(0.01, momentum=0.9)
            if policy is not None:
                opt = paddle_amp.decorate(opt, policy=policy)
            opt.minimize(loss)
        with paddle.static.scope_guard(scope):
            exe.run(startup)

        def step():
            with paddle.static.scope_guard(scope):
                exe.run(main, feed=feed, fetch_list=[loss])
        return step

    stats = interleaved({"fp32": build(None), "emulated": build(EMULATED)}, steps=steps)
    paddle.disable_static()
    return f"| Paddle | {ratio(stats, 'emulated', 'fp32')} |"


def mxnet_rounding_parts(steps: int) -> str:
    """Why MXNet's emulation costs what it does: one round trip through float16 of the
    512x1024 weight, against one fp32 multiply of it and the layer's forward GEMM."""
    import mxnet as mx

    w = mx.nd.array(rs.uniform(size=(1024, 512)).astype(np.float32))
    x = mx.nd.array(X)

    def timed(f):
        def call():
            f().wait_to_read()
        return call
    stats = interleaved({
        "gemm": timed(lambda: mx.nd.FullyConnected(x, w, num_hidden=1024, no_bias=True)),
        "multiply": timed(lambda: w * 1.0),
        "round_trip": timed(lambda: mx.nd.amp_cast(mx.nd.amp_cast(w, dtype="float16"),
                                                   dtype="float32")),
    }, steps=steps)
    return (f"MXNet, the 1024x512 weight: one float16 round trip (`amp_cast` there and back) "
            f"costs {ratio(stats, 'round_trip', 'multiply')} an fp32 multiply of the same "
            f"array and {ratio(stats, 'round_trip', 'gemm')} the layer's forward GEMM "
            "(batch 64). Emulation rounds every weight twice a step (forward, and its gradient "
            "on the way back), so the CPU `Cast` kernel, not the number of casts, sets the "
            "cost. A rounding built from fp32 ops that keeps fp16's overflow and subnormals "
            "(Veltkamp split, a subnormal quantizer, two selects) takes about ten "
            "elementwise passes: by the multiply figure at best a small saving, not tried.")


def run(steps: int = 150) -> str:
    return "\n".join([
        "## Figure 5: emulation cost (emulated-fp16 step vs fp32 step)", "",
        "MLP 512-1024-512-10, batch 64, SGD momentum, CPU. O1 with `emulate=True` and dynamic "
        "loss scaling vs the plain fp32 step. Target: at most 1.5x.", "",
        "| framework | emulated fp16 vs fp32 |", "| --- | --- |",
        mxnet_row(steps), paddle_row(steps), "", mxnet_rounding_parts(steps)])


if __name__ == "__main__":
    print(run())
