"""Step overhead of loss scaling on two 1.05M-parameter MLPs (MXNet/Gluon, CPU), side by side.

MLP 512-1024-512-10 and the deep narrow 512-8x352-10, batch 64, SGD with momentum, hybridized (the loss too, so
that no imperative op is patched by the +init variant's ``init()``). Variants run
interleaved in one process (one step of each in turn), so machine noise hits
them alike; each reports its median step time as a ratio to the plain fp32
step, with the spread (p10-p90 of its own steps, over the plain median).

  plain          fp32, no AMP; a 2nd identical copy shows the measurement noise
  plain + 1 host sync   plain, waiting for the backward pass before trainer.step: the floor
                 of any exact skip (the update may only be enqueued once the check is read)
  mxnet_amp      mxnet_amp.init_trainer + scale_loss + step (on-device check, 1 host sync)
  mxnet_amp+init the same after mxnet_amp.init() (casts in the traced graph; on CPU the
                 GEMMs stay fp32 for lack of fp16 kernels)
  native         mxnet.contrib.amp scale_loss + LossScaler (multi_all_finite); native
                 amp.init() is not used: its fp16 graph crashes on CPU

Run: PYTHONPATH=. .venv/bin/python bench/mxnet_step_overhead.py [--steps 200]
(or ``python -m bench --only mxnet_step``)
"""
import argparse

import numpy as np
import mxnet as mx
from mxnet import autograd, gluon, nd
from mxnet.contrib import amp as native_amp
from mxnet.contrib.amp.loss_scaler import LossScaler

import mxnet_amp
from bench.timing import interleaved, ratio


MODELS = {  # name -> hidden layer widths between the 512 inputs and the 10 outputs
    "MLP 512-1024-512-10 (1.05M params)": (1024, 512),
    "deep narrow MLP 512-8x352-10 (1.05M params)": (352,) * 8,
}


def build(hidden=MODELS["MLP 512-1024-512-10 (1.05M params)"]):
    mx.random.seed(0)
    net = gluon.nn.HybridSequential()
    for n_in, n_out in zip((512,) + hidden, hidden):
        net.add(gluon.nn.Dense(n_out, activation="relu", in_units=n_in))
    net.add(gluon.nn.Dense(10, in_units=hidden[-1]))
    net.initialize(mx.init.Xavier())
    net.hybridize(static_alloc=True, static_shape=True)
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.01,
                                                          "momentum": 0.9})
    return net, trainer


def make_step(net, trainer, scale_loss=None, sync_before_step=False):
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    loss_fn.hybridize(static_alloc=True, static_shape=True)  # no imperative op in the step
    rs = np.random.RandomState(0)
    x, y = nd.array(rs.uniform(size=(64, 512))), nd.array(rs.randint(0, 10, 64))

    def step():
        with autograd.record():
            loss = loss_fn(net(x), y)
            if scale_loss is None:
                loss.backward()
            else:
                with scale_loss(loss, trainer) as scaled:
                    scaled.backward()
        if sync_before_step:
            nd.waitall()
        trainer.step(64)
        nd.waitall()
    return step


def variants(hidden) -> dict:
    """One step function per variant, each with its own model and trainer."""
    out = {"plain": make_step(*build(hidden)), "plain (2nd copy)": make_step(*build(hidden)),
           "plain + 1 host sync": make_step(*build(hidden), sync_before_step=True)}
    net, trainer = build(hidden)
    mxnet_amp.init_trainer(trainer)
    out["mxnet_amp"] = make_step(net, trainer, mxnet_amp.scale_loss)
    net, trainer = build(hidden)
    trainer._amp_loss_scaler, trainer._amp_original_scale = LossScaler(), trainer._scale
    out["native"] = make_step(net, trainer, native_amp.scale_loss)
    for step in out.values():
        step()  # traced now, before init() patches the ops
    mxnet_amp.init()  # the next model is traced with casts
    net, trainer = build(hidden)
    mxnet_amp.init_trainer(trainer)
    out["mxnet_amp+init"] = make_step(net, trainer, mxnet_amp.scale_loss)
    return out


def run(steps: int = 200) -> str:
    """Markdown section for bench/RESULTS.md."""
    lines = ["## Figure 1: step overhead, MXNet", "",
             f"Batch 64, SGD momentum, hybridized, CPU; {steps} interleaved steps per variant. "
             "Ratio of median step times to plain fp32 (p10-p90 spread). Target for mxnet_amp: "
             "<= 1.10x (native: 3.8x and 2.1x in ANCHORS.md). 'plain (2nd copy)' is the same "
             "model again: its distance from 1.00x is the noise of this measurement; 'plain + 1 "
             "host sync' is the floor of any exact skip (the update may only be enqueued once "
             "the check is read).", ""]
    for title, hidden in MODELS.items():
        try:
            stats = interleaved(variants(hidden), steps=steps)
        finally:
            mxnet_amp.reset()
        lines += [f"**{title}**", "", "| variant | step time vs plain fp32 |", "|---|---|"]
        lines += [f"| {name} | {ratio(stats, name, 'plain')} |" for name in stats] + [""]
    return "\n".join(lines)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    print(run(parser.parse_args().steps))
