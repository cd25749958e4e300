"""The PIR rewrite itself: casts, combine and attribute operands, emulation, control flow,
guards, names, evaluation programs, O2 (AMP_TEST_IR=pir). These are also the PIR twins of
the tests marked ``legacy_ir``, which inspect legacy op types and var names."""
import numpy as np
import paddle
import pytest

import paddle_amp
from amp_adapters import AmpConfigError, OpLists, Policy
from amp_adapters.rules.device import DeviceProfile
from paddle_amp import kernels
from paddle_amp.rewrite import Rewriter
from paddle_helpers import batch, mlp, pir_mode
from pir_testutil import built, by_position, casts, layernorm_model, natural, white_list_model

pytestmark = pytest.mark.skipif(not pir_mode(), reason="PIR programs: AMP_TEST_IR=pir on "
                                                       "Paddle 3 (make test-paddle3)")


def test_white_list_inserts_casts_retypes_concat_and_trains(static):
    loss = white_list_model()
    lists = paddle_amp.AutoMixedPrecisionLists(custom_white_list=["scale", "concat"])
    opt = paddle_amp.decorate(paddle.optimizer.SGD(0.1), lists)
    _, params_grads = opt.minimize(loss)
    report = {d.op: d for d in opt.cast_report().decisions}
    assert report["scale"].run_dtype == report["concat"].run_dtype == "float16"
    assert report["matmul_v2"].run_dtype == "float32"
    ops = static.main.global_block().ops
    at = [i for i, op in enumerate(ops) if op.name() == "pd_op.concat"][0]
    concat = ops[at]
    assert str(concat.result(0).dtype) == "paddle.float16"
    assert str(concat.operand_source(0).type()).count("f16") == 2  # the combined operand
    forward = [op for op in ops[:at] if op.name() == "pd_op.cast"]
    sources = [op.operand_source(0).id for op in forward]
    assert forward and len(sources) == len(set(sources))  # one cast per (value, dtype)
    static.exe.run(static.startup)
    opt.amp_init(paddle.CPUPlace())
    losses = [float(static.run(batch(i % 2), [loss])[0]) for i in range(30)]
    assert np.all(np.isfinite(losses)) and losses[-1] < losses[0]


def test_attribute_operands_are_never_cast(static):
    """scale's factor, mean's axis, reshape's shape are operands under PIR: never cast, even
    when every op runs low (planned as on a GPU; a GEMM reads what they compute, so O2
    lowers them)."""
    x = paddle.static.data("x", [4, 8], "float32")
    h = paddle.reshape(paddle.scale(x, paddle.full([1], 2.0)), [8, 4])
    paddle.mean(paddle.matmul(h, h, transpose_x=True), axis=0)
    report = Rewriter(Policy.preset("O2"), DeviceProfile(None)).rewrite(static.main)
    scale = [d for d in report.decisions if d.op == "scale"][0]
    assert scale.run_dtype == "float16" and scale.input_dtypes == ("float32", None)
    for op in casts(static.main):
        assert op.operand_source(0).get_defining_op().name() not in (
            "pd_op.full", "pd_op.full_int_array")


@pytest.mark.parametrize("emulate", [False, True])
def test_rewrite_adds_nothing_butcasts(static, emulate):
    """Value pitfalls (``==`` on values builds ops, wrappers differ): the rewrite adds casts
    only, as many as it planned, plus two per emulated result, and erases its probes."""
    x = paddle.static.data("x", [4, 8], "float32")
    h = paddle.scale(paddle.static.nn.fc(x, 8), 2.0)
    paddle.mean(paddle.concat([h, paddle.nn.functional.relu(h)], axis=1))
    before = [op.name() for op in static.main.global_block().ops]
    policy = Policy.preset("O1", emulate=emulate, paddle_ops=OpLists(lower={"scale", "concat"}))
    report = Rewriter(policy, DeviceProfile(kernels.lowp_kernels("CPU", "float16"))) \
        .rewrite(static.main)
    after = [op.name() for op in static.main.global_block().ops]
    added = list(after)
    for name in before:
        added.remove(name)
    assert set(added) <= {"pd_op.cast"}
    rounded = sum(2 * d.emulated for d in report.decisions)  # one result each here
    assert 0 < len(added) <= report.num_casts + rounded + sum(
        2 * sum(t is not None for t in d.input_dtypes) for d in report.decisions if d.emulated)


def test_emulated_gradients_carry_fp16_rounding(static):
    _, _, loss = mlp()
    opt = paddle_amp.decorate(paddle.optimizer.SGD(0.1), emulate=True,
                              use_dynamic_loss_scaling=False, init_loss_scaling=1.0)
    _, params_grads = opt.minimize(loss)
    mms = [d for d in opt.cast_report().decisions if d.op == "matmul_v2"]
    assert mms and all(d.emulated and d.precision == "float16" for d in mms)
    weight, grad = min(((p, g) for p, g in params_grads if p.name.endswith(".w_0")),
                       key=lambda pg: natural(pg[0].name))  # the first fc's weight
    # the weight is rounded once for the forward matmul
    assert sum(op.operand_source(0).is_same(weight) for op in casts(static.main)) == 1
    static.exe.run(static.startup)
    g, = static.run(batch(0), [grad])
    assert np.any(g != 0) and np.array_equal(g, g.astype(np.float16).astype(np.float32))


def test_control_flow_reads_fp32_copies(static):
    """cond and while_loop blocks run in fp32: a low-precision outer value is cast back."""
    x = paddle.static.data("x", [2, 8], "float32")
    flag = paddle.static.data("flag", [1], "bool")
    h = paddle.scale(paddle.static.nn.fc(x, 8), 2.0)  # fp16 on CPU (white list)
    branch = paddle.static.nn.cond(paddle.reshape(flag, []),
                                   lambda: paddle.nn.functional.relu(h), lambda: h * 0.5)
    i = paddle.full([1], 0, "int64")
    _, looped = paddle.static.nn.while_loop(lambda i, v: i < 3, lambda i, v: (i + 1, v + h),
                                            [i, paddle.zeros([2, 8])])
    lists = paddle_amp.AutoMixedPrecisionLists(custom_white_list=["scale"])
    opt = paddle_amp.decorate(paddle.optimizer.SGD(0.1), lists)
    opt.minimize(paddle.mean(branch) + paddle.mean(looped))
    flow = [d for d in opt.cast_report().decisions if d.op in ("conditional_block", "while")]
    assert {d.op for d in flow} == {"conditional_block", "while"}
    assert all(d.run_dtype == "float32" and "control flow" in d.reason for d in flow)
    assert sum(d.num_casts for d in flow) >= 2
    static.exe.run(static.startup)
    for on in (True, False):
        feed = {"x": np.ones((2, 8), "float32"), "flag": np.array([on])}
        got, loop, hv = static.run(feed, [branch, looped, h])
        hv = hv.astype(np.float32)
        assert np.array_equal(got, np.maximum(hv, 0) if on else hv * 0.5)
        np.testing.assert_allclose(loop, 3 * hv, rtol=1e-6)


def test_fp16_guard_under_pir(static):
    """paddle_amp.fp16_guard records its ops under PIR; the native guard leaves no trace, so
    use_fp16_guard with nothing recorded is an error, never silently unguarded."""
    x = paddle.static.data("x", [None, 8], "float32")
    with paddle_amp.fp16_guard():  # the scale feeds an emulated GEMM: O2 lowers it
        h = paddle.static.nn.fc(paddle.scale(paddle.static.nn.fc(x, 8), 2.0), 8)
    loss = paddle.mean(paddle.scale(h, 3.0))
    opt = paddle_amp.decorate(paddle.optimizer.SGD(0.1), use_pure_fp16=True, emulate=True)
    opt.minimize(loss)
    scales = [d for d in opt.cast_report().decisions if d.op == "scale"]
    assert [s.run_dtype for s in scales] == ["float16", "float32"]
    assert "outside fp16_guard" in scales[1].reason


def test_a_guard_that_recorded_nothing_under_pir_is_a_clear_error(static):
    x = paddle.static.data("x", [None, 8], "float32")
    h = paddle.scale(paddle.static.nn.fc(x, 8), 2.0)
    opt = paddle_amp.decorate(paddle.optimizer.SGD(0.1), use_pure_fp16=True)
    with pytest.raises(AmpConfigError, match="paddle_amp.fp16_guard"):
        opt.minimize(paddle.mean(h))


def test_black_varnames_under_pir(static):
    x = paddle.static.data("x", [None, 8], "float32")
    a = paddle.scale(x, 2.0)
    b = paddle.scale(a, 3.0)
    w = paddle.static.create_parameter([1], "float32")
    loss = paddle.mean(b) + paddle.mean(w * w)
    lists = paddle_amp.AutoMixedPrecisionLists(custom_white_list=["scale"],
                                               custom_black_varnames=["x"])
    opt = paddle_amp.decorate(paddle.optimizer.SGD(0.1), lists)
    opt.minimize(loss)
    scales = [d for d in opt.cast_report().decisions if d.op == "scale"]
    assert [s.run_dtype for s in scales] == ["float32", "float16"]  # the one reading x


def test_black_varnames_naming_an_intermediate_is_an_error(static):
    x = paddle.static.data("x", [None, 8], "float32")
    # (an fc: a loss that reaches no parameter is refused before the lists are read)
    loss = paddle.mean(paddle.scale(paddle.static.nn.fc(x, 4), 2.0))
    lists = paddle_amp.AutoMixedPrecisionLists(custom_white_list=["scale"],
                                               custom_black_varnames=["scale_0.tmp_0"])
    with pytest.raises(AmpConfigError, match="only data, parameters and persistable"):
        paddle_amp.decorate(paddle.optimizer.SGD(0.1), lists).minimize(loss)


def test_clone_is_rewritten_and_a_separate_eval_program_gets_rewritten(static):
    """Under PIR ``clone(for_test=True)`` does not exist: ``main.clone()`` of the decorated
    program carries the rewrite; a separately built one is rewritten by amp_init."""
    x = paddle.static.data("x", [None, 8], "float32")
    out = paddle.scale(paddle.static.nn.fc(x, 4), 2.0)
    separate = static.main.clone()  # before minimize: fp32
    lists = paddle_amp.AutoMixedPrecisionLists(custom_white_list=["scale"])
    opt = paddle_amp.decorate(paddle.optimizer.SGD(0.1), lists)
    opt.minimize(paddle.mean(out))
    static.exe.run(static.startup)
    opt.amp_init(paddle.CPUPlace(), test_program=separate, use_fp16_test=True)
    scale = [d for d in paddle_amp.cast_report(separate).decisions if d.op == "scale"][0]
    assert scale.run_dtype == "float16"
    feed = {"x": np.ones((2, 8), "float32")}
    evaluated, = static.exe.run(separate, feed=feed, fetch_list=[separate.global_block().ops[-1]
                                                                  .result(0)])
    trained, = static.run(feed, [out])
    assert np.array_equal(evaluated.astype(np.float32), trained.astype(np.float32))
    # a clone of the decorated program carries the rewrite: amp_init leaves it alone
    derived = static.main.clone()
    count = len(casts(derived))
    opt.amp_init(paddle.CPUPlace(), test_program=derived, use_fp16_test=True)
    assert len(casts(derived)) == count > 0
    with pytest.raises(ValueError, match="not rewritten by paddle_amp"):
        paddle_amp.cast_report(derived)


def test_o2_with_layer_norm_builds_runs_and_evaluates(static):
    out, loss = layernorm_model()
    evaluate = static.main.clone()  # before minimize: the forward only
    opt = paddle_amp.decorate(paddle.optimizer.Momentum(0.05, multi_precision=True),
                              level="O2", dtype="float16")
    opt.minimize(loss)
    d = {x.op: x for x in opt.cast_report().decisions}
    assert d["layer_norm"].run_dtype == "float32"
    assert d["layer_norm"].input_dtypes.count(None) == 2  # scale, bias: never cast
    # scale has a CPU fp16 kernel, but sits between float32 ops (layer_norm, and a GEMM
    # with no fp16 kernel): it follows them, no cast down and back (issue 38, point 8)
    assert d["scale"].run_dtype == "float32" and "follows its data" in d["scale"].reason
    assert d["matmul_v2"].run_dtype == "float32"  # no CPU fp16 kernel
    static.exe.run(static.startup)
    opt.amp_init(paddle.CPUPlace(), test_program=evaluate)
    assert paddle_amp.cast_report(evaluate).precisions() == opt.cast_report().precisions()
    losses = [float(static.run(batch(i % 3), [loss])[0]) for i in range(20)]
    assert np.all(np.isfinite(losses)) and losses[-1] < losses[0]
    assert not {"pd_op.if", "pd_op.momentum_", "pd_op.check_finite_and_unscale_"} & \
        {op.name() for op in evaluate.global_block().ops}
    fetch = [op for op in evaluate.global_block().ops
             if op.name() == "pd_op.subtract"][0].operand_source(0)  # the model output
    evaluated, = static.exe.run(evaluate, feed=batch(99), fetch_list=[fetch])
    trained, = static.run(batch(99), [out])
    assert np.array_equal(evaluated, trained) and np.all(np.isfinite(evaluated))


def test_o2_declares_low_params_low_and_reads_them_uncast(static):
    """Planned as on a GPU (every kernel exists), O2 declares the weights that every consumer
    reads low in bf16 and reads them without a cast. (Building the optimizer on them needs a
    GPU build here: PIR checks momentum_'s param dtype against the kernels registered, and a
    CPU build registers none in bf16; amp_init's conversion is IR-neutral and tested on the
    legacy IR.)"""
    layernorm_model()
    rewriter = Rewriter(Policy.preset("O2", dtype="bfloat16"), DeviceProfile(None))
    low = rewriter.low_params(static.main, "momentum")
    assert low and all(n.startswith("fc_") for n in low)  # layer_norm's scale/bias stay fp32
    plan = rewriter.param_plan(static.main)  # the core's answer (plan_params), with reasons
    assert plan.low == low and "layer_norm keeps its Scale input in float32" in plan.format()
    assert not Rewriter(rewriter.policy, DeviceProfile(set())).low_params(static.main, "momentum")
    rewriter.set_low_params(static.main, low)
    params = {op.result(0).name: op.result(0) for op in static.main.global_block().ops
              if op.name() == "builtin.parameter"}
    assert {str(params[n].dtype) for n in low} == {"paddle.bfloat16"}
    assert {str(params[n].dtype) for n in set(params) - low} <= {"paddle.float32"}
    rewriter.rewrite(static.main)
    cast_from = {op.operand_source(0).name for op in casts(static.main)
                 if op.operand_source(0).has_name}
    assert not cast_from & low


def test_param_plan_equals_the_legacy_irs_and_a_cond_block_keeps_params_fp32():
    """O2 parameter storage is the core's plan_params on either IR: the same dtypes and
    reasons for the same model; under PIR a weight also read inside a cond block stays fp32
    (the legacy IR's rule: a control-flow block runs in fp32; Paddle 3 builds no legacy cond)."""
    plans = {}
    for ir in ("legacy", "pir"):
        with built(ir) as env:
            layernorm_model()
            plans[ir] = Rewriter(Policy.preset("O2", dtype="bfloat16"),
                                 DeviceProfile(None)).param_plan(env.main)
    assert plans["pir"].low and by_position(plans["pir"].dtypes) == \
        by_position(plans["legacy"].dtypes)  # fc counters differ between the IRs' builders
    ln = [n for n in plans["pir"].dtypes if n.startswith("layer_norm")]  # (legacy fc is mul)
    assert ln and all(plans["pir"].reasons[n] == plans["legacy"].reasons[n] for n in ln)
    with built("pir") as env:
        out, _ = layernorm_model()
        w = paddle.create_parameter([1], "float32", name="in_cond_w")
        flag = paddle.static.data("flag", [1], "bool")
        paddle.static.nn.cond(paddle.reshape(flag, []), lambda: out * w, lambda: out)
        plan = Rewriter(Policy.preset("O2", dtype="bfloat16"),
                           DeviceProfile(None)).param_plan(env.main)
    assert plan.dtypes["in_cond_w"] == "float32" and "control flow" in plan.reasons["in_cond_w"]
    assert len(plan.low) == len(plans["pir"].low)  # the other weights: as without the cond


def test_an_emulated_op_rounds_only_what_the_core_says(static, caplog):
    """An emulated matmul reading a low (fp16) value only casts it up (round_inputs is False:
    the upcast is exact), as the legacy IR does; its fallback notice goes through the shared
    FallbackNotices, with the program summary."""
    x = paddle.static.data("x", [2, 8], "float32")
    y = paddle.static.data("y", [8, 4], "float32")
    paddle.matmul(paddle.scale(x, 2.0), y)
    policy = Policy.preset("O1", emulate=True, paddle_ops=OpLists(lower={"scale"}))
    with caplog.at_level("INFO", logger="paddle_amp"):
        report = Rewriter(policy, DeviceProfile(kernels.lowp_kernels("CPU", "float16"))) \
            .rewrite(static.main)
    mm = {d.op: d for d in report.decisions}["matmul_v2"]
    assert mm.emulated and mm.round_inputs == (False, True)
    op = [o for o in static.main.global_block().ops if o.name() == "pd_op.matmul"][0]
    up = op.operand_source(0).get_defining_op()  # one cast fp16 -> fp32, straight from scale
    assert up.name() == "pd_op.cast" and up.operand_source(0).get_defining_op().name() == \
        "pd_op.scale"
    messages = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("matmul_v2 on this device: ") for m in messages)
    assert any(m.startswith("paddle_amp: program: ") and "EMULATED" in m for m in messages)


def test_conditional_fp32_rules_read_pir_attributes(static):
    """A policy rule on an attribute (softmax over axis -1 in fp32) reads the PIR op's
    attributes: the same decision as the legacy IR's for the same rule."""
    x = paddle.static.data("x", [2, 8], "float32")
    a = paddle.nn.functional.softmax(paddle.scale(x, 2.0), axis=-1)
    b = paddle.nn.functional.softmax(paddle.scale(x, 3.0), axis=0)
    # softmax is lower by its canonical name, the rule on its paddle name (one OpLists may
    # not hold an op both in a list and in conditional_fp32)
    rule = OpLists(lower={"scale"}, conditional_fp32=[("softmax", "axis", ["-1"])])
    policy = Policy.preset("O1", ops=OpLists(lower={"softmax"}), paddle_ops=rule)
    report = Rewriter(policy, DeviceProfile(None)).rewrite(static.main)
    softmax = [d for d in report.decisions if d.op == "softmax"]
    assert [d.run_dtype for d in softmax] == ["float32", "float16"]
    assert "conditional_fp32: axis=-1" in softmax[0].reason


def test_pir_ops_provide_the_whole_vocabulary():
    """The PIR vocabulary is the core's ArrayOps (the step-by-step state-machine tests of
    test_paddle_scaling.py run it under PIR against the core, non-dyadic factors included)."""
    from amp_adapters.rules.loss_scale import ArrayOps
    from paddle_amp.ir.pir.ops import PIR_OPS
    assert isinstance(PIR_OPS, ArrayOps)


def test_results_with_a_dtype_attribute_keep_it(static):
    """PIR does not re-run infer-meta after a retype: a result whose dtype comes from the op's
    ``dtype`` attribute is never retyped, one that follows the inputs is."""
    x = paddle.static.data("x", [2, 8], "float32")
    follows, fixed = paddle.sum(x), paddle.sum(x, dtype="float32")
    policy = Policy.preset("O1", paddle_ops=OpLists(lower={"reduce_sum"}))
    report = Rewriter(policy, DeviceProfile(None)).rewrite(static.main)
    assert [d.run_dtype for d in report.decisions if d.op == "reduce_sum"] == ["float16"] * 2
    assert str(follows.dtype) == "paddle.float16" and str(fixed.dtype) == "paddle.float32"


def test_o2_decorate_under_pir_plans_through_the_core_with_emulated_masters(static):
    """decorate's O2 takes the one param_plan path on PIR too; with no CPU momentum kernel in
    the low dtype, the planned-low weights are stored low and float32 masters (the same
    MasterWeights as on the legacy IR) take the update (they stayed float32 before)."""
    _, loss = layernorm_model()
    opt = paddle_amp.decorate(paddle.optimizer.Momentum(0.1),
                              policy=Policy.preset("O2", emulate=True))
    opt.minimize(loss)
    plan = opt.param_plan()
    assert plan.low and all(n.startswith("fc_") for n in plan.low)
    assert opt._low_params == plan.low and "EMULATED" in opt.master_update
    dtypes = {op.result(0).name: str(op.result(0).dtype)
              for op in static.main.global_block().ops if op.name() == "builtin.parameter"}
    masters = opt._masters.master_of
    assert set(masters) == plan.low
    assert all(dtypes[n] == "paddle.float16" and dtypes[masters[n]] == "paddle.float32"
               for n in plan.low)
    assert all(d == "paddle.float32" for n, d in dtypes.items()
               if n not in plan.low)  # layer_norm's own, and the masters'

