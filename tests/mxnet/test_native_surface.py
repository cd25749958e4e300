"""mxnet_amp as a drop-in for the whole of ``mxnet.contrib.amp``, tested the way MXNet tests
its AMP (tests/python/gpu/test_contrib_amp.py: the structure of converted symbols, dtypes
after convert_model, list contents, the loss scaler), against our modules, on CPU.
"""
import importlib.util
from pathlib import Path

import mxnet as mx
import numpy as np
import pytest
from mxnet import gluon
from mxnet.contrib import amp as native

import mxnet_amp as amp
from amp_adapters import (ConflictingOpError, DynamicLossScale, OpLists, OverflowGuardError,
                          Policy)

# tests/native_surface.py, loaded by path: putting tests/ on sys.path would make the
# tests/mxnet folder importable as "mxnet" where MXNet is not installed
_spec = importlib.util.spec_from_file_location(
    "native_surface", Path(__file__).resolve().parents[1] / "native_surface.py")
_surface = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_surface)
missing, signature_gaps = _surface.missing, _surface.signature_gaps

BF16 = native.amp.bfloat16


@pytest.fixture(autouse=True)
def _reset():
    amp.reset()
    yield
    amp.reset()


MODULES = ["", ".amp", ".lists", ".lists.symbol_fp16", ".lists.symbol_bf16", ".loss_scaler"]


@pytest.mark.parametrize("sub", MODULES)
def test_every_native_public_name_exists_at_the_same_path(sub):
    gaps = missing("mxnet.contrib.amp" + sub, "mxnet.contrib.amp", "mxnet_amp" + sub)
    assert not gaps, f"native names missing from mxnet_amp{sub}: {gaps}"


@pytest.mark.parametrize("sub", MODULES)
def test_every_native_function_takes_its_parameters_in_the_native_order(sub):
    """A call by position or by the native's keyword binds as natively (init_trainer's
    ``optimizer_or_trainer``, cast_model_to_bf16's ``startup_prog``)."""
    gaps = signature_gaps("mxnet.contrib.amp" + sub, "mxnet.contrib.amp", "mxnet_amp" + sub)
    assert not gaps, gaps


@pytest.mark.parametrize("ours, theirs", [
    (amp.lists.symbol_fp16, native.lists.symbol_fp16),
    (amp.lists.symbol_bf16, native.lists.symbol_bf16)])
def test_list_modules_hold_the_native_lists(ours, theirs):
    for name in vars(theirs):
        if name.isupper():
            mine, native_value = getattr(ours, name), getattr(theirs, name)
            if isinstance(native_value, dict):
                assert mine == native_value, name
            else:
                assert sorted(map(str, mine)) == sorted(map(str, native_value)), name


@pytest.mark.parametrize("fn", ["list_lp16_ops", "list_fp32_ops", "list_lp16_fp32_ops",
                                "list_widest_type_cast", "list_loss_output_functions",
                                "list_conditional_fp32_ops", "list_lp16_use_fp32_params"])
@pytest.mark.parametrize("dtype", ["float16", BF16])
def test_list_helpers_answer_the_native_defaults_without_init(fn, dtype):
    ours, theirs = getattr(amp, fn)(dtype), getattr(native, fn)(dtype)
    if theirs is None or isinstance(theirs, dict):
        assert ours == theirs
    else:
        assert sorted(map(str, ours)) == sorted(map(str, theirs))


def test_init_without_policy_uses_the_native_lists():
    policy = amp.init()
    assert policy == Policy.preset("mxnet-native")
    assert sorted(amp.list_lp16_ops("float16")) == sorted(native.list_lp16_ops("float16"))
    assert mx.nd.FullyConnected.__name__ == "FullyConnected"  # wrapped (functools.wraps)
    assert hasattr(mx.nd.FullyConnected, "__amp_original__")
    assert not hasattr(mx.np.exp, "__amp_original__")  # natively mx.np is not patched


def test_an_op_in_a_list_and_in_conditional_fp32_ops_is_an_error():
    before = mx.nd.Activation
    with pytest.raises(ConflictingOpError, match="'Activation'.*conditional_fp32"):
        amp.init(fp32_ops=["Activation"],
                 conditional_fp32_ops=[("Activation", "act_type", ["softrelu"])])
    assert mx.nd.Activation is before and amp.active_policy() is None


# -- conversion (test_amp_conversion style) --------------------------------------------------

def _scaled_net():
    """x * w (broadcast_mul has CPU fp16 kernels) -> relu -> FullyConnected (no CPU fp16)."""
    x, w = mx.sym.var("data"), mx.sym.var("w")
    h = mx.sym.relu(mx.sym.broadcast_mul(x, w, name="mul"), name="relu")
    return mx.sym.FullyConnected(h, num_hidden=2, name="fc")


def _args():
    return {"w": mx.nd.array(np.linspace(0.5, 1.5, 4).reshape(1, 4)),
            "fc_weight": mx.nd.ones((2, 4)), "fc_bias": mx.nd.zeros((2,))}


def _casts(sym):
    return [(n["name"], n["attrs"]["dtype"]) for n in
            __import__("json").loads(sym.tojson(remove_amp_cast=False))["nodes"]
            if n["op"] == "amp_cast"]


# broadcast_mul runs in the widest dtype of its inputs natively; the native convert_* refuses
# it in target_dtype_ops (an AssertionError), a policy lowers it. ctx: plan for this CPU
# (FullyConnected has no float16 kernel here); without it convert_symbol is device-free.
MUL_LOW = {"policy": Policy.preset("mxnet-native", mxnet_ops=OpLists(lower=["broadcast_mul"])),
           "ctx": mx.cpu()}


def test_convert_refuses_a_widest_type_op_in_its_lists_as_natively():
    with pytest.raises(AssertionError, match="broadcast_mul"):
        amp.convert_symbol(_scaled_net(), target_dtype_ops=["broadcast_mul"])


def test_convert_symbol_structure():
    sym = amp.convert_symbol(_scaled_net(), **MUL_LOW)
    casts = _casts(sym)
    # data and w to fp16 for the mul; the fc (no CPU fp16 kernel) reads fp32 again
    assert sorted(d for _, d in casts) == ["float16", "float16", "float32"]
    assert sym.list_arguments() == _scaled_net().list_arguments()
    assert sym.get_internals()["mul_output"].infer_type(data="float32", w="float32")[1][0] \
        == np.float16


@pytest.mark.parametrize("cast_optional_params", [False, True])
def test_convert_model_returns_params_in_the_graphs_dtype(cast_optional_params):
    args = _args()
    sym, arg_params, aux_params = amp.convert_model(
        _scaled_net(), args, {}, cast_optional_params=cast_optional_params, **MUL_LOW)
    low = np.float16 if cast_optional_params else np.float32
    assert arg_params["w"].dtype == low  # w only feeds the fp16 mul
    assert arg_params["fc_weight"].dtype == np.float32  # the fc stays fp32 here
    attrs = sym.attr_dict()
    # every parameter declares its dtype, as natively (a Module binding data shapes alone
    # then infers them all): w in float16 when it is stored so, else float32
    assert attrs["w"]["__dtype__"] == ("2" if cast_optional_params else "0")
    assert attrs["fc_weight"]["__dtype__"] == "0"
    assert len(_casts(sym)) == (2 if cast_optional_params else 3)  # w's cast is gone
    exe = sym.bind(mx.cpu(), {"data": mx.nd.ones((3, 4)), **arg_params})
    ref = _scaled_net().bind(mx.cpu(), {"data": mx.nd.ones((3, 4)), **_args()})
    np.testing.assert_allclose(exe.forward()[0].asnumpy(), ref.forward()[0].asnumpy(),
                               rtol=1e-3)


def test_convert_hybrid_block_with_cast_optional_params():
    class Scaled(gluon.HybridBlock):
        def __init__(self):
            super().__init__()
            self.w = self.params.get("w", shape=(1, 4), init=mx.init.One())
            self.fc = gluon.nn.Dense(2, in_units=4)

        def hybrid_forward(self, F, x, w):
            return self.fc(F.relu(F.broadcast_mul(x, w)))

    net = Scaled()
    net.initialize()
    net.hybridize()
    x = mx.nd.ones((3, 4))
    ref = net(x)
    converted = amp.convert_hybrid_block(net, policy=MUL_LOW["policy"],
                                         cast_optional_params=True)
    dtypes = {name: p.dtype for name, p in converted.collect_params().items()}
    assert [d for n, d in dtypes.items() if n.endswith("_w")] == [np.float16]
    assert [d for n, d in dtypes.items() if n.endswith("weight")] == [np.float32]
    np.testing.assert_allclose(converted(x).asnumpy(), ref.asnumpy(), rtol=1e-3)


def test_convert_bucketing_module():
    def sym_gen(key):
        data = mx.sym.var("data")
        fc = mx.sym.FullyConnected(mx.sym.relu(data), num_hidden=2, name="fc")
        return mx.sym.SoftmaxOutput(fc, name="softmax"), ("data",), ("softmax_label",)

    mod = mx.mod.BucketingModule(sym_gen, default_bucket_key=4, context=mx.cpu())
    mod.bind(data_shapes=[("data", (3, 4))], label_shapes=[("softmax_label", (3,))],
             for_training=False)
    mod.init_params()
    result = amp.convert_bucketing_module(mod, target_dtype_ops=["relu"])
    assert isinstance(result, mx.mod.BucketingModule)
    result.bind(data_shapes=[("data", (3, 4))], label_shapes=[("softmax_label", (3,))],
                for_training=False)
    batch = mx.io.DataBatch([mx.nd.ones((3, 4))], [mx.nd.zeros((3,))], bucket_key=4,
                            provide_data=[("data", (3, 4))],
                            provide_label=[("softmax_label", (3,))])
    result.forward(batch, is_train=False)
    mod.forward(batch, is_train=False)
    np.testing.assert_allclose(result.get_outputs()[0].asnumpy(),
                               mod.get_outputs()[0].asnumpy(), rtol=1e-3)
    with pytest.raises(TypeError, match="BucketingModule"):
        amp.convert_bucketing_module(gluon.nn.Dense(2))


# -- the loss scaler -----------------------------------------------------------------------

def _params_with_grads(values_per_ctx):
    ctxs = [mx.cpu(i) for i in range(len(values_per_ctx))]
    p = gluon.Parameter("w", shape=(2,))
    p.initialize(ctx=ctxs)
    for g, v in zip(p.list_grad(), values_per_ctx):
        g[:] = v
    return [p]


def test_loss_scaler_moves_without_lag_and_checks_every_device():
    ours, theirs = amp.LossScaler(), native.loss_scaler.LossScaler()
    assert ours.loss_scale == theirs.loss_scale == 2.0**16
    bad = _params_with_grads([[1.0, 1.0], [np.inf, 1.0]])  # inf only on the second device
    assert ours.has_overflow(bad) is True
    assert theirs.has_overflow(bad) is False  # the native checks the first device only
    assert ours.loss_scale == 2.0**15  # used by the very next step
    first_bad = _params_with_grads([[np.nan, 1.0]])
    assert theirs.has_overflow(first_bad) is True and theirs.loss_scale == 2.0**16  # lag
    scaler = amp.LossScaler(DynamicLossScale.from_mxnet(growth_interval=2))
    trace = [False, False, True, False, False, False]
    for found_inf in trace:
        grads = [[np.inf, 0.0]] if found_inf else [[0.0, 0.0]]
        assert scaler.has_overflow(_params_with_grads(grads)) is found_inf
    expected = DynamicLossScale.from_mxnet(growth_interval=2)
    for found_inf in trace:
        expected = expected.adjust(found_inf)
    assert scaler.state == expected and scaler.loss_scale == expected.scale


def test_loss_scaler_asks_the_core_guard_as_the_trainer_does():
    """A scale collapse (no floor, so only the guard stops it) and too many overflows in a row
    raise OverflowGuardError from the LossScaler shim too, naming the parameter."""
    bad = _params_with_grads([[np.inf, 0.0]])
    collapsing = amp.LossScaler(DynamicLossScale.from_mxnet(scale=2.0**-124,
                                                            max_consecutive_skips=None))
    with pytest.raises(OverflowGuardError, match="collapsed") as err:
        for _ in range(8):
            collapsing.has_overflow(bad)
    assert err.value.param_names == ["w"] and collapsing.loss_scale < 2.0**-126
    stuck = amp.LossScaler(DynamicLossScale.from_mxnet(max_consecutive_skips=3))
    assert stuck.has_overflow(bad) and stuck.has_overflow(bad)
    with pytest.raises(OverflowGuardError, match="3 overflow steps in a row"):
        stuck.has_overflow(bad)


def test_excluded_sym_names_and_conditional_ops_in_converted_symbols():
    mul_low = MUL_LOW["policy"]
    sym = amp.convert_symbol(_scaled_net(), excluded_sym_names=["mul"], **MUL_LOW)
    assert [d for _, d in _casts(sym)] == []  # the only fp16 candidate on this CPU is excluded
    x = mx.sym.var("data")
    act = mx.sym.Activation(mx.sym.broadcast_mul(x, x, name="sq"), act_type="softrelu",
                            name="act")
    sym = amp.convert_symbol(act, policy=mul_low)
    # the square runs fp16; softrelu is a native conditional fp32 op: cast back to fp32
    assert sorted(d for _, d in _casts(sym)) == ["float16", "float32"]
    relu = mx.sym.Activation(mx.sym.broadcast_mul(x, x, name="sq"), act_type="relu")
    # relu follows its (fp16) input; the graph's output is handed back in float32
    assert [d for _, d in _casts(amp.convert_symbol(relu, policy=mul_low))] \
        == ["float16", "float32"]


def test_convert_model_planned_for_a_gpu_casts_the_optional_params():
    """Upstream's GPU case, planned for gpu(0) on this CPU build (structure only, nothing
    runs): FullyConnected is in the native FP16 list, so with cast_optional_params its
    weight and bias are stored in float16 and only the data gets a cast (and the output,
    back to float32)."""
    x = mx.sym.var("data")
    fc = mx.sym.FullyConnected(x, num_hidden=2, name="fc")
    args = {"fc_weight": mx.nd.ones((2, 4)), "fc_bias": mx.nd.zeros((2,))}
    for optional, dtype, casts in ((False, np.float32, 3), (True, np.float16, 1)):
        sym, arg_params, _ = amp.convert_model(fc, dict(args), {}, ctx=mx.gpu(0),
                                               cast_optional_params=optional)
        assert {a.dtype for a in arg_params.values()} == {dtype}
        assert [d for _, d in _casts(sym)] == ["float16"] * casts + ["float32"]


def _backward_compatibility_module():
    """Upstream's test_module_backward_compatibility model: conv, batch norm, dense."""
    conv = mx.sym.Convolution(mx.sym.var("data"), num_filter=10, kernel=(2, 3), stride=(1, 1),
                              name="convolution0")
    bn = mx.sym.BatchNorm(conv, eps=0.001, momentum=0.9, fix_gamma=False,
                          name="conv0_batchnorm")
    fc = mx.sym.FullyConnected(bn, num_hidden=10, name="fullyconnected")
    mod = mx.mod.Module(fc, data_names=["data"], label_names=None, context=mx.cpu())
    mod.bind(data_shapes=[("data", (1, 3, 8, 8))])
    mod.init_params()
    return mod


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_convert_model_leaves_unlisted_ops_to_type_inference(dtype):
    """Upstream's backward-compatibility case (planned for gpu(0): structure only): with
    target_dtype_ops=["Convolution"] FullyConnected is in no list, so it follows its low
    input and its weight is inferred (and returned) in the low dtype, as natively; the
    native converts the same parameters to the same dtypes."""
    mod = _backward_compatibility_module()
    args, auxs = mod.get_params()
    sym, arg_params, aux_params = amp.convert_model(
        mod._symbol, args, auxs, target_dtype=dtype, target_dtype_ops=["Convolution"],
        ctx=mx.gpu(0))
    low = BF16 if dtype == "bfloat16" else np.float16
    internals = sym.get_internals()
    _, types, _ = internals.infer_type_partial(data="float32")
    inferred = dict(zip(internals.list_outputs(), types))
    assert inferred["fullyconnected_weight"] == low and inferred["fullyconnected_output"] == low
    assert arg_params["fullyconnected_weight"].dtype == low
    assert arg_params["convolution0_weight"].dtype == np.float32  # cast inside the graph
    _, ref_args, ref_auxs = native.convert_model(mod._symbol, args, auxs, target_dtype=dtype,
                                                 target_dtype_ops=["Convolution"])
    assert {k: v.dtype for k, v in arg_params.items()} == \
        {k: v.dtype for k, v in ref_args.items()}
    assert {k: v.dtype for k, v in aux_params.items()} == \
        {k: v.dtype for k, v in ref_auxs.items()}
    converted = mx.mod.Module(sym, data_names=["data"], label_names=None, context=mx.cpu())
    converted.bind(data_shapes=[("data", (1, 3, 8, 8))])
    converted.set_params(arg_params, aux_params)  # the Module keeps the inferred dtype
    assert converted.get_params()[0]["fullyconnected_weight"].dtype == low
