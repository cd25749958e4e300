"""A Paddle parameter read by N ops of one static program is cast once per program (so once
per step), on both IRs: the rewrite keeps one cast per (value, dtype). The MXNet twin, where
an imperative forward needed its own cache, is tests/mxnet/test_reused_weight.py. Counted from
the program's cast ops and their shapes, never from measured memory."""
import paddle

from amp_adapters import Policy
from amp_adapters.rules.device import DeviceProfile
from paddle_amp import ir
from paddle_amp.rewrite import Rewriter
from paddle_helpers import is_pir

UNITS, USES = 16, 4


def tied_linear():
    """One Linear applied ``USES`` times (tied weights)."""
    x = paddle.static.data("x", [None, UNITS], "float32")
    dense = paddle.nn.Linear(UNITS, UNITS)
    h = x
    for _ in range(USES):
        h = paddle.nn.functional.relu(dense(h))
    return paddle.mean(h)


def _weight_casts(program):
    """The cast ops whose input is a parameter, by parameter; and each cast's output shape."""
    block = program.global_block()
    if is_pir(program):
        params = {op.result(0).id: op.result(0) for op in block.ops
                  if op.name() == "builtin.parameter"}
        found = [(op.operand_source(0).id, tuple(op.result(0).shape)) for op in block.ops
                 if op.name() == "pd_op.cast" and op.operand_source(0).id in params]
    else:
        params = {p.name for p in block.all_parameters()}
        found = [(op.input("X")[0], tuple(block.var(op.output("Out")[0]).shape))
                 for op in block.ops if op.type == "cast" and op.input("X")[0] in params]
    per: dict = {}
    for name, shape in found:
        per.setdefault(name, []).append(shape)
    return per


def test_a_weight_read_by_n_ops_is_cast_once_per_program(static):
    """Planned as on a device with every float16 kernel (DeviceProfile(None)): the Linear's
    weight and bias, read by USES matmuls and adds, get one cast each."""
    tied_linear()
    Rewriter(Policy.preset("O1"), DeviceProfile(None)).rewrite(static.main)
    per = _weight_casts(static.main)
    assert len(per) == 2, per  # the weight and the bias were cast
    assert all(len(shapes) == 1 for shapes in per.values()), per
    assert sorted(s for shapes in per.values() for s in shapes) == [(UNITS,), (UNITS, UNITS)]



def test_the_cast_report_counts_the_bytes_its_casts_write_per_step(static):
    """The weight's and bias's casts have their size (float16: 2 bytes an element); the
    activations' wait for the batch (their first dimension is -1 until fed)."""
    tied_linear()
    Rewriter(Policy.preset("O1"), DeviceProfile(None)).rewrite(static.main)
    got = ir.of(static.main).graph_casts()
    assert got.nbytes == 2 * (UNITS * UNITS + UNITS)
    assert got.unsized == got.total - 2 and got.unsized >= 1
    assert "MiB" in got.bytes_line() or "bytes written by them per step" in got.bytes_line()
