"""The device profile's rules, with profiles as data: measured speed decides only beyond noise,
the broadcast-gradient rule reads the shape class, and a timing failure is no kernel."""
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from amp_adapters import AmpConfigError, Policy, UnknownChoiceError, OpCall, plan_op
from amp_adapters.rules.device import (EXACT_UP_TO, MARGIN, TRAIN_MARGIN, Cost, DeviceProfile,
                                       ShapeClass, speed_refusal)

F32, BF16 = "float32", "bfloat16"
AUTO = Policy.preset("auto")
FC = ("FullyConnected", (F32, F32, F32))
MLP = ShapeClass.of([(64, 2048), (2048, 2048), (2048,)], result_rank=2)


def measured(cost, training=True, kernels=frozenset({"FullyConnected"})):
    return DeviceProfile(kernels, training=training, costs=lambda op, shape: cost)


def test_auto_is_bf16_o1_with_measured_speed():
    assert (AUTO.dtype, AUTO.level, AUTO.speed, AUTO.defaults) == (BF16, "O1", "measured",
                                                                   "shared")
    assert Policy.preset("O1-bf16").speed == "fixed"  # the presets keep fixed decisions


def test_a_measured_win_runs_low_and_says_so():
    d = plan_op(AUTO, "mxnet", OpCall(*FC, shape=MLP), device=measured(Cost(0.5, 0.01, 0.6, 0.02)))
    assert (d.run_dtype, d.execution, d.speed) == (BF16, "kernel", 0.6)
    assert "measured faster here (0.60x float32" in d.reason


def test_a_measured_loss_stays_float32_with_slower_here_as_its_reason():
    d = plan_op(AUTO, "mxnet", OpCall(*FC, shape=MLP), device=measured(Cost(2.5, 0.05, 2.4, 0.05)))
    assert (d.run_dtype, d.execution, d.casts) == (F32, "fell back", (None,) * 3)
    assert d.kernel_refused and not d.lacks_kernel and d.speed == 2.4
    assert "float32: slower here (2.40x float32 for its bfloat16 training step" in d.reason
    assert not d.reason.endswith("runs in float32")  # said once, not twice


def test_inference_reads_the_forward_ratio():
    cost = Cost(0.5, 0.01, 1.5, 0.01)  # fast forward, slow backward
    assert plan_op(AUTO, "mxnet", OpCall(*FC, shape=MLP),
                   device=measured(cost, training=False)).run_dtype == BF16
    assert plan_op(AUTO, "mxnet", OpCall(*FC, shape=MLP),
                   device=measured(cost, training=True)).run_dtype == F32


def test_fixed_speed_never_asks_for_a_cost():
    def boom(op, shape):
        raise AssertionError("a fixed policy measured")
    d = plan_op(Policy.preset("O1-bf16"), "mxnet", OpCall(*FC, shape=MLP),
                device=DeviceProfile({"FullyConnected"}, costs=boom))
    assert d.run_dtype == BF16 and d.speed is None


def test_a_failure_while_timed_is_no_kernel_and_never_raises():
    d = plan_op(AUTO, "mxnet", OpCall(*FC, shape=MLP),
                device=measured(Cost(error="MXNetError: no primitive")))
    assert d.lacks_kernel and "failed while being timed" in d.reason and "no primitive" in \
        d.reason


def test_an_op_that_cannot_be_measured_stays_float32_under_measured_speed():
    """Measured speed lowers only what was measured faster (no timing recipe, an operand of
    unknown shape: float32, which is never slower than itself); a profile without a speed
    lookup (a fixed policy's) leaves the kernel decision."""
    d = plan_op(AUTO, "mxnet", OpCall(*FC, shape=MLP), device=measured(None))
    assert (d.run_dtype, d.kernel_refused, d.lacks_kernel, d.speed) == (F32, True, False, None)
    assert "float32: not measured here (no timing for FullyConnected at 64x2048" in d.reason
    d = plan_op(AUTO, "mxnet", OpCall(*FC, shape=MLP), device=DeviceProfile({"FullyConnected"}))
    assert d.run_dtype == BF16


@pytest.mark.parametrize("op, given", [("Activation", (BF16,)),  # follow: relu after a GEMM
                                       ("elemwise_add", (BF16, BF16))])  # promote
def test_an_op_that_follows_its_low_inputs_is_no_speed_choice(op, given):
    """Measured speed judges what the lists choose to lower; relu after a bf16 GEMM follows
    it on its kernel, unmeasured (float32 would cast up and back down around it), and a slow
    measurement of it is not asked for; without a kernel it still runs float32."""
    def boom(op_, shape):
        raise AssertionError(f"measured {op_}, which only follows its inputs")
    act = ShapeClass.of([(64, 2048)] * len(given))
    d = plan_op(AUTO, "mxnet", OpCall(op, given, shape=act, attrs={"act_type": "relu"}),
                device=DeviceProfile(
        {op}, costs=boom, training=True))
    assert (d.run_dtype, d.kernel_refused, d.speed) == (BF16, False, None)
    d = plan_op(AUTO, "mxnet", OpCall(op, given, shape=act, attrs={"act_type": "relu"}),
                device=DeviceProfile(frozenset(), costs=boom))
    assert d.run_dtype == F32 and d.lacks_kernel


def test_an_op_without_a_kernel_is_not_measured():
    def boom(op, shape):
        raise AssertionError("measured an op with no kernel")
    d = plan_op(AUTO, "mxnet", OpCall(*FC, shape=MLP),
                device=DeviceProfile(frozenset(), costs=boom))
    assert d.lacks_kernel


# (ratio, spread, a training step's cost?, runs low?): written out by hand, so that a change of
# the margins (5% for a forward, 15% for a training step) fails here
DECIDED = [
    (0.90, 0.00, False, True),
    (0.949, 0.00, False, True),   # just inside 5%
    (0.951, 0.00, False, False),  # just outside
    (0.90, 0.04, False, True),    # 0.94 with its spread
    (0.90, 0.06, False, False),   # 0.96 with its spread: noise could undo the win
    (0.50, 0.44, False, True),
    (0.50, 0.46, False, False),
    (0.80, 0.00, True, True),
    (0.849, 0.00, True, True),    # just inside 15%
    (0.851, 0.00, True, False),   # just outside
    (0.90, 0.00, True, False),    # a 10% gain is a forward's win, not a training step's
    (0.80, 0.04, True, True),
    (0.80, 0.06, True, False),
    (1.00, 0.00, False, False),   # a tie keeps float32
    (1.30, 0.00, True, False),
    (2.50, 0.05, False, False),
]


@pytest.mark.parametrize("ratio, spread, step, low", DECIDED)
def test_hand_chosen_costs_decide_as_written(ratio, spread, step, low):
    cost = Cost(ratio, spread, ratio, spread) if step else Cost(ratio, spread)
    why = speed_refusal(cost, True, BF16)
    assert (why is None) == low, why
    if not low:
        assert why.startswith("float32: ")
        assert ("slower here" in why) == (ratio >= 1.0)
    if not low and ratio < 1.0:
        assert f"a low kernel must gain {'15' if step else '5'}%" in why


def test_a_forward_only_cost_is_judged_as_a_forward_even_in_training():
    cost = Cost(0.90, 0.0)  # no backward measured
    assert speed_refusal(cost, True, BF16) is None
    assert speed_refusal(Cost(0.90, 0.0, 0.90, 0.0), True, BF16) is not None
    assert speed_refusal(Cost(0.90, 0.0, 0.90, 0.0), False, BF16) is None  # inference


def test_the_margins_are_the_documented_ones():
    assert (MARGIN, TRAIN_MARGIN) == (0.05, 0.15)


ratios, spreads = st.floats(0.01, 10), st.floats(0, 2)


@given(ratio=ratios, spread=spreads, other=ratios, training=st.booleans())
def test_a_faster_kernel_is_never_refused_where_a_slower_one_runs_low(ratio, spread, other,
                                                                      training):
    lo, hi = sorted((ratio, other))
    if speed_refusal(Cost(hi, spread, hi, spread), training, BF16) is None:
        assert speed_refusal(Cost(lo, spread, lo, spread), training, BF16) is None


@given(ratio=ratios, spread=spreads, other=spreads, training=st.booleans())
def test_less_noise_never_turns_a_win_into_a_refusal(ratio, spread, other, training):
    quiet, noisy = sorted((spread, other))
    if speed_refusal(Cost(ratio, noisy, ratio, noisy), training, BF16) is None:
        assert speed_refusal(Cost(ratio, quiet, ratio, quiet), training, BF16) is None


@given(ratio=ratios, spread=spreads)
def test_a_training_step_is_held_to_at_least_a_forwards_bar(ratio, spread):
    if speed_refusal(Cost(ratio, spread, ratio, spread), True, BF16) is None:
        assert speed_refusal(Cost(ratio, spread), True, BF16) is None


@given(ratio=st.floats(1.0, 10), spread=spreads, training=st.booleans())
def test_no_gain_never_runs_low(ratio, spread, training):
    """float32 is never slower than itself: a tie or a loss keeps it, whatever the spread."""
    why = speed_refusal(Cost(ratio, spread, ratio, spread), training, BF16)
    assert why is not None and "slower here" in why


@given(ratio=st.floats(0.01, 0.4), spread=st.floats(0, 0.1), training=st.booleans())
def test_a_clear_win_always_runs_low(ratio, spread, training):
    """Half of float32's time or better, noise included, is a win under any margin."""
    assert speed_refusal(Cost(ratio, spread, ratio, spread), training, BF16) is None


def test_a_profile_refuses_a_broadcast_gradient_only_in_training():
    slow = DeviceProfile({"matmul_v2"}, slow_broadcast_grads={"matmul_v2"}, training=True)
    seq = ShapeClass.of([(8, 16, 32), (32, 64)], result_rank=3)
    assert "reference implementation" in slow.refusal("matmul_v2", seq, BF16)
    assert slow.refusal("matmul_v2", ShapeClass.of([(8, 32), (32, 64)], 2), BF16) is None
    assert slow.for_inference().refusal("matmul_v2", seq, BF16) is None
    assert slow.refusal("matmul_v2", None, BF16) is None  # no shape: nothing to see


@given(st.lists(st.one_of(st.none(), st.lists(st.one_of(st.none(), st.integers(-1, 5000)),
                                              max_size=4)), max_size=4))
def test_shape_classes_round_up_to_powers_of_two_above_small_dims(shapes):
    sc = ShapeClass.of(shapes, result_rank=3)
    for raw, got in zip(shapes, sc.operands):
        if raw is None:
            assert got is None
            continue
        for d, r in zip(raw, got):
            if d is None or d < 1:
                assert r is None
            elif d <= EXACT_UP_TO:
                assert r == d  # a 3x3 window stays 3x3
            else:
                assert r >= d and r & (r - 1) == 0 and r < 2 * d
    assert ShapeClass.of(shapes, 3).key == sc.key  # a pure function of the shapes


def test_nearby_sizes_share_a_class_and_unknown_dims_are_filled():
    assert ShapeClass.of([(33, 1000)]).key == ShapeClass.of([(64, 1024)]).key == "64x1024"
    assert ShapeClass.of([(-1, 300)]).concrete() == ((64, 512),)
    with pytest.raises(ValueError, match="unknown rank"):
        ShapeClass.of([None]).concrete()


def test_cost_ratio_falls_back_to_forward_when_backward_was_not_measured():
    assert Cost(0.7, 0.1).ratio(training=True) == (0.7, 0.1)
    assert math.isnan(Cost().forward)


def test_speed_and_profile_are_checked():
    with pytest.raises(UnknownChoiceError, match="Policy.speed"):
        Policy(speed="fast")
    with pytest.raises(AmpConfigError, match="speed = 'fixed'"):
        Policy.preset("O1-bf16", profile="cpu.json")
    with pytest.raises(AmpConfigError, match="path of a profile file"):
        Policy.preset("auto", profile=3)
    assert Policy.preset("auto", profile="cpu.json").profile == "cpu.json"


def test_a_policy_file_names_speed_and_a_profile_relative_to_itself(tmp_path):
    path = tmp_path / "p.toml"
    path.write_text('preset = "auto"\nprofile = "cpu.json"\n')
    p = Policy.from_file(path)
    assert (p.speed, p.profile) == ("measured", str(tmp_path / "cpu.json"))
    path.write_text('preset = "O1-bf16"\nspeed = "quick"\n')
    with pytest.raises(AmpConfigError, match=r"p.toml.*speed.*'fixed', 'measured'"):
        Policy.from_file(path)


def test_the_report_says_slower_here_apart_from_no_kernel():
    from amp_adapters import CastReport
    slow = plan_op(AUTO, "mxnet", OpCall(*FC, shape=MLP), device=measured(Cost(2.5, 0.0, 2.5, 0.0)))
    none = plan_op(AUTO, "mxnet", OpCall(*FC, shape=MLP), device=DeviceProfile(frozenset()))
    fast = plan_op(AUTO, "mxnet", OpCall(*FC, shape=MLP), device=measured(Cost(0.5, 0.0, 0.5, 0.0)))
    rows = CastReport("mxnet", (slow, none, fast)).format().splitlines()[-3:]
    assert "float32 (slower here)" in rows[0] and "float32: slower here (2.50x" in rows[0]
    assert "(no usable bfloat16 kernel)" in rows[1]
    assert "bfloat16 (real kernel)" in rows[2] and "measured faster here (0.50x" in rows[2]


def test_the_report_reads_the_refusal_kind_not_the_reason_words():
    """"(slower here)" comes from ``OpDecision.refusal``, not from words in the reason: a
    refusal by the profile's rule says it whatever its reason's wording, and an op kept
    float32 for want of a timing does not, even when a layer named "slower..." decided it."""
    import dataclasses

    from amp_adapters import CastReport
    from amp_adapters.rules.layers import LayerLists
    seq = ShapeClass.of([(8, 16, 32), (32, 64)], result_rank=3)
    slow = DeviceProfile({"matmul_v2"}, slow_broadcast_grads={"matmul_v2"}, training=True)
    by_rule = plan_op(Policy.preset("O1-bf16"), "paddle", OpCall(
        "matmul_v2", (F32, F32), shape=seq), device=slow)
    assert (by_rule.run_dtype, by_rule.refusal, by_rule.speed) == (F32, "rule", None)
    reworded = dataclasses.replace(by_rule, reason="kept off its reference-kernel gradient")
    unmeasured = plan_op(AUTO.replace(layers=LayerLists(lower={"slower_head"})), "mxnet", OpCall(
        *FC, shape=MLP, instance="slower_head_fwd"), device=measured(None))
    assert (unmeasured.refusal, unmeasured.kernel_refused) == ("unmeasured", True)
    assert "slower_head" in unmeasured.reason
    rows = CastReport("x", (by_rule, reworded, unmeasured)).format().splitlines()[-3:]
    assert "float32 (slower here)" in rows[0] and "float32 (slower here)" in rows[1]
    assert "float32 (kept float32)" in rows[2] and "(slower here)" not in rows[2]
