"""The cast planner: categories, run dtypes, casts, device awareness, emulation."""
import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from amp_adapters.rules.device import DeviceProfile
from amp_adapters import (AmpConfigError, OpCall, OpLists, Policy, categorize, effective_lists,
                          plan_op, widest)
from amp_adapters.rules.oplists import load_table

O1 = Policy.preset("O1")
F32, F16, BF16 = "float32", "float16", "bfloat16"


def test_gemm_runs_low_and_casts_only_what_differs():
    d = plan_op(O1, "mxnet", OpCall("FullyConnected", (F32, F16, F32)))
    assert (d.category, d.canonical, d.run_dtype) == ("lower", "linear", F16)
    assert d.casts == (F16, None, F16) and d.num_casts == 2


def test_fp32_op_casts_low_inputs_up():
    d = plan_op(O1, "paddle", OpCall("softmax", (F16,)))
    assert (d.category, d.run_dtype, d.casts) == ("fp32", F32, (F32,))


def test_promote_runs_in_the_widest_input():
    d = plan_op(O1, "paddle", OpCall("elementwise_add", (F16, F32)))
    assert (d.category, d.run_dtype, d.casts) == ("promote", F32, (F32, None))
    assert plan_op(O1, "paddle", OpCall("elementwise_add", (F16, F16))).run_dtype == F16
    assert plan_op(O1, "paddle", OpCall(
        "concat", (F16, BF16))).run_dtype == F32  # neither holds the other


def test_follow_keeps_the_input_dtype():
    d = plan_op(O1, "mxnet", OpCall("relu", (F16,)))
    assert (d.category, d.run_dtype, d.casts) == ("follow", F16, (None,))


def test_none_inputs_and_float64_are_never_cast_by_lists():
    d = plan_op(O1, "paddle", OpCall("batch_norm", (F16, None, None, None, None)))
    assert d.run_dtype == F16 and d.casts == (None,) * 5
    d = plan_op(O1, "paddle", OpCall("matmul_v2", ("float64", F32)))  # AMP leaves float64 alone
    assert (d.run_dtype, d.casts) == ("float64", (None, None)) and "float64" in d.reason
    assert plan_op(Policy.preset("O2"), "paddle", OpCall("relu", ("float64",))).casts == (None,)
    assert plan_op(O1, "mxnet", OpCall("Embedding", ("int64", F32))).casts == (None, None)


dtype = st.sampled_from([F16, BF16, F32, "float64", "int32", None])
some_ops = st.sampled_from(["elementwise_add", "concat", "matmul_v2", "softmax", "relu",
                            "stack", "where", "scale", "unknown_op"])


@settings(max_examples=300, deadline=None)
@given(some_ops, st.lists(dtype, min_size=1, max_size=4), st.booleans(),
       st.sampled_from(["O1", "O2", "O1-bf16"]))
def test_order_of_inputs_never_changes_the_decision(op, dtypes, emulate, preset):
    policy = Policy.preset(preset, emulate=emulate)
    kernels = frozenset({"elementwise_add", "concat", "relu"})
    first = plan_op(policy, "paddle", OpCall(op, dtypes), device=DeviceProfile(kernels))
    for perm in itertools.permutations(range(len(dtypes))):
        d = plan_op(policy, "paddle", OpCall(op, [dtypes[i] for i in perm]),
                    device=DeviceProfile(kernels))
        assert (d.run_dtype, d.emulated, d.category) == (first.run_dtype, first.emulated,
                                                         first.category)
        assert d.casts == tuple(first.casts[i] for i in perm)


@settings(max_examples=200, deadline=None)
@given(st.lists(dtype, max_size=5))
def test_widest_is_symmetric_and_the_maximum(dtypes):
    w = widest(dtypes)
    assert w == widest(list(reversed(dtypes)))
    floats = [d for d in dtypes if d in (F16, BF16, F32, "float64")]
    assert (w is None) == (not floats)


def test_no_kernel_on_this_device_stays_fp32_and_says_why():
    d = plan_op(O1, "mxnet", OpCall("FullyConnected", (F32, F32, F32)),
                device=DeviceProfile(frozenset()))
    assert (d.category, d.run_dtype, d.casts, d.emulated) == ("lower", F32, (None,) * 3, False)
    assert d.fell_back and not plan_op(O1, "mxnet", OpCall("FullyConnected", (F32, F32))).fell_back
    assert "no float16 kernel for FullyConnected on this device" in d.reason


def test_follow_op_without_kernel_casts_low_input_up():
    d = plan_op(O1, "paddle", OpCall("relu", (F16,)), device=DeviceProfile(frozenset({"scale"})))
    assert (d.run_dtype, d.casts) == (F32, (F32,))


def test_emulation_is_a_decision():
    policy = Policy.preset("O1", emulate=True)
    d = plan_op(policy, "mxnet", OpCall("FullyConnected", (F32, F32)),
                device=DeviceProfile(frozenset()))
    assert (d.run_dtype, d.emulated, d.low_dtype) == (F32, True, F16)
    assert "EMULATED float16" in d.reason
    # with a kernel, the real thing runs: no emulation
    assert not plan_op(policy, "mxnet", OpCall("FullyConnected", (F32, F32))).emulated


def test_o2_runs_every_non_fp32_op_low():
    o2 = Policy.preset("O2")
    assert plan_op(o2, "paddle", OpCall("elementwise_add", (F32, F16))).run_dtype == F16
    assert plan_op(o2, "paddle", OpCall("relu", (F32,))).run_dtype == F16
    assert plan_op(o2, "paddle", OpCall("layer_norm", (F16,))).run_dtype == F32


def test_o0_changes_nothing():
    d = plan_op(Policy.preset("O0"), "mxnet", OpCall("FullyConnected", (F32, F32)))
    assert (d.run_dtype, d.num_casts) == (F32, 0)


def test_conditional_ops_depend_on_attributes():
    assert categorize(O1, "mxnet", "Activation", {"act_type": "softrelu"}).category == "fp32"
    assert categorize(O1, "mxnet", "Activation", {"act_type": "relu"}).category == "follow"
    policy = Policy(mxnet_ops=OpLists(conditional_fp32=(("Activation", "act_type", ("relu",)),)))
    c = categorize(policy, "mxnet", "Activation", {"act_type": "relu"})
    assert c.category == "fp32" and "conditional_fp32" in c.reason


def test_user_conditional_rule_on_any_op_and_attribute():
    rule = (("Pooling", "pool_type", ("max",)),)
    policy = Policy(mxnet_ops=OpLists(conditional_fp32=rule))
    assert plan_op(policy, "mxnet", OpCall(
        "Pooling", (F16,), attrs={"pool_type": "max"})).run_dtype == F32
    assert plan_op(policy, "mxnet", OpCall(
        "Pooling", (F16,), attrs={"pool_type": "avg"})).run_dtype == F16
    paddle = Policy(paddle_ops=OpLists(conditional_fp32=(("pool2d", "pooling_type", ("max",)),)))
    assert categorize(paddle, "paddle", "pool2d", {"pooling_type": "max"}).category == "fp32"


def test_force_fp32_overrides_the_category_for_one_op():
    d = plan_op(O1, "paddle", OpCall("matmul_v2", (F16, F16), force_fp32="outside fp16_guard"))
    assert (d.category, d.run_dtype, d.casts, d.reason) == ("fp32", F32, (F32, F32),
                                                            "outside fp16_guard")
    assert plan_op(O1, "paddle", OpCall("matmul_v2", (F16, F16))).run_dtype == F16


def test_overrides_precedence():
    policy = Policy(ops=OpLists(fp32={"matmul"}, lower={"softmax"}),
                    paddle_ops=OpLists(lower={"matmul_v2"}))
    assert categorize(policy, "paddle", "matmul").category == "fp32"       # canonical override
    assert categorize(policy, "mxnet", "dot").category == "fp32"           # shared by both
    assert categorize(policy, "paddle", "matmul_v2").category == "lower"   # framework wins
    assert categorize(policy, "paddle", "softmax").category == "lower"


def test_replace_drops_the_defaults():
    policy = Policy(ops=OpLists(lower={"softmax"}, replace=True))
    assert categorize(policy, "paddle", "matmul_v2").category == "follow"
    assert categorize(policy, "paddle", "softmax").category == "lower"
    only = Policy(paddle_ops=OpLists(fp32={"scale"}, replace=True))
    assert categorize(only, "paddle", "fake_quantize_dequantize_abs_max").category == "follow"
    assert categorize(only, "paddle", "matmul_v2").category == "lower"  # canonical stays


def test_replace_names_the_default_lists_it_drops_and_keeps_the_others():
    # MXNet's target_precision_ops=["Convolution"]: the native low list is replaced, the
    # fp32, widest-type and conditional lists stay (native mxnet.contrib.amp semantics)
    native = Policy.preset("mxnet-native")
    conv_only = native.replace(mxnet_ops=OpLists(lower={"Convolution"}, replace={"lower"}))
    assert categorize(conv_only, "mxnet", "Convolution").category == "lower"
    fc = categorize(conv_only, "mxnet", "FullyConnected")
    assert fc.category == "follow" and "replaced" in fc.reason  # in no list now, as natively
    for op in ("softmax", "add_n"):  # the kept default lists
        assert categorize(conv_only, "mxnet", op) == categorize(native, "mxnet", op)
    softrelu = {"act_type": "softrelu"}
    assert categorize(conv_only, "mxnet", "Activation", softrelu).category == "fp32"
    no_rules = native.replace(mxnet_ops=OpLists(replace={"conditional_fp32"}))
    assert categorize(no_rules, "mxnet", "Activation", softrelu).category == "follow"
    assert categorize(no_rules, "mxnet", "FullyConnected").category == "lower"
    assert OpLists(replace=set()) == OpLists() and OpLists(replace=["fp32"]).replace == {"fp32"}


def test_a_listed_op_wins_over_a_default_list_it_was_not_removed_from():
    # softmax is in the native fp32 list, Activation has a native conditional rule: the
    # user's low list decides both, with no error (natively the user's list decided them)
    native = Policy.preset("mxnet-native")
    for replace in (False, {"lower"}):
        p = native.replace(mxnet_ops=OpLists(lower={"softmax", "Activation"}, replace=replace))
        assert categorize(p, "mxnet", "softmax").category == "lower"
        assert categorize(p, "mxnet", "Activation", {"act_type": "softrelu"}).category == "lower"


@pytest.mark.parametrize("bad", ["lower", {"lowr"}, 3])
def test_replace_takes_only_known_list_names(bad):
    with pytest.raises(AmpConfigError, match="OpLists.replace must be.*lower, fp32"):
        OpLists(replace=bad)


def test_a_free_input_takes_a_follow_ops_dtype_and_is_never_cast():
    # a converted graph's parameter (dtype inferred by the framework, as MXNet's native
    # conversion leaves it): FullyConnected in no list follows its float16 data input
    native = Policy.preset("mxnet-native")
    p = native.replace(mxnet_ops=OpLists(lower={"Convolution"}, replace={"lower"}))
    d = plan_op(p, "mxnet", OpCall("FullyConnected", (F16, F32, F32), free=(False, True, True)))
    assert (d.category, d.run_dtype, d.casts) == ("follow", F16, (None, None, None))
    fixed = plan_op(p, "mxnet", OpCall("FullyConnected", (F16, F32, F32)))
    assert (fixed.run_dtype, fixed.casts) == (F32, (F32, None, None))  # fixed fp32 weight
    # no low kernel here: float32, and still no cast of the free weight
    d = plan_op(p, "mxnet", OpCall("FullyConnected", (F16, F32, F32), free=(False, True, True)),
                device=DeviceProfile(frozenset()))
    assert (d.run_dtype, d.fell_back, d.casts) == (F32, True, (F32, None, None))
    # other categories cast every input as before
    d = plan_op(native, "mxnet", OpCall(
        "FullyConnected", (F32, F32, F32), free=(False, True, True)))
    assert d.casts == (F16, F16, F16)
    d = plan_op(native, "mxnet", OpCall("broadcast_add", (F16, F32), free=(False, True)))
    assert (d.run_dtype, d.casts) == (F32, (F32, None))


def test_native_framework_only_lists_are_kept():
    assert categorize(O1, "mxnet", "linalg_gemm2").category == "fp32"
    assert categorize(O1, "paddle", "lookup_table").category == "follow"  # canonical embedding
    assert categorize(O1, "paddle", "bilinear_interp_v2").category == "fp32"


def test_effective_lists_partition_the_table():
    for fw in ("mxnet", "paddle"):
        lists = effective_lists(O1, fw)
        names = [n for cat in lists.values() for n in cat]
        assert len(names) == len(set(names)) == len(load_table(fw).names)


@pytest.mark.parametrize("fw", ["mxnet", "paddle"])
def test_key_ops_agree_across_frameworks(fw):
    by_canonical = {}
    for op, canon in load_table(fw).canonical_of.items():
        by_canonical.setdefault(canon, set()).add(categorize(O1, fw, op).category)
    assert all(len(cats) == 1 for cats in by_canonical.values())
    assert by_canonical["matmul"] == {"lower"} and by_canonical["softmax"] == {"fp32"}


@pytest.mark.parametrize("bad", ["lower", 3, None])
def test_replace_that_is_neither_a_flag_nor_a_set_of_lists_is_a_type_error(bad):
    # a set of list names is the one non-bool form (check_flag names it in the message)
    with pytest.raises(TypeError, match="OpLists.replace must be true or false.*set of "
                                        "default lists"):
        OpLists(replace=bad)
    with pytest.raises(AmpConfigError) as unknown:
        OpLists(replace={"lowr"})
    assert not isinstance(unknown.value, TypeError)
