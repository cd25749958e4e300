"""Models with a planted numerics problem, the same in MXNet and Paddle (weights and data are
numpy, so both frameworks see the same values). Loaded by path (see tests/native_surface.py).

- ``overflow``: ``relu(x @ w1) @ w2`` with ``|x @ w1|`` ~ 1e5 > float16's 65504: the first
  matmul's output overflows in fp16.
- ``underflow``: the same net at normal scale, its loss multiplied by 1e-11: the gradients
  flush to zero in fp16 at the default loss scale 2**16.
- ``reduction``: ``x @ w`` with ``w`` a column of ones, a sum over values that cancel
  (1000.1 - 1000.0 ...): the fp16 rounding of its inputs wipes the result out.
"""
import numpy as np

from amp_adapters import Policy

B, D, H = 4, 16, 8
KINDS = ("overflow", "underflow", "reduction")
FACTOR = {"overflow": 1.0, "underflow": 1e-11, "reduction": 1e-4}
PLANTED_CANONICAL = {"overflow": "matmul", "reduction": "matmul"}


def policy(kind):
    """The policy the planted model runs under (fp16 emulated on a CPU)."""
    return Policy.preset("O1", emulate=True)


def arrays(kind, step=0):
    """(inputs, label, {param: value}) for ``kind``, one batch per ``step``."""
    rng = np.random.RandomState(step)
    if kind == "reduction":
        x = np.tile(np.array([1000.1, -1000.0], np.float32), (B, D // 2))
        x = (x + rng.uniform(-0.01, 0.01, x.shape)).astype(np.float32)
        w = np.ones((D, 1), np.float32)
        label = (x.astype(np.float64).sum(axis=1, keepdims=True)).astype(np.float32)
        return x, label, {"w": w}
    p = np.random.RandomState(42)
    x = rng.uniform(1.0, 2.0, (B, D)).astype(np.float32)
    if kind == "overflow":
        w1 = p.uniform(4000.0, 5000.0, (D, H)).astype(np.float32)
        w2 = p.uniform(-1e-5, 1e-5, (H, 1)).astype(np.float32)
    else:
        w1 = p.uniform(-0.5, 0.5, (D, H)).astype(np.float32)
        w2 = p.uniform(-0.5, 0.5, (H, 1)).astype(np.float32)
    return x, np.zeros((B, 1), np.float32), {"w1": w1, "w2": w2}


def mxnet_model(kind, hybridize=True):
    """(net, loss_fn) as Gluon blocks with the planted weights."""
    import mxnet as mx
    from mxnet import gluon

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


def paddle_model(kind, policy=None, optimizer=None):
    """(main, startup, loss, decorated optimizer, executor) in the legacy program IR, with the
    planted weights; run ``startup`` is done and ``amp_init`` called."""
    import paddle
    import paddle_amp

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
        opt = paddle_amp.decorate(optimizer or paddle.optimizer.SGD(1e-3),
                                  policy=policy or globals()["policy"](kind))
        opt.minimize(loss)
    exe = paddle.static.Executor(paddle.CPUPlace())
    exe.run(startup)
    opt.amp_init(paddle.CPUPlace())
    return main, loss, opt, exe


def paddle_feed(kind, step):
    x, y, _ = arrays(kind, step)
    return {"x": x, "label": y}
