"""The promote rule with parameter operands, and the labels of how a low op runs."""
import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from amp_adapters.rules.device import DeviceProfile, ShapeClass
from amp_adapters import UNKNOWN, Policy, OpCall, plan_op

F32, F16, BF16 = "float32", "float16", "bfloat16"
O1, BF = Policy.preset("O1"), Policy.preset("O1-bf16")


def test_a_bias_add_casts_the_parameter_down_not_the_activation_up():
    d = plan_op(BF, "mxnet", OpCall("broadcast_add", (BF16, F32), param_inputs=(False, True)))
    assert (d.category, d.run_dtype, d.casts) == ("promote", BF16, (None, BF16))
    assert "parameters" in d.reason
    d = plan_op(BF, "paddle", OpCall("elementwise_add", (BF16, F32), param_inputs=(False, True)))
    assert (d.run_dtype, d.casts) == (BF16, (None, BF16))


def test_two_activations_fp32_still_wins_a_promote():
    d = plan_op(BF, "mxnet", OpCall("broadcast_add", (BF16, F32), param_inputs=(False, False)))
    assert (d.run_dtype, d.casts) == (F32, (F32, None))


def test_without_param_inputs_the_answer_is_unchanged():
    """Backward compatible: a caller that passes no facts gets today's answer."""
    for dtypes in ((BF16, F32), (F32, BF16), (BF16, BF16), (F32, F32)):
        assert plan_op(BF, "paddle", OpCall("elementwise_add", dtypes)) == \
            plan_op(BF, "paddle", OpCall("elementwise_add", dtypes, param_inputs=(False, False)))


def test_parameters_go_down_only_beside_low_activations_of_known_dtype():
    # the activation in the other low dtype, in fp32, or of unknown dtype: widest wins
    for act in (F16, F32, UNKNOWN):
        d = plan_op(BF, "mxnet", OpCall("broadcast_add", (act, F32), param_inputs=(False, True)))
        assert d.run_dtype != BF16 or act == BF16, act
    # only parameters: nothing to gain, fp32
    d = plan_op(BF, "mxnet", OpCall("broadcast_add", (F32, F32), param_inputs=(True, True)))
    assert d.run_dtype == F32
    # not a promote op: the lists decide (softmax is fp32 whatever its inputs)
    d = plan_op(O1, "paddle", OpCall("softmax", (F16,), param_inputs=(True,)))
    assert d.run_dtype == F32


dtype = st.sampled_from([F16, BF16, F32, "float64", None])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(dtype, st.booleans()), min_size=1, max_size=4),
       st.sampled_from(["O1", "O1-bf16", "O2"]))
def test_order_of_inputs_never_changes_the_decision_with_parameters(inputs, preset):
    policy = Policy.preset(preset)
    first = plan_op(policy, "paddle", OpCall(
        "elementwise_add", [d for d, _ in inputs], param_inputs=[p for _, p in inputs]))
    for perm in itertools.permutations(range(len(inputs))):
        d = plan_op(policy, "paddle", OpCall(
            "elementwise_add", [inputs[i][0] for i in perm],
            param_inputs=[inputs[i][1] for i in perm]))
        assert d.run_dtype == first.run_dtype
        assert d.casts == tuple(first.casts[i] for i in perm)


def test_execution_says_kernel_emulated_fell_back_or_planned():
    fc = ("FullyConnected", (F32, F32, F32))
    assert plan_op(BF, "mxnet", OpCall(*fc),
                   device=DeviceProfile({"FullyConnected"})).execution == "kernel"
    assert plan_op(BF, "mxnet", OpCall(*fc), device=DeviceProfile(set())).execution == "fell back"
    assert plan_op(BF.with_emulation(True), "mxnet", OpCall(*fc),
                   device=DeviceProfile(set())).execution == "emulated"
    assert plan_op(BF, "mxnet", OpCall(*fc)).execution == "planned"  # no device was asked
    assert plan_op(BF, "mxnet", OpCall("softmax", (F32,))).execution is None  # not planned low


def test_a_refused_kernel_runs_as_a_missing_one_with_the_reason_given():
    """``DeviceProfile.refusal``: in training, an op whose low gradient of a broadcast operand
    runs on a reference implementation here keeps off its kernel at such a shape; it falls
    back, or is emulated, saying why; at a shape without broadcast it runs low."""
    fc = ("FullyConnected", (F32, F32, F32))
    slow = DeviceProfile({"FullyConnected"}, slow_broadcast_grads={"FullyConnected"},
                         training=True)
    seq = ShapeClass.of([(8, 16, 32), (64, 32), (64,)], result_rank=3)  # a batch of sequences
    why = "gradient sums an operand of fewer dimensions than its result"
    d = plan_op(BF, "mxnet", OpCall(*fc, shape=seq), device=slow)
    assert (d.run_dtype, d.execution, d.casts) == ("float32", "fell back", (None,) * 3)
    assert why in d.reason and d.reason.endswith(": runs in float32") and d.kernel_refused
    assert not d.lacks_kernel  # what the warnings and the demo's "(fp32 fallback)" read
    assert plan_op(BF, "mxnet", OpCall(*fc, shape=seq), device=slow.for_inference()).execution == \
        "kernel"  # no gradient, nothing slow
    flat = ShapeClass.of([(8, 32), (64, 32), (64, 32)], result_rank=2)
    assert plan_op(BF, "mxnet", OpCall(*fc, shape=flat), device=slow).execution == "kernel"
    missing = plan_op(BF, "mxnet", OpCall(*fc), device=DeviceProfile(set()))
    assert missing.lacks_kernel and not missing.kernel_refused
    e = plan_op(BF.with_emulation(True), "mxnet", OpCall(*fc, shape=seq), device=slow)
    assert e.execution == "emulated" and why in e.reason
    # an op the policy keeps in float32 anyway has nothing to refuse
    s = plan_op(BF, "mxnet", OpCall("softmax", (F32,), shape=seq), device=slow)
    assert s.execution is None and why not in s.reason


def test_the_report_says_per_op_how_it_ran():
    from amp_adapters import CastReport
    fc = ("FullyConnected", (F32, F32, F32))
    rows = {
        "real kernel": plan_op(BF, "mxnet", OpCall(*fc), device=DeviceProfile({"FullyConnected"})),
        "no usable bfloat16 kernel": plan_op(BF, "mxnet", OpCall(*fc), device=DeviceProfile(set())),
        "emulated bfloat16": plan_op(BF.with_emulation(True), "mxnet", OpCall(*fc),
                                     device=DeviceProfile(set())),
    }
    for label, d in rows.items():
        line = CastReport("mxnet", (d,)).format().splitlines()[-1]
        assert f"({label})" in line, line
    planned = CastReport("mxnet", (plan_op(BF, "mxnet", OpCall(*fc)),)).format().splitlines()[-1]
    assert "bfloat16 " in planned and "kernel)" not in planned  # no device was asked
