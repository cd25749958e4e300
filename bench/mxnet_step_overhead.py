"""Step overhead of loss scaling on a 1.05M-parameter MLP (MXNet/Gluon, CPU), side by side.

MLP 512-1024-512-10, batch 64, SGD with momentum, hybridized (the loss too, so
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


def build():
    mx.random.seed(0)
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Dense(1024, activation="relu", in_units=512),
            gluon.nn.Dense(512, activation="relu", in_units=1024),
            gluon.nn.Dense(10, in_units=512))
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


def variants() -> dict:
    """One step function per variant, each with its own model and trainer."""
    out = {"plain": make_step(*build()), "plain (2nd copy)": make_step(*build()),
           "plain + 1 host sync": make_step(*build(), sync_before_step=True)}
    net, trainer = build()
    mxnet_amp.init_trainer(trainer)
    out["mxnet_amp"] = make_step(net, trainer, mxnet_amp.scale_loss)
    net, trainer = build()
    trainer._amp_loss_scaler, trainer._amp_original_scale = LossScaler(), trainer._scale
    out["native"] = make_step(net, trainer, native_amp.scale_loss)
    for step in out.values():
        step()  # traced now, before init() patches the ops
    mxnet_amp.init()  # the next model is traced with casts
    net, trainer = build()
    mxnet_amp.init_trainer(trainer)
    out["mxnet_amp+init"] = make_step(net, trainer, mxnet_amp.scale_loss)
    return out


def run(steps: int = 200) -> str:
    """Markdown section for bench/RESULTS.md."""
    try:
        stats = interleaved(variants(), steps=steps)
    finally:
        mxnet_amp.reset()
    lines = ["## MXNet: loss-scaling step overhead (CPU)", "",
             f"MLP 512-1024-512-10 (1.05M params), batch 64, SGD momentum, hybridized; "
             f"{steps} interleaved steps per variant. Ratio of median step times to plain fp32 "
             f"(p10-p90 spread). Target for mxnet_amp: <= 1.10x. 'plain (2nd copy)' is the same "
             f"model again: its distance from 1.00x is the noise of this measurement. 'plain + 1 "
             f"host sync' waits for the backward pass before trainer.step: the floor of any "
             f"exact overflow skip, since the update may only be enqueued once the check is "
             f"read.", "",
             "| variant | step time vs plain fp32 |", "|---|---|"]
    lines += [f"| {name} | {ratio(stats, name, 'plain')} |" for name in stats]
    return "\n".join(lines)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    print(run(parser.parse_args().steps))
