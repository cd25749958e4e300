"""O2 (pure low precision, fp32 masters) on a LayerNorm model, and evaluation clones."""
import numpy as np
from amp_adapters.rules.device import DeviceProfile
import paddle
import pytest

import paddle_amp
from paddle_helpers import batch


def _layernorm_model():
    """fc -> layer_norm -> scale -> fc: layer_norm stays fp32; scale has a CPU fp16 kernel
    between float32 ops."""
    x = paddle.static.data("x", [None, 8], "float32")
    y = paddle.static.data("y", [None, 1], "float32")
    h = paddle.static.nn.fc(x, 16)
    h = paddle.static.nn.layer_norm(h)
    h = paddle.scale(h, 0.5)
    out = paddle.static.nn.fc(h, 1)
    diff = out - y
    return out, paddle.mean(diff * diff)


@pytest.mark.legacy_ir
def test_o2_with_layer_norm_builds_runs_and_evaluates(static):
    out, loss = _layernorm_model()
    opt = paddle_amp.decorate(paddle.optimizer.Momentum(0.05, multi_precision=True),
                              level="O2", dtype="float16")
    opt.minimize(loss)
    test_program = static.main.clone(for_test=True)
    d = {x.op: x for x in opt.cast_report().decisions}
    assert d["layer_norm"].run_dtype == "float32"  # in the fp32 list
    assert d["layer_norm"].input_dtypes.count(None) == 2  # Scale, Bias: never cast
    # scale has a CPU fp16 kernel, but sits between float32 ops (layer_norm, and an fc with
    # no fp16 kernel): it follows them, no cast down and back (issue 38, point 8)
    assert d["scale"].run_dtype == "float32" and "follows its data" in d["scale"].reason
    assert d["mul"].run_dtype == "float32"  # no CPU fp16 kernel: stays fp32 instead of crashing
    static.exe.run(static.startup)
    ops = len(test_program.global_block().ops)
    opt.amp_init(paddle.CPUPlace(), test_program=test_program)
    assert len(test_program.global_block().ops) == ops  # a clone is rewritten already
    losses = [float(static.run(batch(i % 3), [loss])[0]) for i in range(20)]
    assert np.all(np.isfinite(losses)) and losses[-1] < losses[0]
    # the eval clone has the rewritten forward and no optimizer or scale update
    assert not {"conditional_block", "check_finite_and_unscale", "momentum"} & \
        {op.type for op in test_program.global_block().ops}
    feed = batch(99)
    evaluated, = static.exe.run(test_program, feed=feed, fetch_list=[out])
    state = opt.loss_scale()
    trained, = static.run(feed, [out])
    assert np.array_equal(evaluated, trained) and np.all(np.isfinite(evaluated))
    assert opt.loss_scale().total_steps == state.total_steps + 1


def test_o2_with_fp16_guard_keeps_unguarded_ops_fp32(static):
    x = paddle.static.data("x", [None, 8], "float32")
    with paddle_amp.fp16_guard():  # the scale feeds an emulated GEMM: O2 lowers it
        h = paddle.static.nn.fc(paddle.scale(paddle.static.nn.fc(x, 8), 2.0), 8)
    loss = paddle.mean(paddle.scale(h, 3.0))
    opt = paddle_amp.decorate(paddle.optimizer.SGD(0.1), use_pure_fp16=True,  # guard on
                              emulate=True)
    opt.minimize(loss)
    scales = [d for d in opt.cast_report().decisions if d.op == "scale"]
    assert [s.run_dtype for s in scales] == ["float16", "float32"]
    assert "outside fp16_guard" in scales[1].reason
    static.exe.run(static.startup)
    opt.amp_init(paddle.CPUPlace())
    assert np.isfinite(static.run({"x": np.ones((2, 8), "float32")}, [loss])[0])


@pytest.mark.legacy_ir
def test_black_varnames_keep_their_ops_fp32(static):
    x = paddle.static.data("x", [None, 8], "float32")
    a = paddle.scale(x, 2.0)
    b = paddle.scale(a, 3.0)
    lists = paddle_amp.AutoMixedPrecisionLists(custom_white_list=["scale"],
                                               custom_black_varnames=[b.name])
    w = paddle.static.create_parameter([1], "float32")
    opt = paddle_amp.decorate(paddle.optimizer.SGD(0.1), lists)
    opt.minimize(paddle.mean(b) + paddle.mean(w * w))
    scales = [d for d in opt.cast_report().decisions if d.op == "scale"]
    assert [s.run_dtype for s in scales] == ["float16", "float32"]


@pytest.mark.legacy_ir
def test_separate_eval_program_is_rewritten_with_use_fp16_test(static):
    x = paddle.static.data("x", [None, 8], "float32")
    out = paddle.scale(paddle.static.nn.fc(x, 4), 2.0)
    test_program = static.main.clone(for_test=True)  # before minimize: still fp32
    lists = paddle_amp.AutoMixedPrecisionLists(custom_white_list=["scale"])
    opt = paddle_amp.decorate(paddle.optimizer.SGD(0.1), lists)
    opt.minimize(paddle.mean(out))
    static.exe.run(static.startup)
    opt.amp_init(paddle.CPUPlace(), test_program=test_program, use_fp16_test=True)
    scale = [d for d in paddle_amp.cast_report(test_program).decisions if d.op == "scale"][0]
    assert scale.run_dtype == "float16"
    feed = {"x": np.ones((2, 8), "float32")}
    evaluated, = static.exe.run(test_program, feed=feed, fetch_list=[out.name])
    trained, = static.run(feed, [out])
    assert np.array_equal(evaluated, trained)


@pytest.mark.legacy_ir
def test_amp_init_converts_each_low_param_once(static, monkeypatch):
    """Planned as on a GPU (our kernel query says every kernel exists), O2 declares the fc
    weights bf16 and amp_init converts them in the scope; a second amp_init (or one after
    loading an O2 checkpoint) must not convert bf16 bits again."""
    monkeypatch.setattr("paddle_amp.speed.device_profile",
                        lambda device, dtype, probe, training=True: DeviceProfile(None))
    _, loss = _layernorm_model()
    opt = paddle_amp.decorate(paddle.optimizer.Momentum(0.05, multi_precision=True),
                              level="O2", dtype="bfloat16")
    opt.minimize(loss)
    static.exe.run(static.startup)
    name = sorted(opt._low_params)[0]
    fp32 = np.array(static.scope.find_var(name).get_tensor())
    opt.amp_init(paddle.CPUPlace())
    once = np.array(static.scope.find_var(name).get_tensor())
    opt.amp_init(paddle.CPUPlace())
    twice = np.array(static.scope.find_var(name).get_tensor())
    expected = ((fp32.view(np.uint32) + 0x7FFF + ((fp32.view(np.uint32) >> 16) & 1)) >> 16)
    np.testing.assert_array_equal(once, expected.astype(np.uint16))  # round to nearest even
    np.testing.assert_array_equal(twice, once)
