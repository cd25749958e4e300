"""O2 on a Transformer's attention on a CPU: reshape and transpose follow their data.

``fc -> reshape2 -> transpose2 (-> scale) -> matmul -> softmax``: on this CPU fc, matmul
and softmax have no float16 kernel and run in float32. The ops that only move values
(reshape2, transpose2) are lowered only where a reader of theirs computes in float16
(here: ``scale``, which has a CPU kernel and is arithmetic in Paddle's lists, so O2 lowers
it as natively); elsewhere they follow their float32 data, with no cast down and back.
The native's O2 runs the program (legacy IR) and inserts no cast on a CPU.
"""
import numpy as np
import paddle
import pytest

import paddle_amp
from paddle_helpers import Static, is_pir

HEADS, DIM, SEQ = 2, 8, 4


def _matmul(a, b, transpose_y=False):
    """``paddle.matmul``; on Paddle 3's legacy IR (where ``paddle.matmul`` builds a PIR op and
    fails on a Variable) the same ``matmul_v2`` op, appended by hand."""
    if paddle.framework.in_pir_mode() or int(paddle.__version__.split(".")[0]) < 3:
        return paddle.matmul(a, b, transpose_y=transpose_y)
    helper = paddle.base.layer_helper.LayerHelper("matmul_v2")
    out = helper.create_variable_for_type_inference(a.dtype)
    helper.append_op(type="matmul_v2", inputs={"X": a, "Y": b}, outputs={"Out": out},
                     attrs={"trans_x": False, "trans_y": transpose_y})
    return out


def _attention(scaled: bool):
    x = paddle.static.data("x", [None, SEQ, DIM], "float32")
    y = paddle.static.data("y", [None, SEQ], "int64")

    def heads():
        h = paddle.static.nn.fc(x, DIM, num_flatten_dims=2)
        return paddle.transpose(paddle.reshape(h, [0, 0, HEADS, DIM // HEADS]), [0, 2, 1, 3])

    q, k, v = heads(), heads(), heads()
    if scaled:
        q = paddle.scale(q, (DIM // HEADS) ** -0.5)
    w = paddle.nn.functional.softmax(_matmul(q, k, transpose_y=True))
    o = paddle.transpose(_matmul(w, v), [0, 2, 1, 3])
    logits = paddle.static.nn.fc(paddle.reshape(o, [0, 0, DIM]), 5, num_flatten_dims=2)
    return paddle.mean(paddle.nn.functional.cross_entropy(logits, paddle.unsqueeze(y, -1)))


_OPTIMIZE = int(paddle.base.core.op_proto_and_checker_maker.OpRole.Optimize)


def _casts(program, opt) -> int:
    """The cast ops of the forward and backward passes: on the legacy IR by op role (the
    loss scaling's flag cast is an optimizer op); under PIR, the forward's (its backward
    holds the gradient of each, a cast back)."""
    if is_pir(program):
        return 2 * opt.cast_report().graph_casts.total if opt is not None else 0
    return sum(op.type == "cast" and not op.attr("op_role") & _OPTIMIZE
               for op in program.global_block().ops)


def _train(amp, scaled: bool, steps: int = 3):
    """(losses, cast ops in the trained program, the decorated optimizer or None)."""
    env = Static.new(seed=3)
    rng = np.random.RandomState(0)
    feed = {"x": rng.rand(3, SEQ, DIM).astype("float32"),
            "y": rng.randint(0, 5, (3, SEQ)).astype("int64")}
    with paddle.static.program_guard(env.main, env.startup), \
            paddle.static.scope_guard(env.scope), paddle.base.unique_name.guard():
        loss = _attention(scaled)
        opt = paddle.optimizer.SGD(0.1)
        if amp is not None:
            opt = amp.decorate(opt, use_pure_fp16=True, use_fp16_guard=False,
                               init_loss_scaling=1.0)
        opt.minimize(loss)
        env.exe.run(env.startup)
        if amp is not None:
            opt.amp_init(paddle.CPUPlace())
        losses = [float(np.asarray(env.run(feed, [loss])[0])) for _ in range(steps)]
    opt = opt if amp is not None else None
    return losses, _casts(env.main, opt), opt


@pytest.mark.parametrize("scaled", [False, True], ids=["unscaled", "scaled-q"])
def test_o2_attention_moves_no_float32_data_through_float16(static, scaled):
    ours, our_casts, opt = _train(paddle_amp, scaled)
    plain, plain_casts, _ = _train(None, scaled)
    if not is_pir(paddle.static.default_main_program()):
        native, native_casts, _ = _train(paddle.static.amp, scaled)
        assert native_casts == 0  # the native's O2 on a CPU: everything float32
    else:  # the native's decorate builds no cast under PIR (and no loss scaling)
        native, native_casts = plain, plain_casts
    decisions = opt.cast_report().decisions
    low = [d.op for d in decisions if d.run_dtype == "float16"]
    moves = [d for d in decisions if d.op in ("reshape2", "transpose2")]
    if not scaled:
        # nothing computes in float16 here, so nothing moves float16 values: as natively
        assert low == [] and our_casts == native_casts == 0
        assert ours == native  # the same float32 numerics, bit for bit
    else:
        # scale runs low (arithmetic, with a CPU kernel), and so does what feeds only it:
        # q's reshape2 and transpose2; k's and v's stay float32, and so do the output's
        assert sorted(low) == ["reshape2", "scale", "transpose2"]
        assert our_casts == 4  # q down, its scaled value up, and their gradients
        assert np.allclose(ours, native, rtol=1e-5) and ours != native
    follow = [d for d in moves if d.run_dtype == "float32"]
    # q's pair feeds scale; every other move (k, v, the output's, and on PIR the ones
    # cross_entropy builds) follows its float32 data
    assert len(moves) - len(follow) == (2 if scaled else 0) and len(follow) >= 6
    assert all("follows its data" in d.reason for d in follow)
    assert np.allclose(plain, native, rtol=1e-5)
