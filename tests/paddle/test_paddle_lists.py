"""Op lists on a real Paddle program: place-aware kernels, order-free promotion, bad input."""
import logging
import os
import subprocess
import sys

import numpy as np
import paddle
import pytest

import paddle_amp
from amp_adapters import (ConflictingOpError, DynamicLossScale, NoOpLossScale, OpLists, Policy,
                          UnknownOpError)
from amp_adapters.rules.device import DeviceProfile
from paddle_amp.env import current_device
from paddle_amp.kernels import lowp_kernels, runs_onednn_bf16
from paddle_amp.rewrite import Rewriter
from paddle_helpers import batch, forward_ops, mlp, white_list_model


@pytest.mark.legacy_ir
def test_cpu_white_list_inserts_casts_and_trains(static, caplog):
    loss = white_list_model()
    lists = paddle_amp.AutoMixedPrecisionLists(custom_white_list=["scale", "concat"])
    opt = paddle_amp.decorate(paddle.optimizer.SGD(0.1), lists)
    with caplog.at_level(logging.INFO, logger="paddle_amp"):
        opt.minimize(loss)
    report = {d.op: d for d in opt.cast_report().decisions}
    assert report["scale"].run_dtype == report["concat"].run_dtype == "float16"
    assert report["mul"].run_dtype == "float32"
    casts = forward_ops(static.main, "cast")
    assert casts, "scale/concat run in fp16 on CPU, so casts are inserted"
    # one cast per (value, dtype): the relu output feeds two scales but is cast once
    assert len({op.input("X")[0] for op in casts}) == len(casts)
    concat = forward_ops(static.main, "concat")[0]
    assert static.main.global_block().var(concat.output("Out")[0]).dtype == \
        paddle.base.core.VarDesc.VarType.FP16
    # ops without a CPU fp16 kernel stay fp32, with one logged reason per op type
    mul_lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("mul ")]
    assert len(mul_lines) == 1 and "no float16 kernel for mul on this device" in mul_lines[0]
    static.exe.run(static.startup)
    opt.amp_init(paddle.CPUPlace())
    losses = [static.run(batch(i % 2), [loss])[0] for i in range(30)]
    assert np.all(np.isfinite(losses)) and losses[-1] < losses[0]
    assert opt.loss_scale().skipped_steps == 0


@pytest.mark.legacy_ir
def test_native_inserts_no_casts_on_cpu(static):
    loss = white_list_model()
    lists = paddle.static.amp.AutoMixedPrecisionLists(custom_white_list=["scale", "concat"])
    paddle.static.amp.decorate(paddle.optimizer.SGD(0.1), lists).minimize(loss)
    assert not forward_ops(static.main, "cast")


def test_native_lists_object_is_accepted(static):
    loss = white_list_model()
    native = paddle.static.amp.AutoMixedPrecisionLists(custom_white_list=["scale"])
    opt = paddle_amp.decorate(paddle.optimizer.SGD(0.1), native)
    opt.minimize(loss)
    assert {d.op: d.run_dtype for d in opt.cast_report().decisions}["scale"] == "float16"


@pytest.mark.legacy_ir
@pytest.mark.parametrize("softmax_first", [False, True])
def test_promote_does_not_depend_on_input_order(static, softmax_first):
    """add(matmul, softmax) and add(softmax, matmul) both run fp32, planned as on a GPU."""
    x = paddle.static.data("x", [None, 8], "float32")
    w = paddle.static.create_parameter([8, 8], "float32")
    mm, sm = x @ w, paddle.nn.functional.softmax(x)
    paddle.mean(sm + mm if softmax_first else mm + sm)
    report = Rewriter(Policy(), DeviceProfile(None)).rewrite(static.main)
    d = {d.op: d for d in report.decisions}
    assert d["matmul_v2"].run_dtype == "float16" and d["softmax"].run_dtype == "float32"
    assert d["elementwise_add"].run_dtype == "float32"
    assert d["elementwise_add"].num_casts == 1  # the fp16 matmul output, whichever side


@pytest.mark.parametrize("scale_first", [False, True])
def test_promote_order_on_cpu(static, scale_first):
    """The same on CPU with a real fp16 producer (scale): fp32 wins, either order."""
    x = paddle.static.data("x", [None, 8], "float32")
    low, high = paddle.scale(x, 2.0), paddle.nn.functional.softmax(x)
    loss = paddle.mean(low + high if scale_first else high + low)
    lists = paddle_amp.AutoMixedPrecisionLists(custom_white_list=["scale"])
    opt = paddle_amp.decorate(paddle.optimizer.SGD(0.1), lists)
    x.stop_gradient = False
    with paddle.static.program_guard(static.main, static.startup):
        w = paddle.static.create_parameter([1], "float32")
    opt.minimize(loss + paddle.mean(w * w))
    add = [d for d in opt.cast_report().decisions if d.op == "elementwise_add"][0]
    assert add.run_dtype == "float32" and add.num_casts == 1


def test_unknown_op_names_are_named_with_close_matches(static):
    with pytest.raises(UnknownOpError, match="'matmull'.*matmul"):
        paddle_amp.AutoMixedPrecisionLists(custom_white_list=["matmull"])
    policy = Policy(paddle_ops=OpLists(fp32=["softmaxx"]))
    with pytest.raises(UnknownOpError, match="softmaxx"):
        paddle_amp.decorate(paddle.optimizer.SGD(0.1), policy=policy)


def test_a_gpu_only_op_is_a_known_name_on_a_cpu_build(static):
    """A GPU config run on a CPU machine: sync_batch_norm is no op of a CPU build's registry,
    but it is a Paddle op (its API has it); lists and policies take it, as natively."""
    from paddle.base import core
    assert "sync_batch_norm" in paddle_amp.lists.known_ops()
    lists = paddle_amp.AutoMixedPrecisionLists(custom_black_list=["sync_batch_norm"])
    assert "sync_batch_norm" in lists.black_list
    x = paddle.static.data("x", [None, 4], "float32")
    loss = paddle.mean(paddle.nn.Linear(4, 1)(x))
    policy = Policy(paddle_ops=OpLists(fp32=["sync_batch_norm"]))
    paddle_amp.decorate(paddle.optimizer.SGD(0.1), policy=policy).minimize(loss)
    if core.is_compiled_with_cuda():
        return
    assert "sync_batch_norm" not in core.get_all_op_names()  # what the check read before


def test_op_in_two_lists_is_an_error(static):
    with pytest.raises(ConflictingOpError, match="'scale'"):
        paddle_amp.AutoMixedPrecisionLists(custom_white_list=["scale"],
                                           custom_black_list=["scale"])


@pytest.mark.parametrize("call, match", [
    (lambda: paddle_amp.decorate("sgd"), "paddle.optimizer.Optimizer"),
    (lambda: paddle_amp.decorate(paddle.optimizer.SGD(0.1), amp_lists=["mul"]), "amp_lists"),
    (lambda: paddle_amp.AutoMixedPrecisionLists(custom_white_list="mul"), "list of op names"),
    (lambda: paddle_amp.decorate(paddle.optimizer.SGD(0.1), policy=3), "Policy"),
    (lambda: paddle_amp.decorate(paddle.optimizer.SGD(0.1), init_loss_scaling="big"),
     "init_loss_scaling"),
    (lambda: paddle_amp.decorate(paddle.optimizer.SGD(0.1), None, 1024.0), "by keyword"),
])
def test_wrong_argument_types(static, call, match):
    with pytest.raises(TypeError, match=match):
        call()


def test_wrong_level_and_dtype(static):
    with pytest.raises(ValueError, match="'O3'"):
        paddle_amp.decorate(paddle.optimizer.SGD(0.1), level="O3")
    with pytest.raises(ValueError, match="'float8'"):
        paddle_amp.decorate(paddle.optimizer.SGD(0.1), dtype="float8")


def test_dygraph_call_is_an_error():
    paddle.disable_static()
    with pytest.raises(RuntimeError, match="dynamic .*enable_static"):
        paddle_amp.decorate(paddle.optimizer.SGD(0.1, parameters=[]))


@pytest.mark.skipif(int(paddle.__version__.split(".")[0]) < 3,
                    reason="PIR is Paddle 3's default IR; Paddle 2.6 builds legacy programs")
def test_decorate_works_under_pir_at_default_flags():
    """Paddle 3's default IR needs no flag and no guard: decorate picks the program's IR."""
    code = ("import paddle, paddle_amp; paddle.enable_static()\n"
            "x = paddle.static.data('x', [None, 4], 'float32')\n"
            "loss = paddle.mean(paddle.static.nn.fc(x, 1))\n"
            "opt = paddle_amp.decorate(paddle.optimizer.SGD(0.1))\n"
            "opt.minimize(loss)\n"
            "print(type(loss.block.program).__module__, paddle_amp.cast_report("
            "loss.block.program).framework)\n")
    env = {k: v for k, v in os.environ.items() if k != "FLAGS_enable_pir_api"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[-2:] == ["paddle.base.libpaddle.pir", "paddle"]


def test_native_argument_sets_map_onto_from_paddle(static):
    new = paddle_amp.decorate(paddle.optimizer.SGD(0.1), init_loss_scaling=8.0,
                              incr_every_n_steps=3, decr_every_n_nan_or_inf=2, decr_ratio=0.25)
    assert new.policy.loss_scale == DynamicLossScale.from_paddle(8.0, 3, 2, 2.0, 0.25)
    old = paddle_amp.decorate(paddle.optimizer.SGD(0.1), use_pure_fp16=False)
    assert old.policy.loss_scale == DynamicLossScale.from_paddle(2.0**15, 1000, 2, 2.0, 0.8)
    assert paddle_amp.decorate(paddle.optimizer.SGD(0.1), use_pure_fp16=True).policy.level == "O2"
    assert paddle_amp.decorate(paddle.optimizer.SGD(0.1)).policy.loss_scale == \
        DynamicLossScale.from_paddle()
    mine = DynamicLossScale(scale=4.0, min_scale=0.5)
    wins = paddle_amp.decorate(paddle.optimizer.SGD(0.1), init_loss_scaling=8.0,
                               policy=Policy(loss_scale=mine))
    assert wins.policy.loss_scale == mine


def test_lowp_kernels_are_place_aware():
    assert current_device() == "CPU"  # what the rewrite asks about on this machine
    cpu, gpu = lowp_kernels("CPU", "float16"), lowp_kernels("GPU", "float16")
    assert {"scale", "concat", "cast"} <= cpu and "mul" not in cpu
    if not paddle.is_compiled_with_cuda():  # a CPU build reports no GPU kernel but our cast
        assert gpu == {"cast"}
    else:
        assert "mul" in gpu


def test_cast_report_of_a_program(static):
    _, _, loss = mlp()
    with pytest.raises(ValueError, match="not rewritten by paddle_amp"):
        paddle_amp.cast_report(static.main)
    paddle_amp.decorate(paddle.optimizer.SGD(0.1)).minimize(loss)
    report = paddle_amp.cast_report(static.main)
    assert isinstance(report, paddle_amp.CastReport) and report.framework == "paddle"
    assert report.precisions()["matmul"] == {"float32"}  # no CPU fp16 GEMM


def test_bf16_runs_on_cpu_without_loss_scaling(static):
    """bf16 needs no scale; an op whose bf16 CPU kernel is oneDNN's counts only where the
    probe ran it here (forward and backward)."""
    _, _, loss = mlp()
    opt = paddle_amp.decorate(paddle.optimizer.Adam(0.01), dtype="bfloat16")
    opt.minimize(loss)
    assert ("mul" in lowp_kernels("CPU", "bfloat16")) == runs_onednn_bf16("mul", backward=True)
    static.exe.run(static.startup)
    opt.amp_init(paddle.CPUPlace())
    losses = [float(static.run(batch(i), [loss])[0]) for i in range(3)]
    assert np.all(np.isfinite(losses))
    assert opt.loss_scale() == NoOpLossScale(total_steps=3)


@pytest.mark.legacy_ir
def test_control_flow_reads_fp32_copies(static):
    """A sub-block is not rewritten (it runs in fp32): a low-precision value it reads is cast
    back to fp32 for it, instead of reaching an fp32-only kernel (relu on CPU) as fp16."""
    from paddle.static.nn.control_flow import ConditionalBlock
    x = paddle.static.data("x", [None, 8], "float32")
    flag = paddle.static.data("flag", [1], "bool")
    h = paddle.scale(paddle.static.nn.fc(x, 8), 2.0)  # fp16 on CPU (white list)
    out = paddle.static.create_global_var([2, 8], 0.0, "float32", name="branch_out")
    with ConditionalBlock([flag], is_scalar_condition=True).block():
        paddle.assign(paddle.nn.functional.relu(h), out)
    lists = paddle_amp.AutoMixedPrecisionLists(custom_white_list=["scale"])
    opt = paddle_amp.decorate(paddle.optimizer.SGD(0.1), lists)
    opt.minimize(paddle.mean(h))
    cond = [d for d in opt.cast_report().decisions if d.op == "conditional_block"][0]
    assert cond.run_dtype == "float32" and cond.num_casts == 1 and "control flow" in cond.reason
    static.exe.run(static.startup)
    feed = {"x": np.ones((2, 8), "float32"), "flag": np.array([True])}
    got, hv = static.run(feed, [out, h])
    assert np.array_equal(got, np.maximum(hv.astype(np.float32), 0))


def test_policy_with_custom_op_lists_takes_them_on_top_and_refuses_edits_in_place(static):
    from amp_adapters import AmpConfigError

    lists = paddle_amp.AutoMixedPrecisionLists(custom_white_list={"scale"})
    opt = paddle_amp.decorate(paddle.optimizer.SGD(0.1), amp_lists=lists,
                              policy=Policy.preset("O1"))
    assert "scale" in opt.policy.paddle_ops.lower
    edited = paddle_amp.AutoMixedPrecisionLists()
    edited.white_list.add("scale")
    with pytest.raises(AmpConfigError, match="edited in place"):
        paddle_amp.decorate(paddle.optimizer.SGD(0.1), amp_lists=edited,
                            policy=Policy.preset("O1"))
    only_varnames = paddle_amp.AutoMixedPrecisionLists(custom_black_varnames={"x"})
    paddle_amp.decorate(paddle.optimizer.SGD(0.1), amp_lists=only_varnames,
                        policy=Policy.preset("O1"))


def test_dtype_spellings_loss_scale_and_emulate_are_the_core_rules(static):
    """decorate reads dtypes through the core vocabulary, asks the core which dtype scales the
    loss, and merges ``emulate=`` as the core does (it adds, it never removes)."""
    from amp_adapters.rules.policy import default_loss_scale

    sgd = lambda: paddle.optimizer.SGD(0.1)  # noqa: E731
    bf16 = paddle_amp.decorate(sgd(), dtype="bf16", init_loss_scaling=8.0)
    assert bf16.policy.dtype == "bfloat16"
    assert bf16.policy.loss_scale == default_loss_scale("bfloat16") == NoOpLossScale()
    assert paddle_amp.AutoMixedPrecisionLists(dtype="fp16").amp_dtype == "float16"
    mine = Policy.preset("O1")
    assert paddle_amp.decorate(sgd(), policy=mine, emulate=True).policy == \
        mine.with_emulation(True)
    assert paddle_amp.decorate(sgd(), policy=mine.with_emulation(True),
                               emulate=False).policy.emulate
    assert paddle_amp.decorate(sgd(), emulate=True).policy.emulate
