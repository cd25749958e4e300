"""bf16 on a CPU: which ops run on oneDNN here (probed, never assumed), the oneDNN attributes
the rewrite sets as the native does, and the bf16 entry points.

The program structure is checked with a kernel set given explicitly (what a CPU with
``avx512_bf16`` answers); running real bf16 kernels skips where the probe finds none.
"""
import numpy as np
import paddle
import pytest
import paddle_amp
from amp_adapters.rules.device import DeviceProfile
from amp_adapters.rules.isa import bf16_class, describe_bf16, machine
from paddle_amp import ir, kernels
from paddle_amp.bf16 import AutoMixedPrecisionListsBF16, decorate_bf16, rewrite_program_bf16
from paddle_amp.config import native_policy
from paddle_amp.env import from_low, to_low
from paddle_amp.ir.legacy.probe import onednn_attrs
from paddle_amp.rewrite import Rewriter
from paddle_helpers import Static, batch, is_pir, mlp

BF16 = "bfloat16"
NO_BF16_GEMM = ("this CPU runs no oneDNN bf16 matmul (it needs AVX-512, and avx512_bf16 to be "
                f"fast): the probe's answer ({describe_bf16(machine())})")
# the project's device truth: no AVX-512 in use here (a CPU without it, or AMP_ADAPTERS_CPU)
NO_AVX512 = bf16_class(machine()) == "none"
REAL_BF16 = kernels.runs_onednn_bf16("matmul_v2", backward=True)
# What a CPU with avx512_bf16 answers for the ops of mlp(): they run on oneDNN in bf16.
ONEDNN_HERE = frozenset({"matmul_v2", "mul", "elementwise_add", "relu"})


def bf16_rewriter(program, onednn=ONEDNN_HERE, level="O1"):
    """The rewrite on a CPU whose oneDNN runs ``onednn`` in bf16 (sent there where the
    program's IR can: not under PIR)."""
    policy = native_policy(AutoMixedPrecisionListsBF16(), BF16, level)
    return Rewriter(policy, DeviceProfile(kernels.plain_kernels("CPU", BF16) | onednn, onednn))


GEMMS = ("mul", "matmul_v2")  # what paddle.static.nn.fc builds: 2.6 mul, 3.x matmul_v2


def gemms(program):
    return [op for op in program.global_block().ops if op.type in GEMMS]


# -- kernel truth ---------------------------------------------------------------------------

@pytest.mark.parametrize("op", sorted(kernels._RECIPES))
def test_the_probe_answers_without_raising(op):
    """A oneDNN bf16 kernel that cannot run here (no primitive for this CPU, a bf16 filter
    Paddle 2.6.2's conv2d refuses, no bf16 layer_norm_grad) is the answer False. Without
    AVX-512 a probe may still run (a reshape2 is a oneDNN reorder, which runs on any CPU):
    the gate, not each probe, keeps such a CPU's kernel set empty (the next test)."""
    forward = kernels.runs_onednn_bf16(op)
    both = kernels.runs_onednn_bf16(op, backward=True)
    assert isinstance(forward, bool) and isinstance(both, bool)
    assert forward or not both  # a backward run is a forward run too


def test_onednn_kernels_are_what_the_probe_ran_forward_and_backward():
    """Each recipe's op, by its probe, forward and backward and behind the cast a rewrite
    puts in front of it; none at all where the gate's bf16 add does not run (oneDNN kept off
    AVX-512, as ``ONEDNN_MAX_CPU_ISA=AVX2`` keeps it on any CPU)."""
    onednn = kernels.onednn_kernels("CPU", BF16)
    gate = not NO_AVX512 and kernels.runs_onednn_bf16(kernels.GATE, backward=True)
    for op in kernels._RECIPES:
        assert (op in onednn) == (gate and kernels.runs_onednn_bf16(op, backward=True)
                                  and kernels.trains_behind_casts(op))
    if not gate:
        assert onednn == frozenset()
    assert kernels.lowp_kernels("CPU", BF16) == kernels.plain_kernels("CPU", BF16) | onednn
    assert kernels.onednn_kernels("CPU", "float16") == frozenset()
    assert kernels.onednn_kernels("GPU", BF16) == frozenset()


LEGACY, PIR = ir.LegacyProgram.probe, ir.PirProgram.probe  # each IR's probe


@pytest.mark.parametrize("probe", [LEGACY, PIR], ids=["legacy", "pir"])
def test_the_kernels_are_plain_ones_and_onednn_ones(probe):
    profile = kernels.device_profile("CPU", BF16, probe)
    assert (profile.kernels, profile.onednn) == (
        kernels.lowp_kernels("CPU", BF16, probe), kernels.onednn_kernels("CPU", BF16, probe))
    assert kernels.lowp_kernels("CPU", BF16, probe) == (
        kernels.plain_kernels("CPU", BF16) | kernels.onednn_kernels("CPU", BF16, probe))
    assert (LEGACY.name, PIR.name) == ("legacy", "pir") and ir.default_probe() is LEGACY
    assert kernels.lowp_kernels("CPU", BF16) == kernels.lowp_kernels("CPU", BF16, LEGACY)


def test_under_pir_an_op_counts_where_a_bf16_reader_of_its_result_runs():
    """The PIR probe reads the op's bf16 result in bf16: Paddle 3.3.1's PIR oneDNN conv2d
    leaves float32 data in it (a bf16 reader fails), so conv2d stays fp32 under PIR; the
    matmul's gradient runs with every input needing one."""
    if int(paddle.__version__[0]) < 3:
        assert not kernels.runs_onednn_bf16("matmul_v2", probe=PIR)  # no PIR on Paddle 2.6
        return
    for op in kernels._RECIPES:
        forward = kernels.runs_onednn_bf16(op, probe=PIR)
        both = kernels.runs_onednn_bf16(op, backward=True, probe=PIR)
        assert forward or not both  # a backward run is a forward run too
        pir_set = kernels.onednn_kernels("CPU", BF16, PIR)
        assert op not in pir_set or both  # counted only where the PIR probe ran
        if both and op in kernels.onednn_kernels("CPU", BF16):  # registered and usable
            assert op in pir_set
    if REAL_BF16:
        assert kernels.runs_onednn_bf16("matmul_v2", backward=True, probe=PIR)


def test_onednn_attrs_are_the_installed_paddles_spellings():
    attrs = onednn_attrs()
    assert attrs.get("use_mkldnn") is True and attrs.get("mkldnn_data_type") == BF16
    assert set(attrs) <= {"use_mkldnn", "mkldnn_data_type", "use_onednn", "onednn_data_type"}


# -- the rewrite ----------------------------------------------------------------------------

@pytest.mark.legacy_ir
def test_lowered_ops_get_the_native_onednn_attributes(static):
    mlp()
    report = bf16_rewriter(static.main).rewrite(static.main)
    low = {d.op for d in report.decisions if d.run_dtype == BF16}
    assert low & set(GEMMS)
    for op in static.main.global_block().ops:
        marked = op.has_attr("use_mkldnn") and op.attr("use_mkldnn")
        if op.type in low & ONEDNN_HERE:
            assert marked, op.type
            if op.has_attr("mkldnn_data_type"):  # not every op declares it (2.6's mul)
                assert op.attr("mkldnn_data_type") == BF16
            if op.has_attr("use_onednn"):  # Paddle 3 spells it both ways
                assert op.attr("use_onednn")
            if op.has_attr("onednn_data_type"):
                assert op.attr("onednn_data_type") == BF16
        else:
            assert not marked, op.type


@pytest.mark.legacy_ir
def test_an_op_kept_fp32_gets_no_onednn_attribute(static):
    mlp()
    bf16_rewriter(static.main, onednn=frozenset({"relu"})).rewrite(static.main)
    assert gemms(static.main)
    assert all(not op.attr("use_mkldnn") for op in gemms(static.main))


def test_a_bias_add_casts_the_bias_down_not_the_activation_up(static):
    """param_inputs from the walk: the fp32 bias beside a bf16 matmul output is cast to bf16
    (one cast of a parameter), the add runs bf16, and nothing casts back before relu."""
    mlp()
    report = bf16_rewriter(static.main).rewrite(static.main)
    adds = [d for d in report.decisions if d.op == "elementwise_add"]
    assert adds and all(d.run_dtype == BF16 for d in adds[:1])
    first = adds[0]
    assert first.casts.count(BF16) == 1 and "float32" not in first.casts


def test_a_conv_bias_reshaped_for_its_add_is_still_cast_down(static):
    """Paddle's conv adds its bias through a reshape of the parameter: the reshape stays
    fp32 (it only moves a parameter) and the add beside the bf16 conv output still casts
    that small operand down and runs bf16, as MXNet's conv with its bias inside does."""
    x = paddle.static.data("x", [None, 2, 4, 4], "float32")
    paddle.mean(paddle.nn.functional.relu(paddle.nn.Conv2D(2, 3, 3)(x)))  # (mean: the output)
    report = bf16_rewriter(static.main, onednn=ONEDNN_HERE | {"conv2d"}).rewrite(static.main)
    by_op = {d.op: d for d in report.decisions}
    assert by_op["conv2d"].run_dtype == BF16 and by_op["reshape2"].run_dtype == "float32"
    add = by_op["elementwise_add"]
    assert add.run_dtype == BF16 and add.casts.count(BF16) == 1, add
    assert by_op["relu"].run_dtype == BF16


# -- entry points ---------------------------------------------------------------------------

def cnn():
    """conv2d -> layer_norm -> fc -> mse: the model the native bf16 rewrite crashes on in
    Paddle 2.6.2 where it has oneDNN bf16 (conv's bf16 filter, layer_norm_grad)."""
    x = paddle.static.data("x", [None, 2, 4, 4], "float32")
    y = paddle.static.data("y", [None, 1], "float32")
    h = paddle.nn.functional.relu(paddle.nn.Conv2D(2, 3, 3)(x))
    h = paddle.nn.LayerNorm(12)(paddle.flatten(h, 1))
    out = paddle.nn.Linear(12, 1)(h)
    return paddle.mean((out - y) * (out - y))


def cnn_batch(step):
    rng = np.random.RandomState(step)
    return {"x": rng.rand(4, 2, 4, 4).astype("float32"), "y": rng.rand(4, 1).astype("float32")}


@pytest.mark.parametrize("make", [
    lambda: paddle_amp.decorate(paddle.optimizer.SGD(0.05), dtype=BF16),
    lambda: paddle_amp.decorate(paddle.optimizer.SGD(0.05), policy="O1-bf16"),
    lambda: decorate_bf16(paddle.optimizer.SGD(0.05)),
], ids=["decorate", "O1-bf16", "decorate_bf16"])
def test_a_cnn_trains_in_bf16_where_a_kernel_runs_else_fp32(static, make):
    loss = cnn()
    opt = make()
    opt.minimize(loss)
    static.exe.run(static.startup)
    opt.amp_init(paddle.CPUPlace())
    losses = [float(static.run(cnn_batch(i), [loss])[0]) for i in range(3)]
    assert np.all(np.isfinite(losses))
    kinds = kernels.lowp_kernels("CPU", BF16, ir.of(static.main).probe)
    for d in opt.cast_report().decisions:
        if d.op in ("conv2d", "layer_norm") and d.run_dtype == BF16:
            assert d.op in kinds  # bf16 only where this CPU ran the op's kernel


@pytest.mark.legacy_ir
def test_rewrite_program_bf16_marks_what_the_kernels_send_to_onednn(static, monkeypatch):
    mlp()
    monkeypatch.setattr(
        "paddle_amp.speed.device_profile",
        lambda device, dtype, probe, training=True: DeviceProfile(
            kernels.plain_kernels(device, dtype) | ONEDNN_HERE, ONEDNN_HERE))
    rewrite_program_bf16(static.main)
    matmuls = gemms(static.main)
    assert matmuls and all(op.attr("use_mkldnn") for op in matmuls)
    x = static.main.global_block().var(matmuls[0].input("X")[0])
    assert x.dtype == paddle.bfloat16  # the cast in front of it


def test_pure_bf16_rewrites_a_test_program_with_use_bf16_test(static):
    _, _, loss = mlp(names="pure")
    # a copy made before decorate: not a derived clone, rewritten by amp_init
    test = static.main.clone() if is_pir(static.main) else static.main.clone(for_test=True)
    opt = decorate_bf16(paddle.optimizer.SGD(0.05), use_pure_bf16=True, use_bf16_guard=False)
    opt.minimize(loss)
    static.exe.run(static.startup)
    opt.amp_init(paddle.CPUPlace(), test_program=test, use_bf16_test=True)
    assert paddle_amp.cast_report(test).decisions  # the test program was rewritten too
    assert np.isfinite(float(static.run(batch(0), [loss])[0]))


@pytest.mark.skipif(not REAL_BF16, reason=NO_BF16_GEMM)
def test_decorate_bf16_runs_the_gemm_in_bf16_on_onednn(static):
    _, _, loss = mlp()
    opt = paddle_amp.decorate(paddle.optimizer.SGD(0.05), dtype=BF16)
    opt.minimize(loss)
    static.exe.run(static.startup)
    opt.amp_init(paddle.CPUPlace())
    losses = [float(static.run(batch(i), [loss])[0]) for i in range(3)]
    assert np.all(np.isfinite(losses))
    assert opt.cast_report().precisions()["matmul"] == {BF16}
    assert opt.cast_report().executions()["matmul"] == {"kernel"}


@pytest.mark.skipif(not REAL_BF16, reason=NO_BF16_GEMM)
def test_bf16_training_tracks_fp32(static):
    """The same MLP and data, fp32 and bf16 on oneDNN: the losses agree within what bf16's
    8-bit mantissa allows (2**-8 relative per rounding, a few roundings deep)."""
    def losses(bf16):  # each in its own programs and scope, static mode from the fixture
        st = Static.new()
        with paddle.static.program_guard(st.main, st.startup), \
                paddle.static.scope_guard(st.scope), paddle.utils.unique_name.guard():
            _, _, loss = mlp()
            opt = paddle.optimizer.SGD(0.05)
            opt = paddle_amp.decorate(opt, dtype=BF16) if bf16 else opt
            opt.minimize(loss)
            st.exe.run(st.startup)
            return [float(st.run(batch(i), [loss])[0]) for i in range(5)]
    np.testing.assert_allclose(losses(True), losses(False), rtol=2 ** -5, atol=2 ** -7)


@pytest.mark.skipif(not REAL_BF16, reason=NO_BF16_GEMM)
def test_bf16_gemm_with_a_data_input_and_a_frozen_weight_trains(static):
    """oneDNN's bf16 matmul_grad (Paddle 2.6.2 and 3.3.1) dies with SIGSEGV when one input
    needs no gradient: the data input of the first layer, a frozen weight of the second.
    The casts the rewrite puts in front of a oneDNN op have their gradient computed, so
    this trains; the frozen weight stays as it was, the others move."""
    x = paddle.static.data("x", [None, 8], "float32")
    y = paddle.static.data("y", [None, 1], "float32")
    first = paddle.nn.Linear(8, 16)
    frozen = paddle.nn.Linear(16, 1, weight_attr=paddle.ParamAttr(trainable=False))
    loss = paddle.mean(paddle.square(frozen(paddle.nn.functional.relu(first(x))) - y))
    opt = paddle_amp.decorate(paddle.optimizer.SGD(0.05), dtype=BF16)
    opt.minimize(loss)
    static.exe.run(static.startup)
    before = static.state()
    losses = [float(static.run(batch(i), [loss])[0]) for i in range(3)]
    after = static.state()
    assert np.all(np.isfinite(losses))
    assert opt.cast_report().executions()["matmul"] == {"kernel"}
    np.testing.assert_array_equal(after[frozen.weight.name], before[frozen.weight.name])
    for moved in (first.weight.name, first.bias.name, frozen.bias.name):
        assert not np.array_equal(after[moved], before[moved]), moved


@pytest.mark.legacy_ir
def test_is_in_fp32_varnames_reads_inputs_and_outputs(static):
    block = static.main.global_block()
    a, b, c = (block.create_var(name=n, shape=[3], dtype="float32") for n in "abc")
    first = block.append_op(type="abs", inputs={"X": [a]}, outputs={"Out": [b]})
    second = block.append_op(type="abs", inputs={"X": [b]}, outputs={"Out": [c]})
    from paddle_amp.bf16.amp_utils import _is_in_fp32_varnames
    by_b = AutoMixedPrecisionListsBF16(custom_fp32_varnames={"b"})
    assert _is_in_fp32_varnames(first, by_b) and _is_in_fp32_varnames(second, by_b)
    by_a = AutoMixedPrecisionListsBF16(custom_fp32_varnames={"a"})
    assert _is_in_fp32_varnames(first, by_a) and not _is_in_fp32_varnames(second, by_a)
    assert not _is_in_fp32_varnames(first, AutoMixedPrecisionListsBF16())


@pytest.mark.skipif(REAL_BF16 or not NO_AVX512,
                    reason="this CPU runs bf16: the rows are timed by make bench")
def test_bench_rows_without_kernels_say_why_and_time_nothing():
    bf16_cpu = _bench()
    rows = bf16_cpu.paddle_rows()
    assert rows[0].startswith("| Paddle (legacy IR)")
    for row in rows:
        assert describe_bf16(machine()) in row, row
        auto = row.split("|")[6].strip()
        assert auto == "-" if "inference" in row else auto.startswith("not timed"), row
    irs = ["legacy IR"] + (["PIR"] if int(paddle.__version__[0]) >= 3 else [])
    assert {tuple(c.strip() for c in row.split("|")[1:4]) for row in rows} == {
        (f"Paddle ({ir_name})", model, mode) for ir_name in irs
        for model in bf16_cpu.MODELS for mode in bf16_cpu.MODES}
    assert all(row.split("|")[4].strip() == "-" for row in rows if "(PIR)" in row)


def _bench():
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from bench import bf16_cpu
    return bf16_cpu


@pytest.mark.parametrize("mode", ["training", "inference"])
@pytest.mark.parametrize("model", ["MLP 4x2048", "CNN 3x3 64ch 56x56", "Transformer block"])
def test_bench_programs_build_for_every_model_and_mode(static, model, mode):
    """What a bench row would time, built (not run): ours in the suite's IR, the native in the
    legacy IR (it has no PIR branch); the model's GEMM or convolution is in the program."""
    bf16_cpu = _bench()
    impls = [paddle_amp] + ([] if is_pir(static.main) else [paddle.static.amp])
    for amp in impls:
        main, _, name, shape, loss, _ = bf16_cpu.paddle_program(model, mode, amp, bf16=True)
        ops = {op.name() if is_pir(main) else op.type for op in main.global_block().ops}
        wanted = {"mul", "matmul_v2", "conv2d", "pd_op.matmul", "pd_op.conv2d"}
        assert ops & wanted, (amp.__name__, sorted(ops))
        assert shape[0] == bf16_cpu.BATCH and loss is not None
        has_backward = any("grad" in op for op in ops)
        assert has_backward == (mode == "training"), (amp.__name__, mode)
    with pytest.raises(ValueError, match="mode must be one of"):
        bf16_cpu.paddle_program(model, "serving", paddle_amp, bf16=False)


# -- casts on oneDNN (legacy IR) ----------------------------------------------------------

@pytest.mark.legacy_ir
def test_the_casts_the_rewrite_inserts_go_to_onednn_and_the_users_own_do_not(static):
    """With cast in the oneDNN set (what ``kernels.casts_on_onednn`` answers on a CPU with
    bf16), every cast the rewrite inserts between float32 and bf16 carries the oneDNN
    attributes; a cast the user wrote keeps its own."""
    x = paddle.static.data("x", [None, 8], "float32")
    mine = paddle.cast(paddle.nn.Linear(8, 8)(x), BF16)  # the user's: left alone
    paddle.mean(paddle.nn.Linear(8, 1)(paddle.cast(mine, "float32")))
    users = {id(op) for op in static.main.global_block().ops if op.type == "cast"}
    bf16_rewriter(static.main, onednn=ONEDNN_HERE | {"cast"}).rewrite(static.main)
    inserted = [op for op in static.main.global_block().ops
                if op.type == "cast" and id(op) not in users]
    assert inserted and all(op.attr("use_mkldnn") for op in inserted)
    assert not any(op.attr("use_mkldnn") for op in static.main.global_block().ops
                   if id(op) in users)


@pytest.mark.legacy_ir
def test_without_onednn_casts_the_rewrite_inserts_plain_ones(static):
    mlp()
    bf16_rewriter(static.main).rewrite(static.main)
    casts = [op for op in static.main.global_block().ops if op.type == "cast"]
    assert casts and not any(op.attr("use_mkldnn") for op in casts)


@pytest.mark.skipif("cast" not in kernels.onednn_kernels("CPU", BF16), reason=(
    "oneDNN casts no bf16 here (it needs AVX-512; avx512_bf16 to be fast): the probe's answer"))
@pytest.mark.legacy_ir
def test_onednn_casts_round_to_nearest_even_in_a_training_step(static):
    """The whole step on oneDNN casts: the first cast's output is the input rounded to the
    nearest bf16, ties to even (Paddle 2.6.2's plain cast truncates), and training runs."""
    _, _, loss = mlp()
    opt = paddle_amp.decorate(paddle.optimizer.SGD(0.05), dtype=BF16)
    opt.minimize(loss)
    block = static.main.global_block()
    first = next(op for op in block.ops if op.type == "cast" and op.input("X") == ["x"])
    assert first.attr("use_mkldnn")
    static.exe.run(static.startup)
    feed = batch(0)
    got, lossv = static.run(feed, [first.output("Out")[0], loss])
    assert np.isfinite(float(lossv))
    bits = np.asarray(got).view(np.uint16).astype(np.uint32) << 16
    np.testing.assert_array_equal(bits.view(np.float32), from_low(to_low(feed["x"], BF16), BF16))


def test_the_reference_rounding_is_to_nearest_with_ties_to_even():
    x = np.array([1 + 2 ** -8, 1 + 3 * 2 ** -8, 1 + 2 ** -8 + 2 ** -20, -1.0], np.float32)
    np.testing.assert_array_equal(from_low(to_low(x, BF16), BF16),
                                  np.array([1.0, 1 + 2 ** -6, 1 + 2 ** -7, -1.0], np.float32))


@pytest.mark.parametrize("probe", [LEGACY, PIR], ids=["legacy", "pir"])
def test_cast_counts_as_a_onednn_kernel_only_where_its_probe_says_so(probe):
    """Registered is not enough; PIR has no per-op switch for it."""
    onednn = kernels.onednn_kernels("CPU", BF16, probe)
    gate = bool(kernels.onednn_kernels("CPU", BF16))
    assert ("cast" in onednn) == (probe is LEGACY and gate and kernels.casts_on_onednn())
    assert not PIR.onednn_casts and not kernels.casts_on_onednn(PIR)
    assert kernels.plain_cast_readers("CPU", BF16, probe) == (
        kernels.refuse_onednn_casts(probe) if "cast" in onednn else frozenset())


def test_each_probed_op_trains_between_the_casts_the_rewrite_gives_it():
    """Where casts go to oneDNN, every probed oneDNN op trains between oneDNN casts, but
    those of ``plain_cast_readers`` (Paddle 3.3.1's conv2d: its oneDNN conv2d_grad leaves
    the filter gradient in a layout the oneDNN cast cannot read), which fail there and
    train with plain casts in front."""
    readers = kernels.plain_cast_readers("CPU", BF16)
    if "cast" not in kernels.onednn_kernels("CPU", BF16):
        pytest.skip("no cast goes to oneDNN here (the casts' own probe, or no oneDNN bf16)")
    for op in kernels._RECIPES:
        if op in kernels.onednn_kernels("CPU", BF16):  # one that trains behind no cast is none
            onednn = LEGACY.runs(op, kernels._RECIPES[op], True, cast_in="onednn")
            assert onednn == (op not in readers), op
            assert onednn or LEGACY.runs(op, kernels._RECIPES[op], True,
                                          cast_in="plain"), op


@pytest.mark.legacy_ir
def test_the_casts_in_front_of_a_plain_cast_reader_stay_plain(static):
    """One value read by a conv2d that trains only behind plain casts and by another op:
    each gets its own cast, the conv2d's plain, the other's on oneDNN; the casts after the
    conv2d go to oneDNN too."""
    x = paddle.static.data("x", [None, 2, 4, 4], "float32")
    h = paddle.nn.Conv2D(2, 2, 1)(x)
    paddle.mean(paddle.nn.functional.relu(x) + h)
    onednn = frozenset({"conv2d", "relu", "elementwise_add", "cast"})
    policy = native_policy(AutoMixedPrecisionListsBF16(custom_bf16_list={"conv2d", "relu"}),
                           BF16, "O1")
    Rewriter(policy, DeviceProfile(kernels.plain_kernels("CPU", BF16) | onednn, onednn,
                                   plain_casts_before={"conv2d"})).rewrite(static.main)
    block = static.main.global_block()
    readers = {op.type: op for op in block.ops if op.type in ("conv2d", "relu")}
    producer = {out: op for op in block.ops for out in op.output_arg_names}

    def cast_in_front(op, slot):
        cast = producer[op.input(slot)[0]]
        assert cast.type == "cast", (op.type, slot)
        return cast

    conv_x, relu_x = cast_in_front(readers["conv2d"], "Input"), cast_in_front(readers["relu"], "X")
    assert conv_x is not relu_x and conv_x.input("X") == relu_x.input("X") == [x.name]
    assert not conv_x.attr("use_mkldnn") and relu_x.attr("use_mkldnn")
    assert not cast_in_front(readers["conv2d"], "Filter").attr("use_mkldnn")
    casts = [op for op in block.ops if op.type == "cast"]
    assert sum(not op.attr("use_mkldnn") for op in casts) == 2  # the conv2d's two, no other


@pytest.mark.skipif(not kernels.plain_cast_readers("CPU", BF16), reason=(
    "every oneDNN op here trains behind oneDNN casts, or no cast goes to oneDNN (the probe's "
    "answer; Paddle 3.3.1's legacy IR on an AVX-512 CPU has such an op, conv2d)"))
@pytest.mark.legacy_ir
@pytest.mark.parametrize("policy", ["O1-bf16", "O2-bf16"])
def test_a_cnn_with_a_plain_cast_reader_trains_on_onednn_casts_elsewhere(static, policy):
    """The oneDNN conv2d behind plain casts, every other cast on oneDNN: it trains, the
    losses finite, and the filter moves. O2 stores the filter in bf16: the cast of its
    gradient to the float32 master reads conv2d_grad's output, and is plain too."""
    loss = cnn()
    opt = paddle_amp.decorate(paddle.optimizer.SGD(0.05), policy=policy)
    opt.minimize(loss)
    block = static.main.global_block()
    conv = next(op for op in block.ops if op.type == "conv2d")
    assert conv.attr("mkldnn_data_type") == BF16
    before_conv = block.ops[:block.ops.index(conv)]
    producer = {out: op for op in before_conv for out in op.output_arg_names}
    fronts = [producer.get(conv.input(s)[0]) for s in ("Input", "Filter")]  # None: a param
    assert all(op.type == "cast" and not op.attr("use_mkldnn") for op in fronts if op)
    grads = {out for op in block.ops if op.type == "conv2d_grad" for out in op.output_arg_names}
    readers = [op for op in block.ops if op.type == "cast" and set(op.input_arg_names) & grads]
    assert readers and not any(op.attr("use_mkldnn") for op in readers)
    assert any(op.type == "cast" and op.attr("use_mkldnn") for op in block.ops)
    static.exe.run(static.startup)
    opt.amp_init(paddle.CPUPlace())
    filt = fronts[1].input("X")[0] if fronts[1] else conv.input("Filter")[0]
    filt = opt._masters.master_of.get(filt, filt) if opt._masters else filt
    before = np.array(static.scope.find_var(filt).get_tensor())
    losses = [float(static.run(cnn_batch(i), [loss])[0]) for i in range(3)]
    assert np.all(np.isfinite(losses))
    assert not np.array_equal(before, np.array(static.scope.find_var(filt).get_tensor()))
