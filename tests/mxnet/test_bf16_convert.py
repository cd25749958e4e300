"""bfloat16 conversion, checked on the graph (ops, dtypes by type inference, cast count) as
MXNet's own AMP tests do; running a bf16 GEMM needs a CPU whose oneDNN has bf16 kernels
(AVX-512, natively with avx512_bf16), so those cases skip elsewhere, by the probe's answer."""
import json

import mxnet as mx
import numpy as np
import pytest
from mxnet import gluon
from mxnet.contrib import amp as native

import mxnet_amp as amp
from mxnet_amp.kernels import has_kernel

BF16 = np.dtype([("bfloat16", np.uint16)])  # how MXNet 1.x spells bfloat16
HAS_BF16_GEMM = has_kernel("FullyConnected", mx.cpu(), "bfloat16")
needs_bf16 = pytest.mark.skipif(
    not HAS_BF16_GEMM, reason="no bfloat16 FullyConnected kernel on this CPU (oneDNN runs "
    "bf16 with AVX-512; natively with avx512_bf16): the probe says so")


def _ops(sym):
    return [n["op"] for n in json.loads(sym.tojson(remove_amp_cast=False))["nodes"]
            if n["op"] != "null"]


def _casts(sym):
    return [n["attrs"]["dtype"] for n in json.loads(sym.tojson(remove_amp_cast=False))["nodes"]
            if n["op"] == "amp_cast"]


def _dtypes(sym, **known):
    internals = sym.get_internals()
    _, types, _ = internals.infer_type_partial(**known)
    return dict(zip(internals.list_outputs(), types))


def _mlp_sym(x=None):
    x = mx.sym.var("data") if x is None else x
    for i in range(3):
        x = mx.sym.relu(mx.sym.FullyConnected(x, num_hidden=8, name=f"fc{i}"))
    return mx.sym.softmax(mx.sym.FullyConnected(x, num_hidden=3, name="out"), name="sm")


def test_convert_symbol_bf16_runs_the_gemms_in_bf16_on_any_machine():
    """Device-free, as natively: the graph the lists ask for, whatever this CPU runs."""
    sym = amp.convert_symbol(_mlp_sym(), target_dtype="bfloat16")
    dtypes = _dtypes(sym, data="float32")
    for i in range(3):
        assert dtypes[f"fc{i}_output"] == BF16
    assert dtypes["sm_output"] == np.float32  # softmax is fp32 in the native bf16 lists
    assert _ops(sym).count("FullyConnected") == 4


def test_bf16_casts_no_more_than_the_natives():
    for optional in (False, True):
        ours = amp.convert_symbol(_mlp_sym(), target_dtype="bfloat16", data_names=["data"],
                                  cast_optional_params=optional)
        theirs = native.convert_symbol(_mlp_sym(), target_dtype="bfloat16",
                                       data_names=["data"], cast_optional_params=optional)
        assert len(_casts(ours)) <= len(_casts(theirs)), optional
        assert set(_casts(ours)) <= {"bfloat16", "float32"}


def _named_casts(sym):
    return sorted((n["name"], n["attrs"]["dtype"]) for n in
                  json.loads(sym.tojson(remove_amp_cast=False))["nodes"] if n["op"] == "amp_cast")


def _head_dtypes(sym):
    return sym.infer_type_partial(data="float32")[1]


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("optional", [False, True])
def test_converted_outputs_are_handed_back_in_float32_with_the_natives_cast_names(dtype,
                                                                                  optional):
    """A low op's output that is a graph output gets a cast back to float32, as natively
    (a bf16 Dense ending a network returns float32 to its caller); every cast is named
    as the native names it, ``<entry>_amp_cast_<dtype>``."""
    x = mx.sym.var("data")
    fc = mx.sym.FullyConnected(x, num_hidden=8, name="dense")
    bn = mx.sym.BatchNorm(fc, name="bn", output_mean_var=True)  # named outputs, one low
    graphs = {"mlp": _mlp_sym(), "fc": fc, "bn": bn,
              "group": mx.sym.Group([_mlp_sym(x), fc, fc])}
    for name, sym in graphs.items():
        ours = amp.convert_symbol(sym, target_dtype=dtype, cast_optional_params=optional)
        theirs = native.convert_symbol(sym, target_dtype=dtype, cast_optional_params=optional)
        assert _named_casts(ours) == _named_casts(theirs), name
        assert ours.list_outputs() == theirs.list_outputs(), name
    assert amp.convert_symbol(fc, target_dtype=dtype).list_outputs() == \
        ["dense_output_amp_cast_float32_output"]
    # an op that names no outputs: the native names its cast by index (relu0_0_...)
    relu = mx.sym.relu(fc, name="relu0")
    ours, theirs = (m.convert_symbol(relu, target_dtype=dtype) for m in (amp, native))
    assert [d for _, d in _named_casts(ours)] == [d for _, d in _named_casts(theirs)]


@needs_bf16
def test_convert_hybrid_block_bf16_returns_float32_as_natively():
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Dense(8, activation="relu"), gluon.nn.Dense(4))
    net.initialize()
    net.hybridize()
    x = mx.nd.random.uniform(shape=(2, 16))
    want = net(x).asnumpy()
    outs = [m.convert_hybrid_block(net, target_dtype="bfloat16", ctx=mx.cpu())(x)
            for m in (amp, native)]
    assert [o.dtype for o in outs] == [np.float32, np.float32]
    np.testing.assert_array_equal(outs[0].asnumpy(), outs[1].asnumpy())
    np.testing.assert_allclose(outs[0].asnumpy(), want, rtol=2 ** -5, atol=2 ** -5)


def test_a_separate_bias_add_casts_the_bias_down_not_the_activation_up():
    """x @ w then + b (a promote op): the fp32 bias is cast once to bf16 and the sum stays
    bf16 for the next GEMM; with two activations fp32 would win (see the core tests)."""
    x, b = mx.sym.var("data"), mx.sym.var("b")
    h = mx.sym.broadcast_add(mx.sym.FullyConnected(x, num_hidden=8, no_bias=True, name="fc"),
                             b, name="add")
    out = mx.sym.FullyConnected(h, num_hidden=2, no_bias=True, name="fc2")
    ours = amp.convert_symbol(out, target_dtype="bfloat16", data_names=["data"])
    theirs = native.convert_symbol(out, target_dtype="bfloat16", data_names=["data"])
    assert _dtypes(ours, data="float32")["add_output"] == BF16
    # the native multicasts to fp32, then casts back; both cast the output to float32
    assert _ops(ours).count("amp_multicast") == 0 < _ops(theirs).count("amp_multicast")
    assert len(_casts(ours)) <= len(_casts(theirs))


def test_convert_model_bf16_cast_optional_params_stores_bf16():
    mod = mx.mod.Module(_mlp_sym(), data_names=["data"], label_names=None)
    mod.bind(data_shapes=[("data", (2, 5))], for_training=False)
    mod.init_params()
    args, auxs = mod.get_params()
    for optional, want in ((False, np.float32), (True, BF16)):
        sym, new_args, _ = amp.convert_model(_mlp_sym(), args, auxs, target_dtype="bfloat16",
                                             cast_optional_params=optional)
        assert new_args["fc1_weight"].dtype == want
        assert sym.attr_dict()["fc1_weight"]["__dtype__"] == ("12" if optional else "0")
        # a Module binds it from the data shape alone: every parameter declares its dtype
        m = mx.mod.Module(sym, data_names=["data"], label_names=None)
        m.bind(data_shapes=[("data", (2, 5))], for_training=False)


@pytest.mark.parametrize("low", ["bfloat16", "float16"])
def test_cast_optional_params_declares_an_input_the_users_casts_read_low(low):
    """A variable read only through the user's own amp_cast to the low dtype is stored so
    (declared in it, the cast kept), as the native does: the user's cast is a cast, not an
    op that follows a free parameter's dtype."""
    data, dtype = mx.sym.var("data"), BF16 if low == "bfloat16" else np.float16
    both_low = mx.sym.Group([mx.sym.amp_cast(data, dtype=dtype), mx.sym.amp_cast(data, dtype=dtype)])
    one_not = mx.sym.Group([mx.sym.amp_cast(data, dtype=dtype),
                            mx.sym.amp_cast(data, dtype="float32")])
    for convert in (amp.convert_symbol, native.convert_symbol):
        for out, want in ((both_low, dtype), (one_not, np.float32)):
            sym = convert(out, data_names=[], target_dtype=low, cast_optional_params=True)
            exe = sym.simple_bind(ctx=mx.cpu(), data=(1, 2))
            assert exe.arg_arrays[0].dtype == want, (convert, want)


def _gluon_mlp():
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Dense(8, activation="relu"), gluon.nn.Dense(3))
    net.initialize()
    net.hybridize()
    net(mx.nd.ones((2, 5)))
    return net


def test_convert_hybrid_block_bf16_follows_the_probe_for_its_ctx():
    """A device is known here: FullyConnected runs bf16 exactly where it has a kernel."""
    net = _gluon_mlp()
    converted = amp.convert_hybrid_block(net, target_dtype="bfloat16", ctx=mx.cpu())
    casts = _casts(converted(mx.sym.var("data")))  # the SymbolBlock's graph
    assert ("bfloat16" in casts) == HAS_BF16_GEMM


def test_cast_optional_params_bf16_on_a_hybrid_block_planned_without_a_device_check():
    net = _gluon_mlp()
    converted = amp.convert_hybrid_block(net, target_dtype="bfloat16", ctx=mx.cpu(),
                                         cast_optional_params=True)
    dtypes = {n: p.dtype for n, p in converted.collect_params().items()}
    weights = [d for n, d in dtypes.items() if n.endswith("weight")]
    assert all(d == (BF16 if HAS_BF16_GEMM else np.float32) for d in weights), dtypes


@needs_bf16
def test_bf16_mlp_runs_and_tracks_fp32():
    net = _gluon_mlp()
    x = mx.nd.random.uniform(shape=(4, 5))
    converted = amp.convert_hybrid_block(net, target_dtype="bfloat16", ctx=mx.cpu())
    # bf16 has an 8-bit mantissa: 2**-8 relative per rounding, a few roundings deep
    np.testing.assert_allclose(converted(x).astype("float32").asnumpy(), net(x).asnumpy(),
                               rtol=2 ** -5, atol=2 ** -6)


def test_a_plan_sees_bf16_inputs():
    """Type inference starts from dtypes declared on the variables (MXNet 1.9.1 drops a bf16
    keyword): bf16 weights and data show as bfloat16 inputs in the plan."""
    from amp_adapters import Policy
    from mxnet_amp._mx import declared, dtype_name
    from mxnet_amp.graph import plan_graph
    x, w = mx.sym.var("data"), mx.sym.var("w")
    sym = mx.sym.relu(mx.sym.FullyConnected(x, w, no_bias=True, num_hidden=3, name="fc"))
    known = {"data": "bfloat16", "w": "bfloat16"}
    internals = declared(sym, known).get_internals()
    types = dict(zip(internals.list_outputs(), internals.infer_type_partial()[1]))
    assert dtype_name(types["fc_output"]) == "bfloat16"
    fc = plan_graph(sym, known, Policy.preset("O1-bf16"), None)[0]
    assert fc.input_dtypes == ("bfloat16", "bfloat16") and fc.run_dtype == "bfloat16"
    assert fc.execution == "planned" and fc.num_casts == 0
