"""The reference models, defined once per framework with identical shapes.

MLP, a small CNN (conv, batch norm, pooling), a transformer encoder block
(matmul, softmax, layer norm, gelu, residual adds) and an LSTM language-model
step. ``mxnet_report`` traces the Gluon block in plain fp32 and plans it under
a policy; ``paddle_report`` builds the static program, decorates its
optimizer with the policy and returns what the rewrite applied; ``dygraph_report``
builds the same model as eager-mode Layers and returns what ``paddle_amp.dygraph``
decides for its forward.
"""
import math

import mxnet as mx
import numpy as np
import paddle
from mxnet import gluon

import mxnet_amp
import paddle_amp

B, T, D, V, C, HW = 2, 4, 8, 16, 4, 8  # batch, sequence, width, vocabulary, channels, image side
MODELS = ("mlp", "cnn", "transformer", "lstm")


class _Transformer(gluon.HybridBlock):
    def __init__(self):
        super().__init__()
        with self.name_scope():
            self.q, self.k, self.v, self.o = (gluon.nn.Dense(D, flatten=False, in_units=D)
                                              for _ in range(4))
            self.ff1 = gluon.nn.Dense(4 * D, flatten=False, in_units=D)
            self.ff2 = gluon.nn.Dense(D, flatten=False, in_units=4 * D)
            self.ln1, self.ln2 = gluon.nn.LayerNorm(in_channels=D), gluon.nn.LayerNorm(in_channels=D)

    def hybrid_forward(self, F, x):
        att = F.batch_dot(self.q(x), self.k(x), transpose_b=True) * (1 / math.sqrt(D))
        x = self.ln1(x + self.o(F.batch_dot(F.softmax(att, axis=-1), self.v(x))))
        return self.ln2(x + self.ff2(F.LeakyReLU(self.ff1(x), act_type="gelu")))


class _LSTMStep(gluon.HybridBlock):
    def __init__(self):
        super().__init__()
        with self.name_scope():
            self.embed = gluon.nn.Embedding(V, D)
            self.lstm = gluon.rnn.LSTM(D, input_size=D, layout="NTC")
            self.out = gluon.nn.Dense(V, flatten=False, in_units=D)

    def hybrid_forward(self, F, tokens):
        return self.out(self.lstm(self.embed(tokens)))


def mxnet_block(name):
    """(hybridized block, example input) for a reference model, in fp32."""
    if name == "mlp":
        net = gluon.nn.HybridSequential()
        net.add(gluon.nn.Dense(D, activation="relu", in_units=D), gluon.nn.Dense(V, in_units=D))
        x = mx.nd.ones((B, D))
    elif name == "cnn":
        net = gluon.nn.HybridSequential()
        net.add(gluon.nn.Conv2D(C, 3, padding=1, in_channels=1), gluon.nn.BatchNorm(in_channels=C),
                gluon.nn.Activation("relu"), gluon.nn.MaxPool2D(2), gluon.nn.Flatten(),
                gluon.nn.Dense(V, in_units=C * (HW // 2) ** 2))
        x = mx.nd.ones((B, 1, HW, HW))
    elif name == "transformer":
        net, x = _Transformer(), mx.nd.ones((B, T, D))
    else:
        net, x = _LSTMStep(), mx.nd.array(np.arange(B * T).reshape(B, T) % V)
    net.initialize()
    net.hybridize()
    net(x)  # trace the plain fp32 graph
    return net, x


def mxnet_report(name, policy):
    net, _ = mxnet_block(name)
    return mxnet_amp.cast_report(net, policy=policy)


def paddle_forward(name):
    """The reference model's output in the current static program."""
    F = paddle.nn.functional
    fc = paddle.static.nn.fc
    if name == "mlp":
        x = paddle.static.data("x", [B, D], "float32")
        return fc(fc(x, D, activation="relu"), V)
    if name == "cnn":
        x = paddle.static.data("x", [B, 1, HW, HW], "float32")
        h = paddle.static.nn.batch_norm(paddle.static.nn.conv2d(x, C, 3, padding=1))
        h = paddle.flatten(F.max_pool2d(F.relu(h), 2), 1)
        return fc(h, V)
    if name == "transformer":
        x = paddle.static.data("x", [B, T, D], "float32")
        q, k, v = (fc(x, D, num_flatten_dims=2) for _ in range(3))
        att = F.softmax(paddle.matmul(q, k, transpose_y=True) * (1 / math.sqrt(D)), axis=-1)
        x = paddle.static.nn.layer_norm(x + fc(paddle.matmul(att, v), D, num_flatten_dims=2),
                                        begin_norm_axis=2)
        h = fc(F.gelu(fc(x, 4 * D, num_flatten_dims=2)), D, num_flatten_dims=2)
        return paddle.static.nn.layer_norm(x + h, begin_norm_axis=2)
    tokens = paddle.static.data("tokens", [B, T], "int64")
    h, _ = paddle.nn.LSTM(D, D)(paddle.static.nn.embedding(tokens, (V, D)))
    return fc(h, V, num_flatten_dims=2)


def paddle_report(name, policy):
    paddle.enable_static()
    main, startup = paddle.static.Program(), paddle.static.Program()
    with paddle.static.program_guard(main, startup), paddle.utils.unique_name.guard():
        loss = paddle.mean(paddle_forward(name))
        opt = paddle_amp.decorate(paddle.optimizer.SGD(0.1), policy=policy)
        opt.minimize(loss)
    return paddle_amp.cast_report(main)


# -- the same models as Paddle dygraph Layers (eager mode, paddle_amp.dygraph) ----------------

def dygraph_layer(name):
    """(Layer, example input) for a reference model in eager mode, with the shapes above."""
    nn, F = paddle.nn, paddle.nn.functional
    paddle.disable_static()
    if name == "mlp":
        net = nn.Sequential(nn.Linear(D, D), nn.ReLU(), nn.Linear(D, V))
        return net, paddle.ones([B, D])
    if name == "cnn":
        net = nn.Sequential(nn.Conv2D(1, C, 3, padding=1), nn.BatchNorm2D(C), nn.ReLU(),
                            nn.MaxPool2D(2), nn.Flatten(), nn.Linear(C * (HW // 2) ** 2, V))
        return net, paddle.ones([B, 1, HW, HW])
    if name == "transformer":
        return _DygraphTransformer(), paddle.ones([B, T, D])
    return _DygraphLSTMStep(), paddle.to_tensor(np.arange(B * T).reshape(B, T) % V)


class _DygraphTransformer(paddle.nn.Layer):
    def __init__(self):
        super().__init__()
        nn = paddle.nn
        self.q, self.k, self.v, self.o = (nn.Linear(D, D) for _ in range(4))
        self.ff1, self.ff2 = nn.Linear(D, 4 * D), nn.Linear(4 * D, D)
        self.ln1, self.ln2 = nn.LayerNorm(D), nn.LayerNorm(D)

    def forward(self, x):
        F = paddle.nn.functional
        att = paddle.matmul(self.q(x), self.k(x), transpose_y=True) * (1 / math.sqrt(D))
        x = self.ln1(x + self.o(paddle.matmul(F.softmax(att, axis=-1), self.v(x))))
        return self.ln2(x + self.ff2(F.gelu(self.ff1(x))))


class _DygraphLSTMStep(paddle.nn.Layer):
    def __init__(self):
        super().__init__()
        self.embed, self.lstm = paddle.nn.Embedding(V, D), paddle.nn.LSTM(D, D)
        self.out = paddle.nn.Linear(D, V)

    def forward(self, tokens):
        h, _ = self.lstm(self.embed(tokens))
        return self.out(h)


def dygraph_report(name, policy):
    """What ``paddle_amp.dygraph`` decides for the model's forward under ``policy``."""
    from paddle_amp import dygraph
    net, x = dygraph_layer(name)
    return dygraph.cast_report(net, x, policy=policy)
