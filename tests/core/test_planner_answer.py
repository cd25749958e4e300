"""plan_op's complete answer: unknown dtypes, kept slots, multicast, emulation round-trips.

Each row is (policy, op, input dtypes, input slot names, kernels) -> the fields a
backend applies; a backend decides nothing of this itself.
"""
import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from amp_adapters.rules.device import DeviceProfile
from amp_adapters import UNKNOWN, Policy, attrs_read, OpCall, plan_op

O1, O2 = Policy.preset("O1"), Policy.preset("O2")
EMU = Policy.preset("O1", emulate=True)
F32, F16, BF16, U = "float32", "float16", "bfloat16", UNKNOWN
NONE = frozenset()

# policy, op, dtypes, names, kernels -> casts, multicast, round_inputs, round_outputs, run
ROWS = [
    # unknown (traced) inputs: "cast if needed" to a run dtype the category fixes
    (O1, "FullyConnected", (U, F16), None, None, (F16, None), False, (False, False), False, F16),
    (O1, "softmax", (U,), None, None, (F32,), False, (False,), False, F32),
    (O1, "FullyConnected", (U, F32), None, NONE, (F32, None), False, (False, False), False, F32),
    # promote with unknowns: the widest is known at run time only -> one multicast
    (O1, "broadcast_add", (F16, U), None, None, (None, None), True, (False, False), False, F32),
    (O1, "broadcast_add", (U, None), None, None, (None, None), False, (False, False), False,
     F32),
    (O1, "broadcast_add", (F16, F32), None, None, (F32, None), False, (False, False), False,
     F32),
    # O2: a follow op with a traced input still goes low
    (O2, "relu", (U,), None, None, (F16,), False, (False,), False, F16),
    # kept slots: never cast, whatever the decision
    (O1, "BatchNorm", (F32, F32, F32, F32, F32),
     ("data", "gamma", "beta", "moving_mean", "moving_var"), None,
     (None,) * 5, False, (False,) * 5, False, F32),
    (O1, "layer_norm", (F16, F16, F16), ("X", "Scale", "Bias"), None,
     (F32, None, None), False, (False,) * 3, False, F32),
    # emulation: fp32 and unknown inputs round-trip, a low input is only upcast (exact)
    (EMU, "FullyConnected", (F32, F16, U), None, NONE,
     (None, F32, None), False, (True, False, True), True, F32),
    (EMU, "FullyConnected", (BF16, F32), None, NONE,
     (None, None), False, (True, True), True, F32),
    (EMU, "FullyConnected", (F32, F32), None, None, (F16, F16), False, (False, False), False,
     F16),  # a kernel here: real fp16, no emulation
    # float64: left alone, nothing to do
    (O1, "FullyConnected", ("float64", U), None, None, (None, None), False, (False, False),
     False, "float64"),
]


@pytest.mark.parametrize("policy,op,dtypes,names,kernels,casts,multicast,rin,rout,run", ROWS)
def test_complete_answer(policy, op, dtypes, names, kernels, casts, multicast, rin, rout, run):
    fw = "paddle" if op == "layer_norm" else "mxnet"
    d = plan_op(policy, fw, OpCall(op, dtypes, input_names=names), device=DeviceProfile(kernels))
    assert (d.casts, d.multicast, d.round_inputs, d.round_outputs, d.run_dtype) == (
        casts, multicast, rin, rout, run)
    assert d.needs_action == (any(c is not None for c in casts) or multicast or any(rin)
                              or rout)


def test_kept_slots_are_reported_as_never_cast():
    d = plan_op(O1, "paddle", OpCall(
        "batch_norm", (F16, F32, F32, F32, F32),
        input_names=("X", "Scale", "Bias", "Mean", "Variance")))
    assert d.kept == (False, True, True, True, True)
    assert d.input_dtypes == (F16, None, None, None, None)  # the report's view
    assert d.kept_outputs == ("MeanOut", "VarianceOut", "SavedMean", "SavedVariance",
                              "ReserveSpace")
    assert plan_op(O1, "paddle", OpCall(
        "batch_norm", (F16, F32))).kept == (False, False)  # no names


def test_device_dependent_only_when_kernels_took_part():
    assert plan_op(O1, "mxnet", OpCall("FullyConnected", (F32,)),
                   device=DeviceProfile(NONE)).device_dependent
    assert plan_op(O1, "mxnet", OpCall("FullyConnected", (F32,))).device_dependent
    assert not plan_op(O1, "mxnet", OpCall("softmax", (F16,)),
                       device=DeviceProfile(NONE)).device_dependent
    assert not plan_op(Policy.preset("O0"), "mxnet", OpCall(
        "FullyConnected", (F32,))).device_dependent


def test_attrs_read_names_what_the_memo_must_key_on():
    assert attrs_read(O1, "mxnet", "Activation") == ("act_type",)
    assert attrs_read(O1, "mxnet", "exp") == ()
    rules = Policy(mxnet_ops=__import__("amp_adapters").OpLists(
        conditional_fp32=(("exp", "foo", ("1",)),)))
    assert attrs_read(rules, "mxnet", "exp") == ("foo",)


dtype = st.sampled_from([F16, BF16, F32, "float64", None, U])


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.sampled_from(["FullyConnected", "softmax", "broadcast_add", "relu", "Activation"]),
       st.lists(dtype, min_size=1, max_size=4), st.sampled_from([O1, O2, EMU]),
       st.sampled_from([None, NONE]))
def test_a_kept_or_non_floating_input_is_never_touched(op, dtypes, policy, kernels):
    d = plan_op(policy, "mxnet", OpCall(op, dtypes), device=DeviceProfile(kernels))
    for dt, c, r in zip(d.input_dtypes, d.casts, d.round_inputs):
        if dt not in (F16, BF16, F32, U):
            assert c is None and not r
        assert not (c is not None and r)  # a rounding replaces the cast
    if d.multicast:
        assert all(c is None for c in d.casts)
    assert d.round_outputs == d.emulated


def test_o2_leaves_a_moved_fp32_parameter_in_fp32():
    """O2 lowers every op not in fp32, except an op that only moves float32 parameters (a
    conv bias through reshape2, kept fp32 by the O2 parameter plan): casting it down gains
    no arithmetic and its reader would cast it back. An activation is lowered as before."""
    from amp_adapters import OpCall, plan_op
    o2 = Policy.preset("O2")
    moved = plan_op(o2, "paddle", OpCall("reshape2", ("float32",), param_inputs=[True]))
    assert moved.run_dtype == "float32" and moved.casts == (None,)
    assert "only moves float32 parameters" in moved.reason
    act = plan_op(o2, "paddle", OpCall("reshape2", ("float32",), param_inputs=[False]))
    assert act.run_dtype == "float16" and act.casts == ("float16",)
    low = plan_op(o2, "paddle", OpCall("reshape2", ("float16",), param_inputs=[True]))
    assert low.run_dtype == "float16" and low.casts == (None,)


def test_plan_op_takes_one_op_call_and_refuses_the_old_form_naming_the_new():
    """plan_op(policy, framework, call, device): the op is one OpCall (frozen, its dtypes a
    tuple whatever sequence was given); the 13-parameter form is refused with the new one."""
    from amp_adapters import OpCall, Policy, plan_op
    call = OpCall("FullyConnected", ["float32", "float32"])
    assert call.input_dtypes == ("float32", "float32")
    with pytest.raises(dataclasses.FrozenInstanceError):
        call.op = "Convolution"
    assert plan_op(Policy.preset("O1"), "mxnet", call).run_dtype == "float16"
    with pytest.raises(TypeError, match=r"OpCall\(op, input_dtypes"):
        plan_op(Policy.preset("O1"), "mxnet", "FullyConnected", ("float32",))
