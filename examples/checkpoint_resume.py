"""Checkpoint and resume a mixed-precision Gluon run without losing the loss-scale trajectory.

Save the parameters, the trainer (optimizer) states and `amp.state_dict(trainer)`;
restore all three in a new process and the run continues exactly as if it had
never stopped (same scales, same skipped steps, same weights).

    python examples/checkpoint_resume.py save DIR     # train 20 steps, save
    python examples/checkpoint_resume.py resume DIR   # load, train 20 more
    python examples/checkpoint_resume.py full         # 40 steps in one go: the same last line
"""
import argparse
import json
import os

from amp_adapters.quiet import quiet_frameworks

quiet_frameworks()  # framework log noise off: glog INFO lines, "Cannot decide type", ...

import mxnet as mx  # noqa: E402
import numpy as np  # noqa: E402
from mxnet import autograd, gluon  # noqa: E402

import mxnet_amp as amp  # noqa: E402
from amp_adapters import DynamicLossScale  # noqa: E402


def build():
    amp.init(policy="O1", emulate=True)
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Dense(16, activation="relu", in_units=8), gluon.nn.Dense(1, in_units=16))
    net.initialize(mx.init.Xavier(), force_reinit=True)
    net.hybridize()
    trainer = gluon.Trainer(net.collect_params(), "adam", {"learning_rate": 0.01})
    amp.init_trainer(trainer, DynamicLossScale(growth_interval=5))
    return net, trainer


def train(net, trainer, steps, first):
    rng = np.random.default_rng(first)  # the data of steps first..first+steps
    for _ in range(steps):
        x = mx.nd.array(rng.standard_normal((32, 8)))
        with autograd.record():
            loss = ((net(x) - x.sum(axis=1, keepdims=True)) ** 2).mean()
            with amp.scale_loss(loss, trainer) as scaled:
                autograd.backward(scaled)
        trainer.step(1)
    state = amp.loss_scale(trainer)
    print(f"after step {first + steps}: scale {state.scale:g}, skipped {state.skipped_steps}, "
          f"loss {loss.asscalar():.4f}")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="\n".join(__doc__.splitlines()[6:]))
    parser.add_argument("command", choices=("save", "resume", "full"))
    parser.add_argument("folder", nargs="?", metavar="DIR",
                        help="where save writes and resume reads the checkpoint")
    args = parser.parse_args()
    if args.command != "full" and not args.folder:
        parser.error(f"{args.command} needs DIR, the checkpoint folder")
    return args


if __name__ == "__main__":
    command = parse_args()
    folder, command = command.folder, command.command
    mx.random.seed(0)
    net, trainer = build()
    if command == "full":
        train(net, trainer, 20, 0)
        train(net, trainer, 20, 20)
    elif command == "save":
        train(net, trainer, 20, 0)
        os.makedirs(folder, exist_ok=True)
        net.save_parameters(os.path.join(folder, "net.params"))
        trainer.save_states(os.path.join(folder, "trainer.states"))
        with open(os.path.join(folder, "amp.json"), "w") as f:
            json.dump(amp.state_dict(trainer), f)
    else:
        net(mx.nd.zeros((1, 8)))  # initialise the optimizer's view of the shapes
        net.load_parameters(os.path.join(folder, "net.params"))
        trainer.load_states(os.path.join(folder, "trainer.states"))
        with open(os.path.join(folder, "amp.json")) as f:
            amp.load_state_dict(trainer, json.load(f))
        train(net, trainer, 20, 20)
