"""A bf16 kernel that runs but is slow: oneDNN's gradient of an operand with fewer dimensions
than the result (a Linear's weight on a batch of sequences, a bias added to it) sums over
the extra dimensions, on a reference implementation in the oneDNN Paddle ships. Training
keeps those instances in float32, found from oneDNN's own log of a probe, never assumed.

The program structure is checked with the slow set given explicitly; the probe and a real
training run skip where this CPU runs no oneDNN bf16.
"""
import numpy as np
import paddle
import pytest

import paddle_amp
from amp_adapters.rules.device import DeviceProfile
from paddle_amp import ir, kernels
from paddle_amp.onednn_log import executed, onednn_log
from paddle_amp.bf16 import AutoMixedPrecisionListsBF16
from paddle_amp.config import native_policy
from paddle_amp.rewrite import Rewriter
from paddle_helpers import Static

BF16 = "bfloat16"
REAL_BF16 = kernels.runs_onednn_bf16("matmul_v2", backward=True)
NO_BF16_GEMM = ("this CPU runs no oneDNN bf16 matmul (it needs AVX-512, and avx512_bf16 to be "
                "fast): the probe's answer")
ONEDNN_HERE = frozenset({"matmul_v2", "elementwise_add", "relu", "scale"})
SLOW = "on a reference implementation here"


def block(seq: int = 4, d: int = 8):
    """Self-attention's shapes in small: a Linear on a batch of sequences (3-D by 2-D, then a
    bias), a batched GEMM of two 3-D values, and a Linear on 2-D rows."""
    x = paddle.static.data("x", [None, seq, d], "float32")
    h = paddle.nn.Linear(d, d)(x)
    att = paddle.nn.functional.softmax(  # 3-D by 3-D: nothing summed
        paddle.mm(h, paddle.transpose(h, [0, 2, 1])) * d ** -0.5)
    rows = paddle.reshape(paddle.mm(att, h), [-1, d])
    return x, paddle.mean(paddle.square(paddle.nn.Linear(d, 1)(rows)))


def decisions(report, op):
    return [d for d in report.decisions if d.op == op]


def test_training_keeps_only_the_instances_that_sum_a_broadcast_operand_fp32(static, caplog):
    block()
    policy = native_policy(AutoMixedPrecisionListsBF16(), BF16, "O1")
    rewriter = Rewriter(policy, DeviceProfile(
        kernels.plain_kernels("CPU", BF16) | ONEDNN_HERE, ONEDNN_HERE, training=True,
        slow_broadcast_grads=frozenset({"matmul_v2", "elementwise_add"})))
    with caplog.at_level("INFO", logger="paddle_amp"):
        report = rewriter.rewrite(static.main)
    matmuls, adds = decisions(report, "matmul_v2"), decisions(report, "elementwise_add")
    # the 3-D by 2-D GEMM sums its weight's gradient over the batch; 3-D by 3-D and 2-D by
    # 2-D sum nothing
    assert [d.execution for d in matmuls] == ["fell back", "kernel", "kernel", "kernel"]
    assert SLOW in matmuls[0].reason and matmuls[0].run_dtype == "float32"
    assert all(SLOW not in d.reason for d in matmuls[1:])
    # the first bias is added to the float32 result of the first GEMM: float32 anyway (the
    # promote rule); the second to bf16 rows, and its gradient sums over them: float32
    assert [d.run_dtype for d in adds] == ["float32", "float32"]
    assert (SLOW in adds[0].reason, SLOW in adds[1].reason) == (False, True)
    # a choice made for speed, not a missing kernel: INFO, never a WARNING
    notes = [r for r in caplog.records if r.name == "paddle_amp"]
    assert notes and all(r.levelname == "INFO" for r in notes)
    assert not any("emulate=True" in r.getMessage() for r in notes)  # it has a kernel
    assert "2 in float32 where their bfloat16 kernel on this device is slower" in \
        notes[-1].getMessage()


def test_inference_rewrites_keep_every_kernel(static, monkeypatch):
    """The slow part is a gradient: ``rewrite_program_bf16`` (no optimizer, no backward)
    lowers the Linear on 3-D input as the native does."""
    block()
    monkeypatch.setattr(
        "paddle_amp.speed.device_profile",
        lambda device, dtype, probe, training=True: DeviceProfile(
            kernels.plain_kernels(device, dtype) | ONEDNN_HERE, ONEDNN_HERE))
    paddle_amp.bf16.rewrite_program_bf16(static.main)
    report = paddle_amp.cast_report(static.main)
    assert {d.run_dtype for d in decisions(report, "matmul_v2")} == {BF16}


@pytest.mark.skipif(not REAL_BF16, reason=NO_BF16_GEMM)
def test_onednn_log_holds_what_ran_and_leaves_stdout_alone(capfd):
    print("before", flush=True)
    with onednn_log() as log:
        assert ir.LegacyProgram.probe.runs("matmul_v2", kernels._RECIPES["matmul_v2"], True)
    print("after", flush=True)
    assert "matmul" in {kind for kind, _ in executed(log)}
    with pytest.raises(ZeroDivisionError), onednn_log():  # fd 1 comes back however it ends
        1 / 0
    with pytest.raises(RuntimeError, match="nest"), onednn_log(), onednn_log():
        pass
    print("last", flush=True)
    out = capfd.readouterr().out
    assert out.splitlines() == ["before", "after", "last"]


@pytest.mark.skipif(not REAL_BF16, reason=NO_BF16_GEMM)
@pytest.mark.parametrize("probe", [ir.LegacyProgram.probe, ir.PirProgram.probe],
                         ids=["legacy", "pir"])
def test_the_slow_set_is_what_onednn_logs_as_a_reference_implementation(probe):
    if not probe.available():
        pytest.skip("Paddle 2.6 has no PIR")
    slow = kernels.slow_broadcast_grads("CPU", BF16, probe)
    onednn = kernels.onednn_kernels("CPU", BF16, probe)
    assert slow <= onednn & set(kernels._BROADCAST_RECIPES)
    for op in sorted(onednn & set(kernels._BROADCAST_RECIPES)):
        with onednn_log() as log:
            ran = probe.runs(op, kernels._BROADCAST_RECIPES[op], True)
        assert (op in slow) == (not ran or any(impl.startswith("ref")
                                               for _, impl in executed(log)))


@pytest.mark.skipif(not REAL_BF16, reason=NO_BF16_GEMM)
def test_a_transformer_shaped_model_trains_and_says_which_gemms_stay_fp32(static):
    """With the real probe: the Linear on 3-D input runs in bf16 exactly where its gradient
    is not slow here, and training tracks float32 within bf16's mantissa."""
    def losses(bf16):
        st = Static.new()
        with paddle.static.program_guard(st.main, st.startup), \
                paddle.static.scope_guard(st.scope), paddle.utils.unique_name.guard():
            x, loss = block()
            opt = paddle.optimizer.SGD(0.01)
            opt = paddle_amp.decorate(opt, dtype=BF16) if bf16 else opt
            opt.minimize(loss)
            st.exe.run(st.startup)
            feed = np.random.default_rng(0).standard_normal((2, 4, 8)).astype("float32")
            got = [float(st.run({x.name: feed}, [loss])[0]) for _ in range(3)]
            return got, (opt.cast_report() if bf16 else None)
    (low, report), (full, _) = losses(True), losses(False)
    np.testing.assert_allclose(low, full, rtol=2 ** -5, atol=2 ** -7)
    first = decisions(report, "matmul_v2")[0]
    slow = "matmul_v2" in kernels.slow_broadcast_grads("CPU", BF16, ir.of(static.main).probe)
    assert (first.execution, SLOW in first.reason) == (
        ("fell back", True) if slow else ("kernel", False))


def test_o2_stores_a_parameter_read_only_by_a_refused_op_in_float32(static):
    """One rule for the rewrite and O2's parameter plan: the weight of the Linear on 3-D input
    (its GEMM refused) stays float32; the last Linear's weight (a 2-D GEMM) is stored low."""
    block()
    policy = native_policy(AutoMixedPrecisionListsBF16(), BF16, "O2")
    slow = frozenset({"matmul_v2", "elementwise_add"})
    plan = Rewriter(policy, DeviceProfile(
        kernels.plain_kernels("CPU", BF16) | ONEDNN_HERE, ONEDNN_HERE, slow_broadcast_grads=slow,
        training=True)).param_plan(static.main)
    weights = sorted(n for n in plan.dtypes if n.endswith(".w_0"))
    assert [plan.dtypes[w] for w in weights] == ["float32", BF16], plan.format()
    assert SLOW in plan.reasons[weights[0]]
    everything = Rewriter(policy, DeviceProfile(
        kernels.plain_kernels("CPU", BF16) | ONEDNN_HERE, ONEDNN_HERE)).param_plan(static.main)
    assert everything.dtypes[weights[0]] == BF16  # without the refusal it is stored low


@pytest.mark.legacy_ir
def test_a_test_program_rewritten_by_amp_init_keeps_every_kernel(static, monkeypatch):
    """amp_init(test_program=..., use_bf16_test=True) rewrites an eval program, which has no
    gradient: the instances training keeps off a slow gradient run bf16 there, as the native
    runs them (and as rewrite_program_bf16 does)."""
    monkeypatch.setattr(
        "paddle_amp.speed.device_profile",
        lambda device, dtype, probe, training=True: DeviceProfile(
            kernels.plain_kernels(device, dtype) | ONEDNN_HERE, ONEDNN_HERE,
            frozenset({"elementwise_add"}) if training else frozenset(), training=training))
    _, loss = block()
    test = static.main.clone(for_test=True)
    opt = paddle_amp.bf16.decorate_bf16(paddle.optimizer.SGD(0.01), use_bf16_guard=False)
    opt.minimize(loss)
    static.exe.run(static.startup)
    opt.amp_init(paddle.CPUPlace(), test_program=test, use_bf16_test=True)
    trained = decisions(opt.cast_report(), "elementwise_add")
    evaluated = decisions(paddle_amp.cast_report(test), "elementwise_add")
    assert any(SLOW in d.reason for d in trained)
    assert not any(SLOW in d.reason for d in evaluated)
    assert BF16 in {d.run_dtype for d in evaluated}
