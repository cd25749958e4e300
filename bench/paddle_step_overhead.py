"""Per-step cost of loss scaling on CPU: plain fp32 vs native decorate vs paddle_amp.decorate.

    FLAGS_enable_pir_api=0 PYTHONPATH=. python bench/paddle_step_overhead.py [--steps N]

An MLP (hidden -> hidden -> hidden -> 10, batch 64) per optimizer (Adam,
Momentum) and hidden size (64, 256, 1024), built three times: plain,
``paddle.static.amp.decorate`` and ``paddle_amp.decorate`` (defaults: O1 fp16
with dynamic loss scaling; on CPU no op has an fp16 kernel, so this is the
cost of checking, skipping and scaling). Steps of the three run interleaved
(rotating order) so machine noise hits all alike; reports ratios of median
step times with their spread (bench/timing.py).

Adam/AdamW skip an overflow step inside their kernel (``SkipUpdate``), so their
ops stay in the main block; other optimizers (Momentum, SGD) run in a
``conditional_block``, whose sub-executor runs their ops one after another.
"""
from __future__ import annotations

import argparse
import os

os.environ.setdefault("FLAGS_enable_pir_api", "0")

import numpy as np  # noqa: E402
import paddle  # noqa: E402

import paddle_amp  # noqa: E402
from bench.timing import interleaved, ratio  # noqa: E402

BATCH = 64
VARIANTS = ("plain", "native", "paddle_amp")


OPTIMIZERS = {"adam": lambda: paddle.optimizer.Adam(0.001),
              "sgd": lambda: paddle.optimizer.SGD(0.01),
              "momentum": lambda: paddle.optimizer.Momentum(0.01, momentum=0.9)}


def build(variant: str, hidden: int, optimizer: str):
    """(executor, program, scope, feed, loss) for one variant, startup already run."""
    main, startup, scope = paddle.static.Program(), paddle.static.Program(), paddle.static.Scope()
    main.random_seed = startup.random_seed = 1
    with paddle.static.program_guard(main, startup), paddle.base.unique_name.guard():
        x = paddle.static.data("x", [None, hidden], "float32")
        label = paddle.static.data("label", [None, 1], "int64")
        h = paddle.static.nn.fc(x, hidden, activation="relu")
        h = paddle.static.nn.fc(h, hidden, activation="relu")
        logits = paddle.static.nn.fc(h, 10)
        loss = paddle.mean(paddle.nn.functional.cross_entropy(logits, label))
        opt = OPTIMIZERS[optimizer]()
        if variant == "native":
            opt = paddle.static.amp.decorate(opt)
        elif variant == "paddle_amp":
            opt = paddle_amp.decorate(opt)
        opt.minimize(loss)
    exe = paddle.static.Executor(paddle.CPUPlace())
    with paddle.static.scope_guard(scope):
        exe.run(startup)
    rng = np.random.RandomState(0)
    feed = {"x": rng.rand(BATCH, hidden).astype("float32"),
            "label": rng.randint(0, 10, (BATCH, 1)).astype("int64")}
    return exe, main, scope, feed, loss


def step_fn(built):
    exe, main, scope, feed, loss = built

    def step():
        with paddle.static.scope_guard(scope):
            exe.run(main, feed=feed, fetch_list=[loss])
    return step


def run(steps: int = 300, hiddens=(64, 256, 1024)) -> str:
    """Markdown: each variant's median step as a ratio to plain fp32 and to native decorate."""
    paddle.enable_static()
    rows = []
    for optimizer in sorted(OPTIMIZERS):
        for hidden in hiddens:
            stats = interleaved({v: step_fn(build(v, hidden, optimizer)) for v in VARIANTS},
                                steps=steps)
            rows.append(f"| {optimizer} | {hidden} | {ratio(stats, 'native', 'plain')} | "
                        f"{ratio(stats, 'paddle_amp', 'plain')} | "
                        f"{stats['paddle_amp'].median / stats['native'].median:.2f}x |")
            print("  " + rows[-1], flush=True)
    paddle.disable_static()
    return "\n".join([
        "## Figure 2: step overhead, Paddle", "",
        f"Paddle {paddle.__version__}, CPU, MLP hidden-hidden-hidden-10, batch {BATCH}; O1 fp16 "
        "with dynamic loss scaling (on CPU no op has an fp16 kernel: this is the cost of "
        "scaling, checking and skipping). Median step time over the plain fp32 program. "
        "Targets: paddle_amp no slower than native, at most 1.05x plain at hidden 256.", "",
        "| optimizer | hidden | native vs plain | paddle_amp vs plain | paddle_amp vs native |",
        "| --- | --- | --- | --- | --- |", *rows])


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    print(run(parser.parse_args().steps))
