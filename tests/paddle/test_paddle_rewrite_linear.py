"""The rewrite's walk is linear in the program: its work per op does not grow with the
program (issue 31: a warm profile costs nothing measurable in ``minimize``).

Work is counted, never timed: the calls the rewrite makes to the program IR's ``key``
(every cast cache lookup goes through it) on a stack of 8 and of 32 Dense+LayerNorm
layers under emulated fp16 (every fc gets casts, each one cached). Dropping stale casts
scanned every cache per op, so 4x the layers made about 12x the calls.
"""
import pytest

paddle = pytest.importorskip("paddle")

import paddle_amp  # noqa: E402
from amp_adapters import Policy  # noqa: E402
from paddle_amp.rewrite import Rewriter  # noqa: E402


def _stack(layers: int):
    main, startup = paddle.static.Program(), paddle.static.Program()
    with paddle.static.program_guard(main, startup):
        h = x = paddle.static.data("x", [None, 16], "float32")
        for _ in range(layers):
            h = paddle.static.nn.fc(h, 16)
            h = paddle.nn.functional.layer_norm(h, 16)
        paddle.mean(h - x)
    return main


def _key_calls(layers: int, policy: Policy) -> tuple[int, int]:
    """(calls to the IR's ``key`` during one rewrite, forward ops decided)."""
    main = _stack(layers)
    ir = paddle_amp.ir.of(main)
    real, calls = ir.key, [0]

    def key(value):
        calls[0] += 1
        return real(value)

    ir.key = key  # this program's IR object only (``ir.of`` returns the same one)
    try:
        with paddle.static.program_guard(main):
            report = Rewriter(policy, None).rewrite(main)
    finally:
        del ir.key
    return calls[0], len(report.decisions)


@pytest.mark.parametrize("preset", ["O1", "O2"])
def test_cast_cache_work_per_op_does_not_grow(static, preset):
    policy = Policy.preset(preset, emulate=True)
    small, small_ops = _key_calls(8, policy)
    large, large_ops = _key_calls(32, policy)
    assert large_ops > 3.7 * small_ops  # (the loss's two ops come once)
    assert small > 0
    # linear: 4x the ops, at most 4x the calls (and a little slack for the ends)
    assert large <= 4 * small * 1.15, (small, large)
