"""bf16 as a drop-in (issue 32, points 2, 3, 5): what a run fetches is a float, the user's
custom lists hold at every level and entry point, and pure bf16 lowers what the native's
``cast_model_to_bf16`` lowers (a shared embedding table), each next to the native where it
runs here (legacy IR only: the native has no PIR branch).

A case that needs a bf16 kernel this CPU lacks skips, naming it (the kernels' probe).
"""
import numpy as np
import paddle
import pytest

import paddle_amp
from paddle_amp import ir, kernels
from paddle_amp.bf16 import AutoMixedPrecisionListsBF16, decorate_bf16
from paddle_helpers import Static, is_pir

BF16 = "bfloat16"


def _needs_kernels(program, *ops):
    """Skip unless this CPU has a bf16 kernel for each of ``ops`` (in ``program``'s IR)."""
    have = kernels.lowp_kernels("CPU", BF16, ir.of(program).probe)
    missing = sorted(op for op in ops if op not in have)
    if missing:
        pytest.skip(f"this CPU runs no bf16 kernel for {missing} (the kernels' probe): "
                    f"nothing would run in bf16")


ENTRIES = {
    "decorate-O2": lambda opt: paddle_amp.decorate(opt, level="O2", dtype=BF16),
    "decorate-O1": lambda opt: paddle_amp.decorate(opt, level="O1", dtype=BF16),
    "pure-bf16": lambda opt: decorate_bf16(opt, use_pure_bf16=True, use_bf16_guard=False),
    "decorate_bf16": lambda opt: decorate_bf16(opt),
    "policy-O2-bf16": lambda opt: paddle_amp.decorate(opt, policy="O2-bf16"),
}
NATIVE = {  # the same entry points, natively
    "decorate-O2": lambda opt: paddle.static.amp.decorate(opt, level="O2", dtype=BF16),
    "decorate-O1": lambda opt: paddle.static.amp.decorate(opt, level="O1", dtype=BF16),
    "pure-bf16": lambda opt: paddle.static.amp.bf16.decorate_bf16(
        opt, use_pure_bf16=True, use_bf16_guard=False),
    "decorate_bf16": lambda opt: paddle.static.amp.bf16.decorate_bf16(opt),
}


def _softmax_model():
    """The issue's conv2d -> softmax -> mean, and a second output no op reads (``side``)."""
    x = paddle.static.data("x", [None, 2, 8, 8], "float32")
    s = paddle.nn.functional.softmax(paddle.nn.Conv2D(2, 4, 3)(x))
    return paddle.mean(s), paddle.scale(s, 2.0)


def _train(decorate, steps=2):
    """(fetched [loss, side, scaled loss] per step, the optimizer) in fresh programs."""
    st = Static.new()
    with paddle.static.program_guard(st.main, st.startup), \
            paddle.static.scope_guard(st.scope), paddle.utils.unique_name.guard():
        loss, side = _softmax_model()
        opt = paddle.optimizer.AdamW(0.01)
        opt = decorate(opt) if decorate else opt
        opt.minimize(loss)
        st.exe.run(st.startup)
        if decorate:
            opt.amp_init(paddle.CPUPlace())
        scaled = getattr(opt, "get_scaled_loss", None)  # (the native bf16 has none)
        fetch = [loss, side] + ([scaled()] if decorate and scaled else [])
        rng = np.random.RandomState(0)
        out = [st.run({"x": rng.rand(2, 2, 8, 8).astype("float32")}, fetch)
               for _ in range(steps)]
        return out, opt, st


@pytest.mark.parametrize("entry", sorted(ENTRIES))
def test_a_fetched_loss_and_output_are_floats_in_every_bf16_entry(static, entry):
    """The loss (and the scaled loss, and an output no op reads) fetched after a bf16 run
    are float32 values close to float32's, never the raw bf16 bits (0.1 as 15821.0) the
    uint16 of a bf16 tensor is. Natively (legacy IR) decorate gives floats; pure bf16
    there fails on its first feed (it retypes the data var to bf16)."""
    _needs_kernels(static.main, "mean", "scale")
    ref, _, _ = _train(None)
    got, opt, st = _train(ENTRIES[entry])
    for step, values in enumerate(got):
        for v in values:
            assert np.asarray(v).dtype == np.float32, (entry, step, np.asarray(v).dtype)
        np.testing.assert_allclose(values[0], ref[step][0], rtol=2 ** -6)
        np.testing.assert_allclose(values[2], values[0])  # bf16 scales nothing
        np.testing.assert_allclose(values[1], ref[step][1], rtol=2 ** -6, atol=2 ** -7)
    outputs = [d for d in opt.cast_report().decisions if "program output" in d.reason]
    assert {d.op for d in outputs} >= {"scale"} and all(
        d.run_dtype == "float32" for d in outputs)
    if is_pir(static.main) or entry not in NATIVE:
        return
    if entry == "pure-bf16":
        with pytest.raises(ValueError, match="uint16"):
            _train(NATIVE[entry])
        return
    try:
        native, _, _ = _train(NATIVE[entry])
    except (RuntimeError, ValueError) as e:  # the native bf16 O1 fails on this model here
        assert "bfloat16" in str(e)  # (2.6.2: no oneDNN bf16 conv for this CPU; 3.3.1: its
        return                       # conv's bias add reads bf16 data as float32)
    for step, values in enumerate(native):
        assert np.asarray(values[0]).dtype == np.float32
        np.testing.assert_allclose(got[step][0], values[0], rtol=2 ** -6)


def _custom_model():
    """fc -> relu -> reduce_mean (mid-graph, not the loss) -> sub -> fc -> sigmoid -> mean
    (the builders both IRs of Paddle 3.3.1 take)."""
    x = paddle.static.data("x", [None, 8], "float32")
    h = paddle.nn.functional.relu(paddle.nn.Linear(8, 16)(x))
    m = paddle.mean(h, axis=1, keepdim=True)
    return paddle.mean(paddle.static.nn.fc(h - m, 4, activation="sigmoid"))


def _fp16_style(**custom):
    return paddle_amp.AutoMixedPrecisionLists(dtype=BF16, **custom)


CUSTOM = [  # (id, decorate, the op, the category the user asked for)
    ("pure-custom_fp32", lambda o: decorate_bf16(
        o, AutoMixedPrecisionListsBF16(custom_fp32_list={"reduce_mean"}), use_pure_bf16=True,
        use_bf16_guard=False), "reduce_mean", "fp32"),
    ("decorate_bf16-custom_fp32", lambda o: decorate_bf16(
        o, AutoMixedPrecisionListsBF16(custom_fp32_list={"reduce_mean"})), "reduce_mean",
     "fp32"),
    ("O2-bf16lists-custom_fp32", lambda o: paddle_amp.decorate(
        o, AutoMixedPrecisionListsBF16(custom_fp32_list={"reduce_mean"}), level="O2",
        dtype=BF16), "reduce_mean", "fp32"),
    ("O2-custom_black", lambda o: paddle_amp.decorate(
        o, _fp16_style(custom_black_list={"reduce_mean"}), level="O2", dtype=BF16),
     "reduce_mean", "fp32"),
    ("O1-custom_black", lambda o: paddle_amp.decorate(
        o, _fp16_style(custom_black_list={"reduce_mean"}), level="O1", dtype=BF16),
     "reduce_mean", "fp32"),
    ("pure-custom_bf16", lambda o: decorate_bf16(
        o, AutoMixedPrecisionListsBF16(custom_bf16_list={"sigmoid"}), use_pure_bf16=True,
        use_bf16_guard=False), "sigmoid", "lower"),
    ("decorate_bf16-custom_bf16", lambda o: decorate_bf16(
        o, AutoMixedPrecisionListsBF16(custom_bf16_list={"sigmoid"})), "sigmoid", "lower"),
    ("O1-custom_white", lambda o: paddle_amp.decorate(
        o, _fp16_style(custom_white_list={"sigmoid"}), level="O1", dtype=BF16),
     "sigmoid", "lower"),
    ("O2-custom_white", lambda o: paddle_amp.decorate(
        o, _fp16_style(custom_white_list={"sigmoid"}), level="O2", dtype=BF16),
     "sigmoid", "lower"),
]


@pytest.mark.parametrize("decorate,op,category", [c[1:] for c in CUSTOM],
                         ids=[c[0] for c in CUSTOM])
def test_every_custom_list_entry_holds_at_every_level(static, decorate, op, category):
    """A custom fp32/black op already in a default fp32 list (reduce_mean) stayed fp32 at
    O1 but O2 lowered it; now it holds everywhere, and a custom bf16/white op is lowered."""
    loss = _custom_model()
    opt = decorate(paddle.optimizer.SGD(0.05))
    opt.minimize(loss)
    mine = [d for d in opt.cast_report().decisions
            if d.op == op and "program output" not in d.reason]
    assert mine, op
    for d in mine:
        assert d.category == category, d
        if category == "fp32":
            assert d.run_dtype == "float32", d


@pytest.mark.legacy_ir
def test_pure_bf16_keeps_the_users_fp32_op_as_the_native_does(static):
    """Natively ``cast_model_to_bf16`` keeps a custom fp32 op in float32 (its output stays
    fp32), on the same program; so does ours."""
    _custom_model()
    native = static.main.clone()
    lists = AutoMixedPrecisionListsBF16(custom_fp32_list={"reduce_mean"})
    paddle.static.amp.bf16.cast_model_to_bf16(
        native, amp_lists=paddle.static.amp.bf16.AutoMixedPrecisionListsBF16(
            custom_fp32_list={"reduce_mean"}), use_bf16_guard=False)
    paddle_amp.bf16.cast_model_to_bf16(static.main, amp_lists=lists, use_bf16_guard=False)
    for program in (native, static.main):
        block = program.global_block()
        means = [op for op in block.ops if op.type == "reduce_mean"]
        mid = means[0]  # the first: mid-graph (the second writes the loss)
        assert block.var(mid.output("Out")[0]).dtype == paddle.float32


def _shared_embedding():
    """ids -> embedding -> logits against the same table (tied weights) -> mean."""
    ids = paddle.static.data("ids", [None, 4], "int64")
    emb = paddle.nn.Embedding(16, 8)
    h = paddle.reshape(emb(ids), [-1, 8])  # rank 2, as the table (no broadcast gradient)
    logits = paddle.nn.functional.linear(h, paddle.transpose(emb.weight, [1, 0]))
    return paddle.mean(paddle.nn.functional.relu(logits)), emb.weight.name


def test_pure_bf16_lowers_a_shared_embedding_table_as_the_native(static):
    """Pure bf16 keeps in fp32 only its fp32 list and ops without a kernel: the native
    ``cast_model_to_bf16`` makes ``lookup_table_v2`` and its table bf16 (where it has the
    kernel); ours kept them fp32 by the fp16 decorator's O2 list. ``decorate(level="O2")``
    keeps that list, as natively."""
    _needs_kernels(static.main, "lookup_table_v2", "matmul_v2")
    loss, table = _shared_embedding()
    if not is_pir(static.main):  # the native, on a copy of the same program
        native = static.main.clone()
        low = paddle.static.amp.bf16.cast_model_to_bf16(native, use_bf16_guard=False)
        assert table in low
        lookup = next(op for op in native.global_block().ops if op.type == "lookup_table_v2")
        assert native.global_block().var(lookup.output("Out")[0]).dtype == paddle.bfloat16
    opt = decorate_bf16(paddle.optimizer.SGD(0.05), use_pure_bf16=True, use_bf16_guard=False)
    opt.minimize(loss)
    assert table in opt.param_plan().low, opt.param_plan().format()
    lookup = [d for d in opt.cast_report().decisions if d.op == "lookup_table_v2"]
    assert lookup and all(d.run_dtype == BF16 for d in lookup), lookup
    assert "stay fp32" not in lookup[0].reason


def test_o2_decorate_keeps_the_embedding_table_fp32_as_the_native_o2_list(static):
    loss, table = _shared_embedding()
    opt = paddle_amp.decorate(paddle.optimizer.SGD(0.05), level="O2", dtype=BF16)
    opt.minimize(loss)
    assert table not in opt.param_plan().low
