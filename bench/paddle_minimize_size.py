"""Figure: ``minimize`` time against program size, plain / native decorate / paddle_amp.

A stack of Dense+LayerNorm layers (hidden 32) under SGD, built and minimized in
one process, each variant in turn per repetition (the fastest of a few builds
is reported: other load on the machine only ever adds to a build's time). Times are
the process's CPU time (``time.process_time``): ``minimize`` is single-threaded Python,
and on a shared machine wall time measures the other load.
paddle_amp runs under three policies:

- ``fp16-emulated``: O1 fp16 with ``emulate=True``, so on CPU every fc gets casts
  (real fp16 casts on a GPU): the rewrite's cost is what is measured;
- ``O1-bf16``: the preset, on this CPU's bf16 kernels (oneDNN where it has them);
- ``auto``: measured speed, from a warm cache (``AMP_ADAPTERS_CACHE`` is pointed at a
  temporary directory and one build warms it before the timed ones): a warm profile
  must cost nothing measurable (issue 31).

The native decorate on CPU inserts no cast (it asks about GPU kernels), so it is
listed for reference. Each IR this Paddle has is measured: the legacy IR, and PIR on
Paddle 3 (``python -m bench.paddle_minimize_size`` with the paddle3 environment).
Target: paddle_amp within 1.5x plain at 50 and 200 layers, in both IRs, under every
policy.
"""
from __future__ import annotations

import contextlib
import os
import tempfile
import time

import numpy as np  # noqa: E402

from amp_adapters import Policy  # noqa: E402

VARIANTS = ("plain", "native", "paddle_amp")
POLICIES = {"fp16-emulated": lambda: Policy.preset("O1", emulate=True),
            "O1-bf16": lambda: "O1-bf16",
            "auto": lambda: "auto"}


def irs() -> tuple[str, ...]:
    """The IRs this Paddle builds static programs in."""
    import paddle
    return ("legacy", "pir") if hasattr(paddle, "pir_utils") and \
        hasattr(paddle.pir_utils, "OldIrGuard") else ("legacy",)


def _guard(ir: str):
    import paddle
    if ir == "pir":
        return paddle.pir_utils.IrGuard()
    guard = getattr(getattr(paddle, "pir_utils", None), "OldIrGuard", None)
    return guard() if guard is not None and irs() == ("legacy", "pir") \
        else contextlib.nullcontext()


def build(variant: str, layers: int, policy="fp16-emulated", ir: str = "legacy",
          hidden: int = 32) -> tuple[float, int]:
    """CPU seconds ``minimize`` took, and the number of ops of the minimized program."""
    import paddle

    import paddle_amp

    with _guard(ir):
        main, startup = paddle.static.Program(), paddle.static.Program()
        with paddle.static.program_guard(main, startup), paddle.base.unique_name.guard():
            h = x = paddle.static.data("x", [None, hidden], "float32")
            for _ in range(layers):
                h = paddle.static.nn.fc(h, hidden)
                h = paddle.nn.functional.layer_norm(h, hidden)
            loss = paddle.mean(h - x)
            opt = paddle.optimizer.SGD(0.01)
            if variant == "native":
                opt = paddle.static.amp.decorate(opt)
            elif variant == "paddle_amp":
                opt = paddle_amp.decorate(opt, policy=POLICIES[policy]())
            t0 = time.process_time()
            opt.minimize(loss)
            return time.process_time() - t0, len(main.global_block().ops)


def measure(layers: int, reps: int, policy: str, ir: str) -> dict[str, tuple[float, int]]:
    """(fastest seconds, ops) per variant; the native's is missing where its decorate fails
    (Paddle 3.3.1's under PIR: its ``check_finite_and_unscale_`` gets no scale)."""
    variants = VARIANTS
    try:
        build("native", layers, policy, ir)
    except ValueError:
        variants = tuple(v for v in VARIANTS if v != "native")
    times: dict[str, list[float]] = {v: [] for v in variants}
    nops: dict[str, int] = {}
    build("paddle_amp", layers, policy, ir)  # warms this process and the speed cache
    for r in range(reps):
        for v in variants[r % len(variants):] + variants[:r % len(variants)]:
            t, n = build(v, layers, policy, ir)
            times[v].append(t)
            nops[v] = n
    # the fastest build of each: a build takes seconds, and on a shared machine the other
    # load only ever adds to it (the minimum, as timeit reports, is the stable statistic)
    return {v: (float(np.min(times[v])), nops[v]) for v in variants}


def run(sizes=(50, 200), reps: int = 5, policies=tuple(POLICIES), only_ir=None) -> str:
    import paddle

    paddle.enable_static()
    rows = []
    with tempfile.TemporaryDirectory() as cache:
        saved = os.environ.get("AMP_ADAPTERS_CACHE")
        os.environ["AMP_ADAPTERS_CACHE"] = cache
        try:
            for ir in irs() if only_ir is None else (only_ir,):
                for policy in policies:
                    for layers in sizes:
                        m = measure(layers, reps, policy, ir)
                        plain = m["plain"][0]
                        native = f"{m['native'][0] / plain:.2f}x" if "native" in m else "fails"
                        per_op = (m["paddle_amp"][0] / m["paddle_amp"][1]) / (plain / m["plain"][1])
                        rows.append(f"| {ir} | {policy} | {layers} | {m['plain'][1]} / "
                                    f"{m['paddle_amp'][1]} | {native} | "
                                    f"{m['paddle_amp'][0] / plain:.2f}x | {per_op:.2f}x |")
                        print("  " + rows[-1], flush=True)
        finally:
            if saved is None:
                os.environ.pop("AMP_ADAPTERS_CACHE", None)
            else:
                os.environ["AMP_ADAPTERS_CACHE"] = saved
    paddle.disable_static()
    return "\n".join([
        "## Figure: `minimize` time vs program size, Paddle", "",
        f"Paddle {paddle.__version__}, CPU, Dense+LayerNorm layers (hidden 32), SGD; paddle_amp "
        "O1 fp16 emulated (every fc gets casts), the O1-bf16 preset, and `auto` from a warm "
        f"speed cache. Fastest of {reps} builds per variant, interleaved, after one warm-up "
        "build; ratios to plain `minimize`. Last column: paddle_amp's time per op of the "
        "program it produces, against plain's per op. Target: paddle_amp at most 1.5x plain "
        "at 50 and 200 layers, in each IR, under each policy.", "",
        "| IR | policy | layers | ops plain / paddle_amp | native vs plain | "
        "paddle_amp vs plain | paddle_amp per op vs plain per op |",
        "| --- | --- | --- | --- | --- | --- | --- |", *rows])


if __name__ == "__main__":
    import argparse
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ir", choices=("legacy", "pir"))
    parser.add_argument("--policy", action="append", choices=tuple(POLICIES))
    parser.add_argument("--layers", type=int, action="append")
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    print(run(tuple(args.layers or (50, 200)), args.reps, tuple(args.policy or POLICIES),
              args.ir))
