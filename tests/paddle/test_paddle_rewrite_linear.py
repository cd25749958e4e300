"""The rewrite's walk is linear in the program: its work per op does not grow with the
program (issue 31: a warm profile costs nothing measurable in ``minimize``).

Work is counted, never timed: the calls the rewrite makes to the program IR's ``key``
(every cast cache lookup goes through it) on a stack of 8 and of 32 Dense+LayerNorm
layers under emulated fp16 (every fc gets casts, each one cached). Dropping stale casts
scanned every cache per op, so 4x the layers made about 12x the calls.
"""
import importlib

import pytest

paddle = pytest.importorskip("paddle")

import paddle_amp  # noqa: E402
from amp_adapters import Policy  # noqa: E402
from amp_adapters.rules.device import DeviceProfile  # noqa: E402
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
            report = Rewriter(policy, DeviceProfile(None)).rewrite(main)
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



class _Counted:
    """A PIR block whose op listings are counted, op by op (the rest passes through)."""

    def __init__(self, block, count: list) -> None:
        self._block, self._count = block, count

    def __getattr__(self, name):
        found = getattr(self._block, name)
        if name == "ops":
            self._count[0] += len(found)
        return found


def _ops_visited(layers: int, monkeypatch) -> int:
    """How many ops O2's rewrite visits listing the program (legacy: asking whether an op
    is a forward one; PIR: listing the global block), on a stack whose every layer
    reshapes (an op that only moves values: O2 asks for its readers, ``result_uses``)."""
    main, startup = paddle.static.Program(), paddle.static.Program()
    with paddle.static.program_guard(main, startup):
        h = x = paddle.static.data("x", [None, 16], "float32")
        for _ in range(layers):
            h = paddle.reshape(paddle.static.nn.fc(h, 16), [-1, 4, 4])
            h = paddle.reshape(paddle.nn.functional.layer_norm(h, [4, 4]), [-1, 16])
        paddle.mean(h - x)
    ir = paddle_amp.ir.of(main)
    count = [0]
    with monkeypatch.context() as patch:
        if ir.name == "pir":
            patch.setattr(type(ir), "block", property(
                lambda self: _Counted(self.program.global_block(), count)))
        else:
            module = importlib.import_module("paddle_amp.ir.legacy.values")  # the walk's
            real = module.is_forward

            def is_forward(op):
                count[0] += 1
                return real(op)
            patch.setattr(module, "is_forward", is_forward)
        with paddle.static.program_guard(main):
            report = Rewriter(Policy.preset("O2"), DeviceProfile(None)).rewrite(main)
    assert sum(d.op == "reshape2" for d in report.decisions) == 2 * layers
    return count[0]


def test_o2_readers_are_mapped_once_per_walk(static, monkeypatch):
    # each reshape asks for its readers: the program is listed once per walk, not once
    # per question (4x the layers: about 16x the ops visited when it was)
    small, large = _ops_visited(4, monkeypatch), _ops_visited(16, monkeypatch)
    assert small > 0
    assert large <= 4 * small * 1.15, (small, large)
