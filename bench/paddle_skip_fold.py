"""Figure: Paddle SGD's true skip, folded into the update vs run in a ``conditional_block``.

The figure-2 MLP under SGD, four programs stepped interleaved: plain fp32, the
native decorate (which moves the weights on an overflow step), paddle_amp as
shipped (the skip folded: gradients zeroed and a learning rate of 0 on
overflow), and paddle_amp with the fold switched off for this measurement only,
so the SGD ops run in a ``conditional_block`` on finite steps (the previous
skip). Both skips are bit-exact; the faster one is shipped.
"""
from __future__ import annotations

from bench.paddle_step_overhead import build, step_fn
from bench.timing import interleaved, ratio


def _build_with_conditional_block(hidden: int):
    import paddle_amp.ir.legacy.skip as skip

    foldable = skip.FOLDABLE
    skip.FOLDABLE = frozenset()  # no fold: the skip table sends the SGD ops to the guard
    try:
        return build("paddle_amp", hidden, "sgd")
    finally:
        skip.FOLDABLE = foldable


def run(steps: int = 600, hiddens=(64, 256)) -> str:
    import paddle

    paddle.enable_static()
    rows = []
    for hidden in hiddens:
        stats = interleaved({"plain": step_fn(build("plain", hidden, "sgd")),
                             "native": step_fn(build("native", hidden, "sgd")),
                             "folded": step_fn(build("paddle_amp", hidden, "sgd")),
                             "conditional_block": step_fn(_build_with_conditional_block(hidden))},
                            steps=steps)
        rows.append(f"| {hidden} | {ratio(stats, 'native', 'plain')} | "
                    f"{ratio(stats, 'folded', 'plain')} | "
                    f"{ratio(stats, 'conditional_block', 'plain')} |")
        print("  " + rows[-1], flush=True)
    paddle.disable_static()
    return "\n".join([
        "## Figure: Paddle SGD's true skip, folded vs `conditional_block`", "",
        f"Paddle {paddle.__version__}, CPU, MLP hidden-hidden-hidden-10, batch 64, SGD, O1 fp16 "
        "dynamic scaling; step time over plain fp32, all four interleaved. Both skips are "
        "bit-exact (tests/paddle/test_paddle_skip_fold.py, test_paddle_scaling.py); the folded "
        "one ships.", "",
        "| hidden | native (no true skip) | paddle_amp, folded skip | paddle_amp, "
        "`conditional_block` skip |", "| --- | --- | --- | --- |", *rows])


if __name__ == "__main__":
    print(run())
