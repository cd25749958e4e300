"""Gluon training with mixed precision: `import mxnet_amp as amp` instead of mxnet.contrib.amp.

Trains an MLP on scikit-learn's digits, first imperatively, then hybridized,
under the shared policy file, then at O2 (fp16 parameters, fp32 master
weights). On a CPU the fp16 GEMMs are emulated (the native mxnet.contrib.amp
crashes there: "FP16 gemm on cpu not implemented"), as is O2's master update.

    python examples/gluon_train.py [--policy examples/policy.toml]
"""
import argparse
import os

from amp_adapters.services.quiet import quiet_frameworks

quiet_frameworks()  # framework log noise off: glog INFO lines, "Cannot decide type", ...

import mxnet as mx  # noqa: E402
import numpy as np  # noqa: E402
from mxnet import autograd, gluon  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402

import mxnet_amp as amp  # noqa: E402


def train(hybridize: bool, o2: bool = False, steps: int = 300) -> float:
    digits = load_digits()
    x_all = mx.nd.array(digits.data / 16.0)
    y_all = mx.nd.array(digits.target)
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Dense(64, activation="relu"), gluon.nn.Dense(10))
    net.initialize(mx.init.Xavier())
    if o2:
        plan = amp.cast_params(net)               # the parameters the policy stores in fp16
        print(f"  {len(plan.low)} parameters stored in {amp.active_policy().dtype}")
    if hybridize:
        net.hybridize()
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1, "momentum": 0.9})
    amp.init_trainer(trainer)                     # dynamic loss scaling from the policy
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    rng = np.random.default_rng(0)
    for step in range(steps):
        idx = mx.nd.array(rng.integers(0, 1400, 64))
        x, y = mx.nd.take(x_all, idx), mx.nd.take(y_all, idx)
        with autograd.record():
            loss = loss_fn(net(x), y)
            with amp.scale_loss(loss, trainer) as scaled_loss:
                autograd.backward(scaled_loss)
        trainer.step(x.shape[0])                  # skipped (and counted) on overflow
        if step % 100 == 0:
            state = amp.loss_scale(trainer)
            print(f"  step {step:3d}  loss {loss.mean().asscalar():.3f}  scale {state.scale:g}  "
                  f"skipped {state.skipped_steps}")
    pred = net(x_all[1400:]).argmax(axis=1)
    return float((pred == y_all[1400:]).mean().asscalar())


if __name__ == "__main__":
    here = os.path.dirname(os.path.abspath(__file__))
    parser = argparse.ArgumentParser()
    parser.add_argument("--policy", default=os.path.join(here, "policy.toml"))
    args = parser.parse_args()
    amp.init(policy=args.policy)                  # before the model is built or traced
    for hybridize in (False, True):
        print(f"{'hybridized' if hybridize else 'imperative'}:")
        print(f"  final accuracy {train(hybridize):.3f}")
    amp.reset()
    amp.init(policy=amp.Policy.preset("O2", emulate=True))  # or a policy file with level = "O2"
    print("O2 hybridized:")
    print(f"  final accuracy {train(True, o2=True):.3f}")
