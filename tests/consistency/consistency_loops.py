"""The same small training loop in Gluon and in a Paddle program, with overflow injection.

Each loop trains the MLP D-relu-D-V on a fixed batch; ``poison[i]`` multiplies
step ``i``'s loss by inf, so its gradients overflow exactly there. After each
step the loop records the loss-scale state and a snapshot of every parameter
and optimizer state (numpy copies).
"""
import numpy as np
import paddle
from mxnet import autograd, gluon
import mxnet as mx

import mxnet_amp
import paddle_amp

B, D, V = 8, 16, 10
RNG = np.random.default_rng(0)
X = RNG.standard_normal((B, D)).astype(np.float32)
Y = RNG.integers(0, V, B)
W1, W2 = (RNG.standard_normal((D, D)) * 0.3).astype(np.float32), \
    (RNG.standard_normal((D, V)) * 0.3).astype(np.float32)

OPTIMIZERS = {  # name -> (mxnet optimizer, args), (paddle optimizer factory)
    "momentum": (("sgd", {"learning_rate": 0.1, "momentum": 0.9}),
                 lambda: paddle.optimizer.Momentum(0.1, momentum=0.9)),
    "adam": (("adam", {"learning_rate": 0.01}), lambda: paddle.optimizer.Adam(0.01)),
}


def run_mxnet(policy, optimizer, poison):
    """[(loss-scale state, snapshot)] after each step of a Gluon loop under ``policy``."""
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Dense(D, activation="relu", in_units=D), gluon.nn.Dense(V, in_units=D))
    net.initialize()
    net[0].weight.set_data(mx.nd.array(W1.T))
    net[1].weight.set_data(mx.nd.array(W2.T))
    mxnet_amp.init(policy=policy)
    try:
        net.hybridize()
        name, args = OPTIMIZERS[optimizer][0]
        trainer = gluon.Trainer(net.collect_params(), name, dict(args))
        mxnet_amp.init_trainer(trainer)
        x, y = mx.nd.array(X), mx.nd.array(Y)
        loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
        out = []
        for p in poison:
            with autograd.record():
                loss = loss_fn(net(x), y).mean() * (np.inf if p else 1.0)
                with mxnet_amp.scale_loss(loss, trainer) as scaled:
                    autograd.backward(scaled)
            trainer.step(1)
            out.append((mxnet_amp.loss_scale(trainer), _mx_snapshot(net, trainer)))
        return out
    finally:
        mxnet_amp.reset()


def _mx_snapshot(net, trainer):
    snap = {name: p.data().asnumpy() for name, p in net.collect_params().items()}
    for i, state in trainer._updaters[0].states.items():
        for j, s in enumerate(state if isinstance(state, (tuple, list)) else [state]):
            if s is not None:
                snap[f"state{i}.{j}"] = s.asnumpy()
    opt = trainer._optimizer
    snap["update_counts"] = np.array(sorted(opt._index_update_count.items()), dtype=np.int64)
    snap["num_update"] = np.array(opt.num_update)
    return snap


def run_paddle(policy, optimizer, poison):
    """[(loss-scale state, snapshot)] after each step of a decorated static program."""
    paddle.enable_static()
    main, startup, scope = paddle.static.Program(), paddle.static.Program(), paddle.static.Scope()
    with paddle.static.program_guard(main, startup), paddle.utils.unique_name.guard():
        x = paddle.static.data("x", [B, D], "float32")
        y = paddle.static.data("y", [B, 1], "int64")
        factor = paddle.static.data("factor", [1], "float32")
        init = paddle.nn.initializer.Assign
        h = paddle.static.nn.fc(x, D, activation="relu", weight_attr=paddle.ParamAttr(
            initializer=init(W1)))
        logits = paddle.static.nn.fc(h, V, weight_attr=paddle.ParamAttr(initializer=init(W2)))
        loss = paddle.mean(paddle.nn.functional.cross_entropy(logits, y)) * factor
        opt = paddle_amp.decorate(OPTIMIZERS[optimizer][1](), policy=policy)
        opt.minimize(loss)
    exe = paddle.static.Executor(paddle.CPUPlace())
    state_vars = [v.name for v in main.list_vars()
                  if v.persistable and not v.name.startswith(("loss_scaling", "amp_"))
                  and v.name not in ("feed", "fetch")]
    out = []
    with paddle.static.scope_guard(scope):
        exe.run(startup)
        opt.amp_init(paddle.CPUPlace(), scope=scope)
        for p in poison:
            feed = {"x": X, "y": Y.reshape(-1, 1),
                    "factor": np.array([np.inf if p else 1.0], np.float32)}
            exe.run(main, feed=feed)
            snap = {n: np.array(scope.find_var(n).get_tensor()) for n in state_vars}
            out.append((opt.loss_scale(scope), snap))
    return out


def run_core(policy, poison):
    state, out = policy.loss_scale, []
    for p in poison:
        state = state.adjust(bool(p))
        out.append(state)
    return out
