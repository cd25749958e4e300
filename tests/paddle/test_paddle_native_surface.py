"""paddle_amp as a drop-in for the whole of ``paddle.static.amp``, tested the way Paddle
tests its AMP (test_amp_list.py, test_fp16_utils.py, test_bf16_utils.py, the decorate
helpers that always pass master_grad/use_promote), against our modules, on CPU.
"""
import inspect

import numpy as np
from amp_adapters.rules.device import DeviceProfile
import paddle
import pytest
from hypothesis import given, settings, strategies as st
from paddle.base import core

import paddle_amp
from amp_adapters import ConflictingOpError, NotSupportedError, Policy, categorize
from paddle_helpers import batch, forward_ops, mlp, native_surface, pir_mode

pytestmark = pytest.mark.skipif(pir_mode(), reason=(
    "the native whole-program utilities (fp16_utils, bf16, cast_model_to_fp16) and these "
    "checks read legacy program ops (op.type, var descs); Paddle 3.3.1's own versions "
    "have no PIR branch either"))

_surface = native_surface()
missing, signature_gaps, method_gaps = (_surface.missing, _surface.signature_gaps,
                                       _surface.method_gaps)

FP16, BF16, FP32 = (core.VarDesc.VarType.FP16, core.VarDesc.VarType.BF16,
                    core.VarDesc.VarType.FP32)
MODULES = ["", ".bf16", ".bf16.amp_lists", ".bf16.amp_utils", ".bf16.decorator",
           ".fp16_utils", ".fp16_lists", ".debugging", ".decorator", ".amp_nn",
           ".function_overload"]


@pytest.mark.parametrize("sub", MODULES)
def test_every_native_public_name_exists_at_the_same_path(sub):
    gaps = missing("paddle.static.amp" + sub, "paddle.static.amp", "paddle_amp" + sub)
    assert not gaps, f"native names missing from paddle_amp{sub}: {gaps}"


@pytest.mark.parametrize("sub", MODULES)
def test_every_native_function_takes_its_parameters_in_the_native_order(sub):
    """A call by position or by the native's keyword binds as natively (init_trainer's
    ``optimizer_or_trainer``, cast_model_to_bf16's ``startup_prog``)."""
    gaps = signature_gaps("paddle.static.amp" + sub, "paddle.static.amp", "paddle_amp" + sub)
    assert not gaps, gaps


def test_the_decorated_optimizer_takes_the_natives_method_parameters():
    """``amp_init(place, scope, test_program, use_fp16_test, rewrite_master_weight)`` and the
    rest bind by position and keyword as natively; the bf16 decorator's fourth parameter,
    ``use_bf16_test``, is the same flag, and its keyword is taken too."""
    from paddle.static.amp import decorator as native
    gaps = method_gaps(native.OptimizerWithMixedPrecision,
                       paddle_amp.decorator.OptimizerWithMixedPrecision)
    assert not gaps, gaps
    assert "use_bf16_test" in inspect.signature(
        paddle_amp.decorator.OptimizerWithMixedPrecision.amp_init).parameters


def test_unsupported_internals_say_why_and_what_instead():
    with pytest.raises(NotSupportedError, match="core planner.*Use cast_model_to_fp16"):
        paddle_amp.fp16_utils.get_amp_dst_dtype(None, None, "O1", None, None, set(), set())


# -- AutoMixedPrecisionLists (test_amp_list.py style) --------------------------------------

@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_default_sets_are_the_native_sets(dtype):
    ours, native = (paddle_amp.AutoMixedPrecisionLists(dtype=dtype),
                    paddle.static.amp.AutoMixedPrecisionLists(dtype=dtype))
    for attr in ("white_list", "black_list", "gray_list"):
        assert getattr(ours, attr) == getattr(native, attr), attr
    assert ours.black_varnames is None and ours.amp_dtype == dtype


def test_custom_lists_move_ops_as_natively():
    kw = dict(custom_white_list={"exp", "relu"}, custom_black_list={"matmul_v2", "scale"},
              custom_black_varnames={"x"})
    ours, native = (paddle_amp.AutoMixedPrecisionLists(**kw),
                    paddle.static.amp.AutoMixedPrecisionLists(**kw))
    for attr in ("white_list", "black_list", "gray_list"):
        assert getattr(ours, attr) == getattr(native, attr), attr
    assert {"matmul_v2", "scale"} <= ours.unsupported_list
    assert ours.black_varnames == {"x"}
    assert paddle_amp.CustomOpLists is paddle_amp.AutoMixedPrecisionLists


def test_bf16_lists_are_the_native_bf16_lists():
    kw = dict(custom_bf16_list={"relu"}, custom_fp32_list={"elementwise_mul"})
    ours = paddle_amp.bf16.AutoMixedPrecisionListsBF16(**kw)
    native = paddle.static.amp.bf16.AutoMixedPrecisionListsBF16(**kw)
    for attr in ("bf16_list", "fp32_list", "gray_list", "bf16_initializer_list"):
        assert getattr(ours, attr) == getattr(native, attr), attr
    with pytest.raises(ValueError):
        paddle_amp.bf16.AutoMixedPrecisionListsBF16({"relu"}, {"relu"})


@pytest.mark.parametrize("call", [
    lambda m: m.AutoMixedPrecisionLists(custom_white_list={"exp"}, custom_black_list={"exp"}),
    lambda m: m.AutoMixedPrecisionLists(dtype="float32"),
    lambda m: m.AutoMixedPrecisionLists(dtype="int8"),
])
def test_native_validation_errors(call):
    with pytest.raises(ValueError) as native:
        call(paddle.static.amp)
    with pytest.raises(ValueError) as ours:
        call(paddle_amp)
    if "dtype" in str(native.value):
        assert str(ours.value) == str(native.value)
    else:
        assert isinstance(ours.value, ConflictingOpError) and "'exp'" in str(ours.value)


def _scale_model():
    """fc -> scale -> fc: scale has CPU fp16 kernels (gray natively), mul has none."""
    x = paddle.static.data("x", [None, 8], "float32")
    y = paddle.static.data("y", [None, 1], "float32")
    h = paddle.scale(paddle.static.nn.fc(x, 16), 0.5)
    diff = paddle.static.nn.fc(h, 1) - y
    return paddle.mean(diff * diff)


def _abs(x):
    """An ``abs`` op (in no native list), appended directly: Paddle 3's ``paddle.abs`` rejects
    legacy-IR Variables."""
    block = x.block
    out = block.create_var(name=x.name + ".abs", dtype=x.dtype, shape=x.shape)
    block.append_op(type="abs", inputs={"X": [x]}, outputs={"Out": [out]})
    return out


def _decisions(opt):
    return {d.op: d for d in opt.cast_report().decisions}


def test_in_place_edits_of_the_live_sets_take_effect(static):
    loss = _scale_model()
    lists = paddle_amp.AutoMixedPrecisionLists()
    assert lists.white_list is lists.white_list  # one live set, not a copy per access
    lists.white_list.add("scale")
    lists.gray_list.discard("scale")
    opt = paddle_amp.decorate(paddle.optimizer.SGD(0.1), lists)
    opt.minimize(loss)
    assert _decisions(opt)["scale"].run_dtype == "float16"


def test_in_place_black_list_add_wins_over_white(static):
    loss = _scale_model()
    lists = paddle_amp.AutoMixedPrecisionLists(custom_white_list=["scale"])
    lists.black_list.add("scale")  # natively black is checked first
    opt = paddle_amp.decorate(paddle.optimizer.SGD(0.1), lists)
    opt.minimize(loss)
    d = _decisions(opt)["scale"]
    assert d.category == "fp32" and d.run_dtype == "float32"


# -- decorate: the native arguments, native defaults -----------------------------------------

def test_decorate_takes_every_native_argument_at_its_default(static):
    loss = _scale_model()
    opt = paddle_amp.decorate(paddle.optimizer.Adam(1e-3), amp_lists=None, level="O1",
                              dtype="float16", master_weight=None, master_grad=False,
                              init_loss_scaling=2.0**16, incr_every_n_steps=2000,
                              decr_every_n_nan_or_inf=1, incr_ratio=2.0, decr_ratio=0.5,
                              use_dynamic_loss_scaling=None, use_amp_guard=False,
                              use_promote=False)
    opt.minimize(loss)
    static.exe.run(static.startup)
    opt.amp_init(paddle.CPUPlace())
    assert np.isfinite(static.run(batch(0), [loss])[0])
    assert opt.policy.defaults == "native"  # no policy=: the native's default lists


def test_without_policy_the_decisions_are_the_natives(static):
    x = paddle.static.data("x", [None, 8], "float32")
    h = paddle.nn.functional.relu(_abs(paddle.scale(x, 2.0)))
    loss = paddle.mean(h)
    w = paddle.static.create_parameter([1], "float32")
    opt = paddle_amp.decorate(paddle.optimizer.SGD(0.1))
    opt.minimize(loss + paddle.mean(w * w))
    d = _decisions(opt)
    assert d["relu"].category == "promote"  # native gray (the shared O1 says follow)
    assert d["abs"].category == "fp32"      # in no native list: the native's O1 runs it fp32
    assert d["reduce_mean"].category == "fp32"  # in no native list either


def test_use_promote_promotes_unlisted_ops(static):
    x = paddle.static.data("x", [None, 8], "float32")
    loss = paddle.mean(_abs(paddle.scale(x, 2.0)))
    w = paddle.static.create_parameter([1], "float32")
    opt = paddle_amp.decorate(paddle.optimizer.SGD(0.1), use_promote=True)
    opt.minimize(loss + paddle.mean(w * w))
    assert _decisions(opt)["abs"].category == "promote"


def test_level_od_runs_only_white_ops_low(static):
    loss = _scale_model()
    opt = paddle_amp.decorate(paddle.optimizer.SGD(0.1), level="OD")
    opt.minimize(loss)
    d = _decisions(opt)
    assert d["mul"].category == "lower"
    assert d["scale"].category == d["elementwise_sub"].category == "fp32"
    assert opt.policy.level == "OD"


@pytest.mark.parametrize("policy", ["O1", Policy.preset("O1")])
def test_policy_by_name_or_object_is_the_shared_policy(static, policy, tmp_path):
    loss = _scale_model()
    opt = paddle_amp.decorate(paddle.optimizer.SGD(0.1), policy=policy)
    opt.minimize(loss)
    assert opt.policy == Policy.preset("O1") and opt.policy.defaults == "shared"
    assert _decisions(opt)["mul"].canonical == "matmul"


def test_policy_from_a_toml_file(static, tmp_path):
    f = tmp_path / "policy.toml"
    f.write_text('preset = "O1"\n[ops.paddle]\nlower = ["scale"]\n')
    loss = _scale_model()
    opt = paddle_amp.decorate(paddle.optimizer.SGD(0.1), policy=str(f))
    opt.minimize(loss)
    assert _decisions(opt)["scale"].run_dtype == "float16"


def test_master_grad_gives_the_optimizer_fp32_grads_of_low_params(static, monkeypatch):
    """Planned as on a GPU (every kernel exists, the optimizer keeps its own native masters),
    O2 declares the fc weights fp16; with master_grad=True the optimizer reads fp32 gradients
    for them, without it fp16 ones. (On a CPU the emulated masters always take fp32 gradients:
    tests/paddle/test_paddle_o2_masters.py.)"""
    monkeypatch.setattr("paddle_amp.speed.device_profile",
                        lambda device, dtype, probe, training=True: DeviceProfile(None))
    monkeypatch.setattr("paddle_amp.decorator.current_device", lambda: "GPU")
    dtypes = {}
    for master_grad in (False, True):
        main, startup = paddle.static.Program(), paddle.static.Program()
        with paddle.static.program_guard(main, startup):
            loss = _scale_model()
            opt = paddle_amp.decorate(paddle.optimizer.Momentum(0.1, multi_precision=True),
                                      level="O2", master_grad=master_grad)
            opt.minimize(loss)
        assert opt._low_params
        grads = [op.input("Grad")[0] for block in main.blocks for op in block.ops
                 if op.type == "momentum" and op.input("Param")[0] in opt._low_params]
        dtypes[master_grad] = {main.global_block().var(g).dtype for g in grads}
    assert dtypes == {False: {FP16}, True: {FP32}}


# -- whole-program casts (test_fp16_utils.py / test_bf16_utils.py style) ----------------------

def test_cast_model_to_fp16_on_a_built_program(static):
    """O2 on CPU: mul has no fp16 kernel here (it stays fp32, instead of the native's fp16 op
    that would fail at run time); the scales after it have one, but between float32
    neighbours (the fc, the program's float32 output) they follow them: no cast down and
    back for nothing (issue 38.8). Fed float16 data, the same scales run in fp16, uncast."""
    x = paddle.static.data("x", [None, 8], "float32")
    x16 = paddle.static.data("x16", [None, 8], "float16")
    with paddle.static.program_guard(static.main, static.startup):
        h = paddle.scale(paddle.scale(paddle.static.nn.fc(x, 4), 2.0), 0.5)
        h16 = paddle.scale(paddle.scale(x16, 2.0), 0.5)
    to_fp16 = paddle.static.amp.cast_model_to_fp16  # noqa: F841 (the native, for the record)
    names = paddle_amp.cast_model_to_fp16(static.main, use_fp16_guard=False)
    ops = [op.type for op in static.main.global_block().ops]
    assert "cast" not in ops
    block = static.main.global_block()
    assert (block.var(h.name).dtype, block.var(h16.name).dtype) == (FP32, FP16)
    assert names == set()  # fc's weight feeds mul, which has no fp16 kernel here: stays fp32
    static.exe.run(static.startup)
    paddle_amp.cast_parameters_to_fp16(paddle.CPUPlace(), static.main, to_fp16_var_names=names)
    out, out16 = static.run({"x": np.ones((2, 8), "float32"),
                             "x16": np.ones((2, 8), "float16")}, [h, h16])
    assert (out.dtype, out16.dtype) == (np.float32, np.float16)
    assert np.all(np.isfinite(out)) and np.all(out16 == 1.0)
    scales = [d for d in paddle_amp.cast_report(static.main).decisions if d.op == "scale"]
    assert [d.run_dtype for d in scales] == ["float32", "float32", "float16", "float16"]


def test_cast_parameters_converts_the_named_parameters_once(static):
    x = paddle.static.data("x", [None, 4], "float32")
    w = paddle.static.create_parameter([4], "float32", name="w_fp16")
    paddle.mean(x * w)
    static.exe.run(static.startup)
    before = np.array(static.scope.find_var("w_fp16").get_tensor())
    for _ in range(2):
        paddle_amp.cast_parameters_to_fp16(paddle.CPUPlace(), static.main, static.scope,
                                           {"w_fp16"})
    after = np.array(static.scope.find_var("w_fp16").get_tensor())
    assert after.dtype == np.float16 and np.array_equal(after, before.astype(np.float16))


def test_find_prev_and_post_ops_like_the_native(static):
    x = paddle.static.data("x", [None, 4], "float32")
    a = paddle.scale(x, 2.0)
    b = paddle.scale(a, 3.0)
    paddle.scale(a, 4.0)
    ops = static.main.global_block().ops
    for mod in (paddle.static.amp.fp16_utils, paddle_amp.fp16_utils):
        assert mod.find_true_prev_op(ops, ops[1], a.name) is ops[0]
        assert mod.find_true_post_op(ops, ops[0], a.name) == [ops[1], ops[2]]
        assert mod.find_true_post_op(ops, ops[1], b.name) == []
        block = static.main.global_block().desc
        assert mod.find_op_index(block, ops[2].desc) == 2


def test_rewrite_program_bf16_casts_in_front_of_bf16_ops(static):
    """bf16 O1 with elementwise_mul in the bf16 list (it has a CPU bf16 kernel): its inputs
    are cast to bf16, the fp32 op after it gets a cast back; the program runs."""
    x = paddle.static.data("x", [None, 4], "float32")
    w = paddle.static.create_parameter([4], "float32")
    out = paddle.mean(x * w)
    lists = paddle_amp.bf16.AutoMixedPrecisionListsBF16(custom_bf16_list={"elementwise_mul"})
    paddle_amp.bf16.rewrite_program_bf16(static.main, lists)
    block = static.main.global_block()
    mul = forward_ops(static.main, "elementwise_mul")[0]
    assert all(block.var(n).dtype == BF16 for n in mul.input_arg_names)
    assert block.var(mul.output("Out")[0]).dtype == BF16
    mean = forward_ops(static.main, "reduce_mean")[0]
    assert block.var(mean.input("X")[0]).dtype == FP32
    static.exe.run(static.startup)
    got, = static.run({"x": np.ones((2, 4), "float32")}, [out])
    assert np.isfinite(got)


def test_cast_model_to_bf16_and_decorate_bf16(static):
    x = paddle.static.data("x", [None, 4], "float32")
    with paddle_amp.bf16.bf16_guard():
        h = paddle.scale(x, 2.0)
    loss = paddle.mean(paddle.scale(h, 3.0))
    names = paddle_amp.bf16.cast_model_to_bf16(static.main, use_bf16_guard=True)
    scales = [d for d in paddle_amp.cast_report(static.main).decisions if d.op == "scale"]
    # the guarded scale, between float32 neighbours, follows them (issue 38.8); the other
    # is outside the guard
    assert [s.run_dtype for s in scales] == ["float32", "float32"]
    assert "none of its readers computes in bfloat16" in scales[0].reason
    assert "outside fp16_guard" in scales[1].reason
    assert names == set()
    assert np.isfinite(static.exe.run(static.main, feed={"x": np.ones((2, 4), "float32")},
                                      fetch_list=[loss])[0])
    main, startup = paddle.static.Program(), paddle.static.Program()
    with paddle.static.program_guard(main, startup):
        loss = mlp()[-1]
        opt = paddle_amp.bf16.decorate_bf16(paddle.optimizer.SGD(0.1))
        opt.minimize(loss)
    assert opt.policy.dtype == "bfloat16" and opt.policy.level == "O1"


def test_cast_model_to_bf16_with_a_startup_program_initializes_bf16_parameters(static):
    """As natively: with the startup program, a parameter that only bf16 ops read and that a
    fill_constant initializes is made in bf16 there (nothing left to convert)."""
    x = paddle.static.data("x", [None, 4], "float32")
    w = paddle.static.create_parameter([4], "float32", name="w",
                                       default_initializer=paddle.nn.initializer.Constant(0.5))
    out = paddle.scale(x * w, 2.0)  # `*`: Paddle 3.3.1 legacy IR has no paddle.multiply
    lists = paddle_amp.bf16.AutoMixedPrecisionListsBF16(custom_bf16_list={"elementwise_mul"})
    names = paddle_amp.bf16.cast_model_to_bf16(static.main, static.startup, lists,
                                               use_bf16_guard=False)
    assert names == set()  # made in bf16 by its initializer, not to be converted
    init, = [op for op in static.startup.global_block().ops if "w" in op.output_arg_names]
    assert init.type == "fill_constant" and init.attr("dtype") == BF16
    assert static.startup.global_block().var("w").dtype == BF16
    assert static.main.global_block().var("w").dtype == BF16
    static.exe.run(static.startup)
    got, = static.run({"x": np.ones((2, 4), "float32")}, [out])
    np.testing.assert_allclose(np.asarray(got, np.float32) if got.dtype != np.uint16 else
                               (got.astype(np.uint32) << 16).view(np.float32), 1.0)


def test_convert_float_to_uint16_is_the_native_truncation():
    x = np.array([[1.0, -2.5], [3.14159, 1e-30]], dtype=np.float32)
    np.testing.assert_array_equal(paddle_amp.bf16.convert_float_to_uint16(x),
                                  paddle.static.amp.bf16.convert_float_to_uint16(x))


# -- properties: the list objects against the native ones --------------------------------------


_POOL = ["matmul_v2", "mul", "exp", "relu", "scale", "elementwise_add", "softmax", "abs",
         "concat", "layer_norm", "lookup_table_v2", "fused_attention"]
_names = st.sets(st.sampled_from(_POOL), max_size=4)


@settings(max_examples=40, deadline=None, derandomize=True)
@given(white=_names, black=_names, dtype=st.sampled_from(["float16", "bfloat16"]))
def test_custom_lists_match_the_native_object(white, black, dtype):
    kw = dict(custom_white_list=white or None, custom_black_list=black or None, dtype=dtype)
    try:
        native = paddle.static.amp.AutoMixedPrecisionLists(**kw)
    except ValueError:
        with pytest.raises(ValueError):
            paddle_amp.AutoMixedPrecisionLists(**kw)
        return
    ours = paddle_amp.AutoMixedPrecisionLists(**kw)
    assert (ours.white_list, ours.black_list, ours.gray_list) == \
        (native.white_list, native.black_list, native.gray_list)


@settings(max_examples=40, deadline=None, derandomize=True)
@given(edits=st.lists(st.tuples(st.sampled_from(["white_list", "black_list", "gray_list"]),
                                st.sampled_from(["add", "discard"]), st.sampled_from(_POOL)),
                      max_size=6),
       use_promote=st.booleans())
def test_in_place_edits_decide_like_the_native_precedence(edits, use_promote):
    """Whatever is edited in place, the policy decorate builds puts each op where Paddle's
    rewrite would: black > white > gray, else fp32 (promote with use_promote)."""
    from paddle_amp.config import native_policy
    lists = paddle_amp.AutoMixedPrecisionLists()
    for attr, how, op in edits:
        getattr(getattr(lists, attr), how)(op)
    policy = native_policy(lists, "float16", "O1", use_promote)
    for op in _POOL:
        want = ("fp32" if op in lists.black_list else "lower" if op in lists.white_list
                else "promote" if op in lists.gray_list or use_promote else "fp32")
        assert categorize(policy, "paddle", op).category == want, op


@pytest.mark.parametrize("bf16, fp32", [({"exp"}, None), ({"tanh"}, None), ({"lstm"}, None),
                                        (None, {"matmul_v2"}), (None, {"lstm"}),
                                        (None, {"reshape2"}), ({"reshape2"}, None)])
def test_bf16_custom_lists_move_ops_as_natively(bf16, fp32):
    ours = paddle_amp.bf16.AutoMixedPrecisionListsBF16(bf16, fp32)
    native = paddle.static.amp.bf16.AutoMixedPrecisionListsBF16(bf16, fp32)
    assert (ours.bf16_list, ours.fp32_list, ours.gray_list) == \
        (native.bf16_list, native.fp32_list, native.gray_list)


def test_graph_helpers_on_edge_cases(static):
    block = static.main.global_block()
    for mod in (paddle.static.amp.fp16_utils, paddle_amp.fp16_utils):
        assert mod.find_op_index(block.desc, core.OpDesc()) == -1  # not in the block
    x = block.create_var(name="X", shape=[3], dtype="float32")
    y = block.create_var(name="Y", shape=[3], dtype="float32")
    init = static.startup.global_block()._prepend_op(
        type="fill_constant", outputs={"Out": x},
        attrs={"shape": x.shape, "dtype": x.dtype, "value": 1.0})
    op = block.append_op(type="abs", inputs={"X": [x]}, outputs={"Out": [y]})
    for mod in (paddle.static.amp.bf16.amp_utils, paddle_amp.bf16.amp_utils):
        assert mod.find_true_post_op(block.ops, init, "X") == []  # init is not in these ops
        assert mod.find_true_post_op(block.ops, init, "X", search_all=True) == [op]


def test_level_od_ignores_amp_lists_as_natively(static, caplog):
    loss = _scale_model()
    lists = paddle_amp.AutoMixedPrecisionLists(custom_white_list={"scale"})
    with caplog.at_level("WARNING", logger="paddle_amp"):
        opt = paddle_amp.decorate(paddle.optimizer.SGD(0.1), lists, level="OD")
    assert "amp_lists are not used" in caplog.text
    opt.minimize(loss)
    assert _decisions(opt)["scale"].category == "fp32"


def _native_style_script(amp):
    """Code written against ``paddle.static.amp`` (passed in as ``amp``): the native lists
    edited in place, every native decorate argument, the bf16 and fp16_utils helpers."""
    main, startup, scope = paddle.static.Program(), paddle.static.Program(), paddle.static.Scope()
    with paddle.static.program_guard(main, startup), paddle.static.scope_guard(scope):
        _, _, loss = mlp()
        lists = amp.AutoMixedPrecisionLists(custom_white_list={"scale"})
        lists.black_list.add("elementwise_pow")
        opt = amp.decorate(paddle.optimizer.Momentum(0.05), amp_lists=lists, level="O1",
                           dtype="float16", master_weight=None, master_grad=False,
                           init_loss_scaling=1024.0, incr_every_n_steps=1000,
                           decr_every_n_nan_or_inf=2, incr_ratio=2.0, decr_ratio=0.5,
                           use_dynamic_loss_scaling=True, use_amp_guard=False,
                           use_promote=False)
        opt.minimize(loss)
        exe = paddle.static.Executor(paddle.CPUPlace())
        exe.run(startup)
        opt.amp_init(paddle.CPUPlace(), scope=scope)
        losses = [float(exe.run(main, feed=batch(i % 3), fetch_list=[loss])[0])
                  for i in range(15)]
        ops = main.global_block().ops
        first_out = ops[0].output_arg_names[0]
        assert amp.fp16_utils.find_true_post_op(ops, ops[0], first_out)
        bits = amp.bf16.convert_float_to_uint16(np.ones((2,), "float32"))
    return losses, bits


def test_a_native_style_script_runs_with_only_the_import_changed(static):
    native_losses, native_bits = _native_style_script(paddle.static.amp)
    ours_losses, ours_bits = _native_style_script(paddle_amp)
    for losses in (native_losses, ours_losses):
        assert np.all(np.isfinite(losses)) and losses[-1] < losses[0]
    np.testing.assert_array_equal(ours_bits, native_bits)
