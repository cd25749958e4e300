"""Per-step cost of loss scaling on CPU: plain fp32 vs native decorate vs paddle_amp.decorate.

    FLAGS_enable_pir_api=0 PYTHONPATH=. python bench/paddle_step_overhead.py [--steps N]

An MLP (hidden -> hidden -> hidden -> 10, batch 64) per optimizer (Adam,
Momentum) and hidden size (64, 256, 1024), built three times: plain,
``paddle.static.amp.decorate`` and ``paddle_amp.decorate`` (defaults: O1 fp16
with dynamic loss scaling; on CPU no op has an fp16 kernel, so this is the
cost of checking, skipping and scaling). Steps of the three run interleaved
(rotating order) so machine noise hits all alike; prints the median step time,
its interquartile range, the ratios of the medians and the median of the
per-round ratios (paired, the most robust on a busy machine).

Adam/AdamW skip an overflow step inside their kernel (``SkipUpdate``), so their
ops stay in the main block; other optimizers (Momentum, SGD) run in a
``conditional_block``, whose sub-executor runs their ops one after another.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("FLAGS_enable_pir_api", "0")

import numpy as np  # noqa: E402
import paddle  # noqa: E402

import paddle_amp  # noqa: E402

BATCH = 64
VARIANTS = ("plain", "native", "paddle_amp")


OPTIMIZERS = {"adam": lambda: paddle.optimizer.Adam(0.001),
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


def bench(hidden: int, optimizer: str, steps: int, warmup: int = 20) -> dict[str, list[float]]:
    built = {v: build(v, hidden, optimizer) for v in VARIANTS}
    times: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for step in range(warmup + steps):
        order = VARIANTS[step % 3:] + VARIANTS[:step % 3]
        for v in order:
            exe, main, scope, feed, loss = built[v]
            with paddle.static.scope_guard(scope):
                t0 = time.perf_counter()
                exe.run(main, feed=feed, fetch_list=[loss])
                dt = time.perf_counter() - t0
            if step >= warmup:
                times[v].append(dt)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--hidden", type=int, nargs="*", default=[64, 256, 1024])
    parser.add_argument("--optimizer", nargs="*", default=sorted(OPTIMIZERS), choices=OPTIMIZERS)
    args = parser.parse_args()
    paddle.enable_static()
    print(f"paddle {paddle.__version__}, CPU, batch {BATCH}, {args.steps} interleaved steps")
    print(f"{'opt':>8} {'hidden':>6} {'variant':>10} {'median ms':>10} {'IQR ms':>15} "
          f"{'/plain':>7} {'/native':>8} {'paired /plain':>14}")
    for optimizer in args.optimizer:
        for hidden in args.hidden:
            times = bench(hidden, optimizer, args.steps)
            med = {v: statistics.median(t) * 1e3 for v, t in times.items()}
            plain = np.array(times["plain"])
            for v in VARIANTS:
                q1, q3 = np.percentile(np.array(times[v]) * 1e3, [25, 75])
                paired = np.median(np.array(times[v]) / plain)
                print(f"{optimizer:>8} {hidden:>6} {v:>10} {med[v]:>10.3f} {q1:>7.3f}-{q3:<7.3f} "
                      f"{med[v] / med['plain']:>7.3f} {med[v] / med['native']:>8.3f} "
                      f"{paired:>14.3f}", flush=True)


if __name__ == "__main__":
    main()
