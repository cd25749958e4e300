"""Paddle 3: paddle_amp's step overhead and casts per step under PIR, beside the legacy IR.

    make bench-paddle3        # = PYTHONPATH=. .venv-paddle3/bin/python -m bench.paddle_pir_overhead

Needs Paddle 3 (the paddle3 environment), so it is not one of ``make bench``'s
sections (those run on Paddle 2.6.2 with MXNet); its output is pasted into
bench/RESULTS.md by hand. One process builds every program: the PIR ones at
the default flags, the legacy ones inside ``paddle.pir_utils.OldIrGuard()``
(and run inside it: each legacy step pays the guard's flag switch, its plain
and paddle_amp variants alike). All four variants of a row run interleaved
(bench/timing.py); each IR's overhead is paddle_amp over plain in that IR, and
the last column compares the two overheads (PIR over legacy).

The model is the Figure 2 MLP (hidden -> hidden -> hidden -> 10, batch 64),
paddle_amp at its defaults (O1 fp16, dynamic loss scaling): on CPU no GEMM has
an fp16 kernel, so this is the cost of scaling, checking and skipping.
Casts per step count every cast op of the training program (forward and
backward) with fp16 emulation on, which inserts them.
"""
from __future__ import annotations

import argparse
import contextlib

import numpy as np
import paddle

import paddle_amp
from bench.timing import interleaved, ratio

BATCH = 64
OPTIMIZERS = {"adam": lambda: paddle.optimizer.Adam(0.001),
              "momentum": lambda: paddle.optimizer.Momentum(0.01, momentum=0.9)}


def _guard(ir: str):
    return paddle.pir_utils.OldIrGuard() if ir == "legacy" else contextlib.nullcontext()


def build(ir: str, amp: bool, hidden: int, optimizer: str, **decorate):
    """(step function, program) for one variant, startup already run."""
    with _guard(ir):
        main, startup = paddle.static.Program(), paddle.static.Program()
        scope = paddle.static.Scope()
        main.random_seed = startup.random_seed = 1
        with paddle.static.program_guard(main, startup), paddle.base.unique_name.guard():
            x = paddle.static.data("x", [None, hidden], "float32")
            label = paddle.static.data("label", [None, 1], "int64")
            h = paddle.static.nn.fc(x, hidden, activation="relu")
            h = paddle.static.nn.fc(h, hidden, activation="relu")
            logits = paddle.static.nn.fc(h, 10)
            loss = paddle.mean(paddle.nn.functional.cross_entropy(logits, label))
            opt = OPTIMIZERS[optimizer]()
            if amp:
                opt = paddle_amp.decorate(opt, **decorate)
            opt.minimize(loss)
        exe = paddle.static.Executor(paddle.CPUPlace())
        with paddle.static.scope_guard(scope):
            exe.run(startup)
    rng = np.random.RandomState(0)
    feed = {"x": rng.rand(BATCH, hidden).astype("float32"),
            "label": rng.randint(0, 10, (BATCH, 1)).astype("int64")}

    def step():
        with _guard(ir), paddle.static.scope_guard(scope):
            exe.run(main, feed=feed, fetch_list=[loss])
    return step, main


def casts(program) -> int:
    """Cast ops in every block of ``program`` (either IR)."""
    if paddle_amp.ir.kind(program) == "pir":
        count, stack = 0, [program.global_block()]
        while stack:
            for op in stack.pop().ops:
                count += op.name() == "pd_op.cast"
                if op.num_regions():
                    stack.extend(list(op.blocks()))
        return count
    return sum(op.type == "cast" for block in program.blocks for op in block.ops)


def run(steps: int = 300, hiddens=(64, 256, 1024)) -> str:
    paddle.enable_static()
    rows = []
    for optimizer in sorted(OPTIMIZERS):
        for hidden in hiddens:
            variants = {f"{ir}/{'amp' if amp else 'plain'}": build(ir, amp, hidden, optimizer)[0]
                        for ir in ("pir", "legacy") for amp in (False, True)}
            s = interleaved(variants, steps=steps)
            pir = s["pir/amp"].median / s["pir/plain"].median
            legacy = s["legacy/amp"].median / s["legacy/plain"].median
            rows.append(f"| {optimizer} | {hidden} | {ratio(s, 'pir/amp', 'pir/plain')} | "
                        f"{ratio(s, 'legacy/amp', 'legacy/plain')} | {pir / legacy:.2f}x |")
            print("  " + rows[-1], flush=True)
    count_rows = []
    for optimizer in sorted(OPTIMIZERS):
        n = {ir: casts(build(ir, True, 256, optimizer, emulate=True)[1])
             for ir in ("pir", "legacy")}
        count_rows.append(f"| {optimizer} | {n['pir']} | {n['legacy']} |")
    paddle.disable_static()
    return "\n".join([
        "## Paddle 3: PIR beside the legacy IR", "",
        f"Paddle {paddle.__version__}, CPU, the Figure 2 MLP, batch {BATCH}; paddle_amp "
        "defaults (O1 fp16, dynamic loss scaling). Median step time of paddle_amp over plain "
        "fp32 in each IR, all four variants interleaved in one process; the last column is "
        "the PIR overhead over the legacy-IR overhead (1.00x: PIR costs what legacy costs). "
        "Target: within the noise of 1.00x.", "",
        "| optimizer | hidden | PIR: paddle_amp vs plain | legacy: paddle_amp vs plain | "
        "PIR overhead / legacy overhead |",
        "| --- | --- | --- | --- | --- |", *rows, "",
        "Casts per training step (forward and backward, fp16 emulated, hidden 256):", "",
        "| optimizer | PIR | legacy IR |", "| --- | --- | --- |", *count_rows])


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    print(run(parser.parse_args().steps))
