"""Emulation keeps no second copy per value in a static program (issue 40, point 4), both
IRs: a value read by several emulated ops (an activation read by q, k and v; a weight read
by USES matmuls) is rounded through float16 once, and a value an emulated op already
rounded is not rounded again. Counted from the program's cast ops and their shapes, never
from measured memory. Planned as on a device with no float16 kernel (DeviceProfile(
frozenset())): emulation, whatever the CPU."""
import paddle

from amp_adapters import Policy
from amp_adapters.rules.device import DeviceProfile
from paddle_amp.rewrite import Rewriter
from paddle_helpers import is_pir

UNITS, USES = 16, 4


def model():
    """h = relu(inner(x)) read by three projections; one Linear applied USES times."""
    x = paddle.static.data("x", [None, UNITS], "float32")
    h = paddle.nn.functional.relu(paddle.nn.Linear(UNITS, UNITS)(x))
    heads = [paddle.nn.Linear(UNITS, UNITS)(h) for _ in range(3)]
    tied = paddle.nn.Linear(UNITS, UNITS)
    out = heads[0] + heads[1] + heads[2]
    for _ in range(USES):
        out = tied(out)
    return paddle.mean(out)


def _roundings(program):
    """(the value each float32 -> float16 cast reads, its output's element count)."""
    block = program.global_block()
    if is_pir(program):
        return [(op.operand_source(0).id, op.result(0).shape) for op in block.ops
                if op.name() == "pd_op.cast" and op.result(0).dtype == paddle.float16]
    return [(op.input("X")[0], block.var(op.output("Out")[0]).shape) for op in block.ops
            if op.type == "cast" and block.var(op.output("Out")[0]).dtype == paddle.float16]


def test_each_value_is_rounded_once_however_many_ops_read_it(static):
    model()
    Rewriter(Policy.preset("O1", emulate=True), DeviceProfile(frozenset())).rewrite(static.main)
    got = _roundings(static.main)
    sources = [s for s, _ in got]
    assert got and len(sources) == len(set(sources)), sources  # no value rounded twice
    # the sized roundings are the weights' (the bias adds are not emulated): each of the 5
    # weights once, the tied one too: 5 x UNITS x UNITS float16 elements per step
    sized = [tuple(shape) for _, shape in got if -1 not in shape]
    assert sized == [(UNITS, UNITS)] * 5
