"""convert_symbol / convert_model: a graph rewrite driven by plan_op, device-aware."""
import json

import numpy as np
import pytest
import mxnet as mx

import mxnet_amp as amp
from amp_adapters import UnknownChoiceError, UnknownOpError
from mxnet_amp.convert import ConvertListError


def _ops(sym):
    return [n["op"] for n in json.loads(sym.tojson(remove_amp_cast=False))["nodes"]
            if n["op"] != "null"]


def _net():
    data, w = mx.sym.var("data"), mx.sym.var("w")
    h = mx.sym.relu(data, name="act")
    y = mx.sym.FullyConnected(h, w, no_bias=True, num_hidden=3, name="fc1") + \
        mx.sym.FullyConnected(h, w, no_bias=True, num_hidden=3, name="fc2")
    return mx.sym.softmax(y, name="sm")


def _run(sym, args):
    exe = sym.bind(mx.cpu(), {k: mx.nd.array(v) for k, v in args.items()})
    return exe.forward()[0]


def test_lower_op_with_a_cpu_kernel_runs_in_float16_and_others_in_float32():
    sym = amp.convert_symbol(_net(), target_dtype_ops=["relu"], ctx=mx.cpu())
    internals = sym.get_internals()
    _, types, _ = internals.infer_type(data="float32", w="float32")
    dtypes = dict(zip(internals.list_outputs(), types))
    assert dtypes["act_output"] == np.float16  # relu has a float16 CPU kernel
    assert dtypes["fc1_output"] == np.float32  # FullyConnected has none: float32
    assert dtypes["sm_output"] == np.float32
    rs = np.random.RandomState(0)
    args = {"data": rs.uniform(-1, 1, (2, 4)), "w": rs.uniform(-1, 1, (3, 4))}
    np.testing.assert_allclose(_run(sym, args).asnumpy(), _run(_net(), args).asnumpy(),
                               rtol=1e-2, atol=1e-3)


def test_emulated_rewrite_casts_a_shared_weight_once():
    sym = amp.convert_symbol(_net(), emulate=True, ctx=mx.cpu())
    ops = _ops(sym)
    # data, relu output (shared by both FCs) and the shared weight: one round trip each,
    # plus the rounded output of each FC
    assert ops.count("amp_cast") == 2 * (2 + 2)
    assert ops.count("FullyConnected") == 2


def test_convert_model_validates_names_and_keeps_params():
    args = {"w": mx.nd.ones((3, 4))}
    with pytest.raises(UnknownOpError, match="'relux'"):
        amp.convert_model(_net(), args, {}, target_dtype_ops=["relux"])
    sym, arg_params, aux_params = amp.convert_model(_net(), args, {}, target_dtype_ops=["relu"],
                                                    fp32_ops=["FullyConnected"])
    # a new dict (the native overwrites the given one's entries); fp32 arrays are unchanged
    assert arg_params == args and arg_params["w"] is args["w"] and aux_params == {}
    assert "amp_cast" in _ops(sym)
    # target_dtype_ops=["relu"] alone replaces the default low list, as natively: the
    # FullyConnected ops are in no list and follow relu's float16, so w is inferred and
    # returned in float16 (a new array; the given dict keeps its float32 one)
    sym, arg_params, _ = amp.convert_model(_net(), args, {}, target_dtype_ops=["relu"])
    assert arg_params["w"].dtype == np.float16 and args["w"].dtype == np.float32
    assert sym.attr_dict()["w"]["__dtype__"] == "2"
    assert "amp_cast" in _ops(sym)


# -- arguments refused as natively ---------------------------------------------------------------

@pytest.mark.parametrize("call, kind, match", [
    (lambda: amp.convert_symbol("x"), TypeError, "expects a Symbol"),
    (lambda: amp.convert_symbol(_net(), target_dtype="float32"), UnknownChoiceError,
     "target_dtype"),
    (lambda: amp.convert_symbol(_net(), target_dtype_ops=["relux"]), UnknownOpError, "relux"),
    (lambda: amp.convert_model(_net(), [("w", mx.nd.ones((3, 4)))], {}), TypeError, "dicts"),
    (lambda: amp.convert_hybrid_block(_net()), TypeError, "HybridBlock"),
    (lambda: amp.convert_symbol(_net(), excluded_sym_names="fc1"), ConvertListError,
     r"for one name pass \['fc1'\]"),
    (lambda: amp.convert_symbol(_net(), data_names="data"), ConvertListError, "data_names"),
    (lambda: amp.convert_symbol(_net(), fp32_ops="softmax"), ConvertListError, "fp32_ops"),
], ids=["not a symbol", "target_dtype", "unknown op", "arg_params", "not a block",
        "excluded_sym_names str", "data_names str", "fp32_ops str"])
def test_a_refused_argument_is_our_error_and_the_natives_assertion(call, kind, match):
    """The native checks convert_*'s arguments with assert: code written for it catches
    AssertionError. Ours raises its own clear error, which is an AssertionError too. A bare
    string where a list of names goes would read as its characters (excluding nothing)."""
    with pytest.raises(kind, match=match) as info:
        call()
    assert isinstance(info.value, AssertionError)


def test_cast_optional_params_takes_what_the_native_takes():
    sym = amp.convert_symbol(_net(), cast_optional_params=1)
    assert sym.list_outputs() == amp.convert_symbol(_net(), cast_optional_params=True) \
        .list_outputs()
    with pytest.raises(TypeError, match="cast_optional_params"):
        amp.convert_symbol(_net(), cast_optional_params="false")


def test_a_users_cast_before_a_gemm_converts_as_natively():
    """The user's Cast to float16 feeds a FullyConnected whose weights MXNet infers float16;
    the conversion runs the FC in the target dtype and hands its output back in float32."""
    from mxnet.contrib import amp as native
    data = mx.sym.var("data")
    sym = mx.sym.FullyConnected(mx.sym.Cast(data, dtype="float16"), num_hidden=4, name="fc")
    ours, theirs = (m.convert_symbol(sym, target_dtype="bfloat16") for m in (amp, native))
    assert ours.list_outputs() == theirs.list_outputs() == ["fc_output_amp_cast_float32_output"]
    assert _ops(ours).count("amp_cast") == _ops(theirs).count("amp_cast")
