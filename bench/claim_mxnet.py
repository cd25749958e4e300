"""The four claim families in Gluon, trained fp32 or under one AMP policy (O1 or O2)."""
from __future__ import annotations

import math

import mxnet as mx
from mxnet import autograd, gluon

import mxnet_amp as amp
from amp_adapters import Policy

from .claim_data import LR, MOMENTUM, ClaimData, Outcome, test_metrics

D = 16  # transformer width


class _CNN(gluon.HybridBlock):
    def __init__(self):
        super().__init__()
        with self.name_scope():
            self.conv = gluon.nn.Conv2D(8, 3, padding=1, in_channels=1, activation="relu")
            self.pool = gluon.nn.MaxPool2D(2)
            self.out = gluon.nn.Dense(10, in_units=8 * 4 * 4)

    def hybrid_forward(self, F, x):
        return self.out(F.flatten(self.pool(self.conv(x))))


class _LSTM(gluon.HybridBlock):
    def __init__(self):
        super().__init__()
        with self.name_scope():
            self.lstm = gluon.rnn.LSTM(32, input_size=8, layout="NTC")
            self.out = gluon.nn.Dense(10, in_units=32)

    def hybrid_forward(self, F, x):
        h = self.lstm(x)
        return self.out(F.squeeze(F.slice_axis(h, axis=1, begin=7, end=8), axis=1))


class _Transformer(gluon.HybridBlock):
    """Embed, one single-head self-attention block with post-norm, mean-pool, classify."""

    def __init__(self):
        super().__init__()
        with self.name_scope():
            self.embed = gluon.nn.Dense(D, flatten=False, in_units=16)  # pixels + position
            self.q, self.k, self.v, self.o = (gluon.nn.Dense(D, flatten=False, in_units=D)
                                              for _ in range(4))
            self.ff1 = gluon.nn.Dense(2 * D, flatten=False, in_units=D)
            self.ff2 = gluon.nn.Dense(D, flatten=False, in_units=2 * D)
            self.ln1 = gluon.nn.LayerNorm(in_channels=D)
            self.ln2 = gluon.nn.LayerNorm(in_channels=D)
            self.out = gluon.nn.Dense(10, in_units=D)

    def hybrid_forward(self, F, x):
        x = self.embed(x)
        att = F.batch_dot(self.q(x), self.k(x), transpose_b=True) * (1 / math.sqrt(D))
        x = self.ln1(x + self.o(F.batch_dot(F.softmax(att, axis=-1), self.v(x))))
        x = self.ln2(x + self.ff2(F.LeakyReLU(self.ff1(x), act_type="gelu")))
        return self.out(F.mean(x, axis=1))


def _net(family: str) -> gluon.HybridBlock:
    if family == "mlp":
        net = gluon.nn.HybridSequential()
        net.add(gluon.nn.Dense(64, activation="relu", in_units=64), gluon.nn.Dense(10, in_units=64))
        return net
    return {"cnn": _CNN, "lstm": _LSTM, "transformer": _Transformer}[family]()


def train(family: str, policy: Policy, data: ClaimData, k: float = 1.0) -> Outcome:
    """Train ``family`` with SGD+momentum on ``data`` (loss / k, lr x k) under ``policy``."""
    mx.random.seed(0)
    ctx = mx.cpu()
    net = _net(family)
    net.initialize(mx.init.Xavier(), ctx=ctx)
    on = policy.enabled
    if on:
        amp.init(policy=policy)
    try:
        if on and policy.level == "O2":
            amp.cast_params(net)
        net.hybridize(static_alloc=True, static_shape=True)
        trainer = gluon.Trainer(net.collect_params(), "sgd",
                                {"learning_rate": LR * k, "momentum": MOMENTUM})
        if on:
            amp.init_trainer(trainer)
        loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
        x_all = mx.nd.array(data.shaped(family, data.x_train), ctx=ctx)
        y_all = mx.nd.array(data.y_train, ctx=ctx)
        for idx in data.batches:
            rows = mx.nd.array(idx, ctx=ctx)
            x, y = mx.nd.take(x_all, rows), mx.nd.take(y_all, rows)
            with autograd.record():
                loss = loss_fn(net(x), y).mean() / k
                if on:
                    with amp.scale_loss(loss, trainer) as scaled:
                        autograd.backward(scaled)
            if not on:
                loss.backward()
            trainer.step(1)
        logits = net(mx.nd.array(data.shaped(family, data.x_test), ctx=ctx))
        logits = mx.nd.amp_cast(logits, dtype="float32").asnumpy()
        state = amp.loss_scale(trainer) if on else None
    finally:
        if on:
            amp.reset()
    acc, test_loss = test_metrics(logits, data.y_test)
    return Outcome(acc, test_loss, state.skipped_steps if state else 0,
                   state.scale if state else 1.0)
