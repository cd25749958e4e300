"""Figure: what ``paddle_amp.dygraph`` costs in eager mode where it lowers nothing, per op
call and per training step.

    PYTHONPATH=. python -m bench.dygraph_dispatch

Per op: ``paddle.matmul`` on float32 inputs (16x16, 64x64, 256x256), without AMP (no
region: nothing is wrapped) and inside a region whose policy keeps the op float32 (the
native bf16 lists with ``matmul_v2`` in ``custom_black_list``): the wrapper decides each
call and hands it on. The region is entered before and left after the timed calls, so the
figure is the per-call dispatch alone. Per step: an MLP (4 Linear layers, batch 64, Adam),
forward in a region, backward, step, without a region, in an ``O0`` region
(``enable=False``: nothing installed) and in the float32-keeping region above (entering
and leaving it each step is in the figure). Targets (issue 39): a per-op dispatch at most
1.15x the op without AMP; a step under a policy that lowers nothing at most 1.10x a plain
step. Variants interleaved in one process, median and 10th-90th percentile spread.
"""
from __future__ import annotations

import time

import numpy as np
import paddle

from bench.timing import interleaved, interleaved_self_timed, ratio
from paddle_amp import dygraph as amp

CALLS = 20  # op calls per timed sample
KEEP_FP32 = {"custom_black_list": {"matmul_v2", "conv2d"}, "dtype": "bfloat16"}


def _op_variants(n: int) -> dict:
    rng = np.random.default_rng(0)
    x = paddle.to_tensor(rng.random((n, n), dtype=np.float32))
    w = paddle.to_tensor(rng.random((n, n), dtype=np.float32))

    def calls() -> float:
        t0 = time.perf_counter()
        for _ in range(CALLS):
            paddle.matmul(x, w)
        return time.perf_counter() - t0

    def in_region() -> float:
        with amp.auto_cast(**KEEP_FP32):
            return calls()
    return {"plain": calls, "dispatch": in_region}


def _step_variants(width: int) -> dict:
    paddle.seed(0)
    layers = []
    for i in range(4):
        layers += [paddle.nn.Linear(width, width if i < 3 else 1)] + \
            ([paddle.nn.ReLU()] if i < 3 else [])
    model = paddle.nn.Sequential(*layers)
    opt = paddle.optimizer.Adam(1e-4, parameters=model.parameters())
    x = paddle.to_tensor(np.random.default_rng(0).random((64, width), dtype=np.float32))

    def step(region) -> None:
        with region():
            loss = model(x).mean()
        loss.backward()
        opt.step()
        opt.clear_grad()

    return {"plain": lambda: step(_no_region),
            "O0": lambda: step(lambda: amp.auto_cast(enable=False)),
            "keep_fp32": lambda: step(lambda: amp.auto_cast(**KEEP_FP32))}


class _no_region:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def run(op_steps: int = 400, step_steps: int = 200) -> str:
    """Markdown: the per-op and per-step ratios."""
    paddle.disable_static()
    op_rows, step_rows = [], []
    for n in (16, 64, 256):
        stats = interleaved_self_timed(_op_variants(n), steps=op_steps)
        op_rows.append(f"| {n}x{n} | {ratio(stats, 'dispatch', 'plain')} |")
        print("  " + op_rows[-1], flush=True)
    for width in (64, 512):
        stats = interleaved(_step_variants(width), steps=step_steps)
        step_rows.append(f"| {width} | {ratio(stats, 'O0', 'plain')} | "
                         f"{ratio(stats, 'keep_fp32', 'plain')} |")
        print("  " + step_rows[-1], flush=True)
    return "\n".join([
        "## Figure: Paddle dygraph, the dispatch's cost where it lowers nothing", "",
        f"Paddle {paddle.__version__}, eager mode, float32 inputs. Per op: `paddle.matmul` in "
        f"a region that keeps it float32 (the wrapper decides each call) over the same call "
        f"without AMP, {CALLS} calls per sample, {op_steps} samples, region entered outside "
        f"the timed calls. Target: at most 1.15x.", "",
        "| matmul | dispatch vs no AMP |", "| --- | --- |",
        *op_rows, "",
        f"Per step: MLP of 4 Linear layers (batch 64, Adam), forward in the region, entered "
        f"and left every step; {step_steps} steps each. Target: at most 1.10x plain.", "",
        "| width | `O0` region vs plain | float32-keeping region vs plain |",
        "| --- | --- | --- |", *step_rows])


if __name__ == "__main__":
    print(run())
