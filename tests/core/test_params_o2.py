"""plan_params: which parameters O2 stores in the low dtype, the same rule for both frameworks."""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from amp_adapters.rules.device import DeviceProfile
from amp_adapters import ParamUse, Policy, plan_params

O2 = Policy.preset("O2")
O2_EMU = Policy.preset("O2", emulate=True)
CPU_MX = frozenset({"relu"})  # a device with few low kernels: GEMMs have none


def test_o1_stores_every_parameter_in_float32():
    plan = plan_params(Policy.preset("O1"), "paddle", {"w": [ParamUse("mul")]})
    assert plan.dtypes == {"w": "float32"} and "level O1" in plan.reasons["w"]


@pytest.mark.parametrize("fw, gemm, norm, norm_slot", [
    ("mxnet", "FullyConnected", "LayerNorm", "gamma"),
    ("paddle", "mul", "layer_norm", "Scale"),
])
def test_gemm_weights_low_norm_scale_and_bias_fp32(fw, gemm, norm, norm_slot):
    uses = {"w": [ParamUse(gemm, slot="weight")], "gamma": [ParamUse(norm, slot=norm_slot)]}
    plan = plan_params(O2, fw, uses)
    assert plan.low == {"w"} and plan.fp32 == {"gamma"}
    assert "float32" in plan.reasons["gamma"]


def test_batch_norm_statistics_slot_stays_fp32():
    plan = plan_params(O2, "paddle", {"mean": [ParamUse("batch_norm", slot="Mean")],
                                      "w": [ParamUse("conv2d")]})
    assert plan.fp32 == {"mean"} and plan.low == {"w"}
    assert "keeps its Mean input in float32" in plan.reasons["mean"]


def test_one_fp32_reader_keeps_a_shared_parameter_fp32():
    uses = {"tied": [ParamUse("matmul_v2"), ParamUse("softmax")]}
    assert plan_params(O2, "paddle", uses).fp32 == {"tied"}
    forced = {"w": [ParamUse("matmul_v2", force_fp32="outside fp16_guard")]}
    plan = plan_params(O2, "paddle", forced)
    assert plan.fp32 == {"w"} and "outside fp16_guard" in plan.reasons["w"]


def test_no_kernel_keeps_fp32_unless_emulated():
    uses = {"w": [ParamUse("FullyConnected")]}
    assert plan_params(O2, "mxnet", uses, device=DeviceProfile(CPU_MX)).fp32 == {"w"}
    plan = plan_params(O2_EMU, "mxnet", uses, device=DeviceProfile(CPU_MX))
    assert plan.low == {"w"} and "EMULATED" in plan.reasons["w"]


def test_unused_parameter_stays_fp32_and_bf16_uses_bf16():
    plan = plan_params(Policy.preset("O2-bf16"), "mxnet",
                       {"unused": [], "w": [ParamUse("Convolution")]})
    assert plan.dtypes == {"unused": "float32", "w": "bfloat16"}
    assert "unused" in plan.format() and "bfloat16" in plan.format()


OPS = {"mxnet": ["FullyConnected", "LayerNorm", "softmax", "relu", "Convolution", "exp"],
       "paddle": ["mul", "layer_norm", "softmax", "relu", "conv2d", "exp"]}


@settings(max_examples=150, deadline=None, derandomize=True)
@given(st.lists(st.tuples(st.integers(0, 5), st.booleans()), min_size=1, max_size=4),
       st.sampled_from(["O2", "O2-bf16"]), st.booleans())
def test_same_canonical_uses_same_decision_in_both_frameworks(uses, preset, emulate):
    """The same consumers (by canonical op) give the same storage dtype in both frameworks,
    and a parameter is low exactly when no reader is fp32 (order of readers irrelevant)."""
    policy = Policy.preset(preset, emulate=emulate)
    got = {}
    for fw in ("mxnet", "paddle"):
        norm_slot = {"mxnet": "gamma", "paddle": "Scale"}[fw]
        consumers = [ParamUse(OPS[fw][i], slot=norm_slot if slot and i == 1 else None)
                     for i, slot in uses]
        got[fw] = plan_params(policy, fw, {"p": consumers}).dtypes["p"]
        assert plan_params(policy, fw, {"p": consumers[::-1]}).dtypes["p"] == got[fw]
    assert got["mxnet"] == got["paddle"]
    fp32_ops = {1, 2, 5}  # layer_norm, softmax, exp: fp32 for fp16 and bf16 alike
    assert (got["mxnet"] == "float32") == any(i in fp32_ops for i, _ in uses)


# -- pass-through readers: a parameter is judged where its moved value is consumed ----------

@pytest.mark.parametrize("fw, reshape, add", [("paddle", "reshape2", "elementwise_add"),
                                              ("mxnet", "Reshape", "broadcast_add")])
def test_bias_reshaped_for_an_fp32_add_stays_fp32(fw, reshape, add):
    """A conv bias whose only reader is a reshape: stored low when the add after it runs low,
    float32 when the add has no low kernel here (it used to be stored low, since the
    reshape itself has one, and cast back before each add)."""
    uses = {"b": [ParamUse(reshape, then=(ParamUse(add, slot="Y"),))]}
    cpu = plan_params(O2, fw, uses, device=DeviceProfile(frozenset({reshape})))
    assert cpu.fp32 == {"b"}
    assert f"through {reshape} by {add}, which runs in float32" in cpu.reasons["b"]
    assert plan_params(O2, fw, uses, device=DeviceProfile(None)).low == {"b"}
    assert plan_params(O2, fw, uses, device=DeviceProfile(frozenset({reshape, add}))).low == {"b"}


def test_pass_through_chains_and_their_own_kernel_count():
    chain = ParamUse("transpose2", then=(ParamUse("reshape2", then=(ParamUse("softmax"),)),))
    plan = plan_params(O2, "paddle", {"w": [chain]})
    assert plan.fp32 == {"w"} and "through transpose2, reshape2 by softmax" in plan.reasons["w"]
    # the pass-through op runs in the parameter's dtype too: it needs its own low kernel
    moved = {"w": [ParamUse("reshape2", then=(ParamUse("matmul_v2"),))]}
    assert plan_params(O2, "paddle", moved, device=DeviceProfile(frozenset({"matmul_v2"}))).fp32 == {"w"}


def test_readers_of_a_computing_op_are_not_looked_through():
    """``then`` only counts for ops that move values: an fp32 op after a low GEMM does not
    keep the GEMM's weight fp32; a reshape with unlisted readers is judged alone."""
    gemm = {"w": [ParamUse("matmul_v2", then=(ParamUse("softmax"),))]}
    assert plan_params(O2, "paddle", gemm).low == {"w"}
    assert plan_params(O2, "paddle", {"b": [ParamUse("reshape2")]}).low == {"b"}
    forced = {"b": [ParamUse("reshape2", force_fp32="outside fp16_guard",
                             then=(ParamUse("matmul_v2"),))]}
    assert plan_params(O2, "paddle", forced).fp32 == {"b"}


def test_pass_through_ops_are_canonical_and_move_values_only():
    from amp_adapters.rules.oplists import canonical_ops, pass_through_ops, passes_through
    assert {"reshape", "transpose"} <= pass_through_ops() <= canonical_ops()
    assert passes_through("paddle", "reshape2") and passes_through("mxnet", "transpose")
    assert not passes_through("paddle", "elementwise_add")


def test_a_layer_kept_float32_keeps_the_parameters_only_it_reads_float32():
    """O2 stores a parameter low only where every reader computes low: a reader a layer rule
    keeps in float32 keeps its weight float32 (no cast up per use), the other layer's goes low."""
    from amp_adapters import ParamUse
    from amp_adapters.rules.layers import LayerLists
    policy = O2.replace(layers=LayerLists(fp32=frozenset({"dense2"})))
    uses = {"dense1_weight": [ParamUse("FullyConnected", slot="weight", instance=("dense1_fwd",))],
            "dense2_weight": [ParamUse("FullyConnected", slot="weight", instance=("dense2_fwd",))]}
    plan = plan_params(policy, "mxnet", uses)
    assert plan.dtypes == {"dense1_weight": "float16", "dense2_weight": "float32"}
    assert "layer 'dense2'" in plan.reasons["dense2_weight"]
