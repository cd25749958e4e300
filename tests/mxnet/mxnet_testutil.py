"""Helpers for the mxnet_amp tests: a tiny deterministic model, batches, one backward pass."""
import numpy as np
import mxnet as mx
from mxnet import autograd, gluon, nd

import mxnet_amp as amp


def mlp(ctx=None, hidden=8, out=3, in_units=4):
    """A small hybridized Dense network, initialised deterministically."""
    mx.random.seed(0)
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Dense(hidden, activation="relu", in_units=in_units),
            gluon.nn.Dense(out, in_units=hidden))
    net.initialize(mx.init.Xavier(), ctx=ctx or mx.cpu())
    net.hybridize()
    return net


def batch(step, ctx=mx.cpu(), n=4, in_units=4, classes=3):
    rs = np.random.RandomState(step)
    return (nd.array(rs.uniform(-1, 1, (n, in_units)), ctx=ctx),
            nd.array(rs.randint(0, classes, n), ctx=ctx))


def backward(net, trainer, x, y, scaled=True):
    """Forward + backward of a softmax cross-entropy loss, scaled when ``scaled``; returns it."""
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    with autograd.record():
        loss = loss_fn(net(x), y)
        if scaled:
            with amp.scale_loss(loss, trainer) as scaled_loss:
                autograd.backward(scaled_loss)
        else:
            loss.backward()
    return loss
