"""O2 on a Transformer's attention on a CPU: reshape, transpose and scale follow their data.

``fc -> reshape2 -> transpose2 (-> scale) -> matmul -> softmax``: on this CPU fc, matmul
and softmax have no float16 kernel and run in float32. The ops that only move values
(reshape2, transpose2) are lowered only where a reader of theirs computes in float16; and
so is ``scale``, which has a CPU kernel but sits between float32 ops (issue 38, point 8):
every one of them follows its float32 data, with no cast down and back. The native's O2
runs the program (legacy IR) and inserts no cast on a CPU.
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
    moves = [d for d in decisions if d.op in ("reshape2", "transpose2", "scale")]
    # nothing computes in float16 here, so nothing moves float16 values, and the scale
    # between float32 ops follows them (it was lowered with q's moves: 4 casts): as natively
    assert low == [] and our_casts == native_casts == 0
    assert ours == native  # the same float32 numerics, bit for bit
    # every move (q, k, v, the output's, and on PIR the ones cross_entropy builds) and the
    # scale follow their float32 data
    assert len(moves) >= 6 + scaled
    assert all(d.run_dtype == "float32" and "follows its data" in d.reason for d in moves)
    assert np.allclose(plain, native, rtol=1e-5)


def _scores_casts(program, op_type: str, low: str) -> int:
    """Casts around the forward ``op_type`` op of ``program``: a cast to ``low`` feeding it,
    or any cast reading its result (not an emulated producer's round trip, which ends in
    float32 and is that op's)."""
    if is_pir(program):
        from paddle_helpers import pir_ops
        from paddle_amp.ir.pir.values import value_dtype
        op = pir_ops(program, op_type)[0]  # the forward one: the backward comes after
        src = op.operand_source(0).get_defining_op()
        into = src is not None and src.name() == "pd_op.cast" and \
            value_dtype(src.result(0)) == low
        return into + sum(r.name() == "pd_op.cast" for r in op.result(0).all_used_ops())
    from paddle_amp.ir import of
    ir, ops = of(program), program.global_block().ops
    op = next(o for o in ops if o.type == op_type)
    ins, outs = set(op.input_arg_names), set(op.output_arg_names)
    return sum(o.type == "cast" and bool(
        (set(o.output_arg_names) & ins and ir.dtype(o.output_arg_names[0]) == low) or
        set(o.input_arg_names) & outs) for o in ops)


def test_o2_fp16_emulated_the_scores_scale_between_float32_ops_has_no_cast(static):
    """``matmul -> scale -> softmax`` (the reference transformer's scores) under O2 fp16
    emulated: the GEMM is emulated (float32 values rounded through float16), softmax is
    fp32, and the scale, which has a CPU float16 kernel, runs float32 between them: no
    cast around it in the program, as natively (issue 38, point 8)."""
    from amp_adapters import Policy
    x = paddle.static.data("x", [None, SEQ, DIM], "float32")
    q, k = (paddle.static.nn.fc(x, DIM, num_flatten_dims=2) for _ in range(2))
    w = paddle.nn.functional.softmax(paddle.scale(_matmul(q, k, transpose_y=True), DIM ** -0.5))
    loss = paddle.mean(paddle.static.nn.fc(w, 3, num_flatten_dims=2))
    opt = paddle_amp.decorate(paddle.optimizer.SGD(0.1),
                              policy=Policy.preset("O2", emulate=True))
    opt.minimize(loss)
    d = {x.op: x for x in opt.cast_report().decisions}
    assert d["matmul_v2"].emulated and d["softmax"].run_dtype == "float32"
    assert (d["scale"].run_dtype, d["scale"].emulated, d["scale"].num_casts) == \
        ("float32", False, 0)
    assert _scores_casts(static.main, "scale", "float16") == 0
    static.exe.run(static.startup)
    opt.amp_init(paddle.CPUPlace())
    feed = {"x": np.random.RandomState(0).rand(3, SEQ, DIM).astype("float32")}
    assert np.isfinite(static.run(feed, [loss])[0]).all()
