"""Checkpoint and resume a mixed-precision Gluon run without losing the loss-scale trajectory.

`amp.save_checkpoint(DIR, net, trainer)` saves the parameters, the optimizer
states, the loss-scale state and the step as one atomic checkpoint (the
previous one stays valid until the new one is complete, so the run can be
killed at any moment); `amp.load_checkpoint(DIR, net, trainer)` verifies it and
restores all of it in a new process, and the run continues exactly as if it
had never stopped (same scales, same skipped steps, same weights).

    python examples/checkpoint_resume.py save DIR     # train 20 steps, save
    python examples/checkpoint_resume.py resume DIR   # load, train 20 more
    python examples/checkpoint_resume.py full         # 40 steps in one go: the same last line
    python examples/checkpoint_resume.py run DIR      # 40 steps, a checkpoint every 5; kill it
                                                      # (Ctrl-C) and run it again: it resumes
"""
import argparse
import sys

from amp_adapters.services.quiet import quiet_frameworks

quiet_frameworks()  # framework log noise off: glog INFO lines, "Cannot decide type", ...

import mxnet as mx  # noqa: E402
import numpy as np  # noqa: E402
from mxnet import autograd, gluon  # noqa: E402

import mxnet_amp as amp  # noqa: E402
from amp_adapters import CheckpointError, DynamicLossScale  # noqa: E402

STEPS = 40


def build():
    amp.init(policy="O1", emulate=True)
    mx.random.seed(0)
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Dense(16, activation="relu", in_units=8), gluon.nn.Dense(1, in_units=16))
    net.initialize(mx.init.Xavier(), force_reinit=True)
    net.hybridize()
    trainer = gluon.Trainer(net.collect_params(), "adam", {"learning_rate": 0.01})
    amp.init_trainer(trainer, DynamicLossScale(growth_interval=5))
    return net, trainer


def train(net, trainer, first, last, folder=None, every=None):
    """Steps first+1..last; the data of step k depend on k only. Checkpoint every ``every``."""
    loss = None
    for k in range(first + 1, last + 1):
        x = mx.nd.array(np.random.default_rng(k).standard_normal((32, 8)))
        with autograd.record():
            loss = ((net(x) - x.sum(axis=1, keepdims=True)) ** 2).mean()
            with amp.scale_loss(loss, trainer) as scaled:
                autograd.backward(scaled)
        trainer.step(1)
        if every and k % every == 0:
            amp.save_checkpoint(folder, net, trainer, step=k)
    state = amp.loss_scale(trainer)
    print(f"after step {last}: scale {state.scale:g}, skipped {state.skipped_steps}"
          + (f", loss {loss.asscalar():.4f}" if loss is not None else ""))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="\n".join(__doc__.splitlines()[8:]))
    parser.add_argument("command", choices=("save", "resume", "full", "run"))
    parser.add_argument("folder", nargs="?", metavar="DIR",
                        help="the checkpoint folder (save, resume, run)")
    args = parser.parse_args(argv)
    if args.command != "full" and not args.folder:
        parser.error(f"{args.command} needs the checkpoint folder: "
                     f"checkpoint_resume.py {args.command} DIR")
    net, trainer = build()
    if args.command == "full":
        train(net, trainer, 0, STEPS // 2)
        train(net, trainer, STEPS // 2, STEPS)
    elif args.command == "save":
        train(net, trainer, 0, STEPS // 2)
        amp.save_checkpoint(args.folder, net, trainer, step=STEPS // 2)
    elif args.command == "resume":
        net(mx.nd.zeros((1, 8)))  # shapes known before loading
        try:
            step = amp.load_checkpoint(args.folder, net, trainer)
        except CheckpointError as e:
            sys.exit(f"checkpoint_resume.py: error: {e}")
        train(net, trainer, step, STEPS)
    else:
        net(mx.nd.zeros((1, 8)))
        try:
            step = amp.load_checkpoint(args.folder, net, trainer)
            print(f"resuming after step {step}")
        except CheckpointError as e:
            if "no complete checkpoint" not in str(e) and "does not exist" not in str(e):
                sys.exit(f"checkpoint_resume.py: error: {e}")
            step = 0
        train(net, trainer, step, STEPS, args.folder, every=5)


if __name__ == "__main__":
    main()
