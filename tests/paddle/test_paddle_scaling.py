"""Loss scaling in the program: true skips, the core state machine step by step, the guard."""
import math
import sys
from pathlib import Path

import numpy as np
import paddle
import pytest

import paddle_amp
from amp_adapters import (AmpConfigError, DynamicLossScale, OverflowGuardError, Policy,
                          StaticLossScale)
from paddle_amp.ir.pir.opnames import legacy_name
from paddle_helpers import batch, mlp, op_names, pir_mode

sys.path.insert(0, str(Path(__file__).parents[1] / "core"))  # scaler_cases: shared corruptions

OPTIMIZERS = {
    "sgd_l2": lambda: paddle.optimizer.SGD(0.1, weight_decay=paddle.regularizer.L2Decay(0.01)),
    "momentum": lambda: paddle.optimizer.Momentum(0.1, momentum=0.9,
                                                  weight_decay=paddle.regularizer.L2Decay(0.01)),
    "adam": lambda: paddle.optimizer.Adam(0.01),
    "adamw": lambda: paddle.optimizer.AdamW(0.01, weight_decay=0.1),
}


def _changed(a: dict, b: dict) -> list:
    return [k for k in a if not np.array_equal(a[k], b[k], equal_nan=True)]


@pytest.mark.parametrize("overflow", ["inf_input", "nan_label"])
@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_overflow_step_is_skipped_for_real(static, name, overflow):
    _, _, loss = mlp()
    opt = paddle_amp.decorate(OPTIMIZERS[name]())
    opt.minimize(loss)
    static.exe.run(static.startup)
    for step in range(2):
        static.run(batch(step))
    before = static.state()
    assert any("moment" in k or "velocity" in k for k in before) or name == "sgd_l2"
    # Adam and AdamW skip inside their kernel; SGD and Momentum run in a conditional block
    main_ops = op_names(static.main)
    assert ({"adam", "adamw"} & main_ops != set()) == name.startswith("adam")
    bad = batch(2, overflow=overflow == "inf_input")
    if overflow == "nan_label":
        bad["y"][1, 0] = np.nan
    static.run(bad)
    after = static.state()
    assert not _changed(before, after), "parameters or optimizer state moved on an overflow step"
    state = opt.loss_scale()
    assert (state.skipped_steps, state.total_steps, state.scale) == (1, 3, 2.0**15)
    static.run(batch(3))
    assert _changed(after, static.state()), "the next finite step updates again"


@pytest.mark.legacy_ir  # the native fails under PIR: test_paddle_pir_training.py
def test_native_moves_weights_on_overflow_with_momentum(static):
    """What the true skip fixes: the native zeroes the grads and still runs Momentum."""
    _, _, loss = mlp()
    paddle.static.amp.decorate(OPTIMIZERS["momentum"]()).minimize(loss)
    static.exe.run(static.startup)
    static.run(batch(0))
    before = static.state()
    static.run(batch(1, overflow=True))
    assert _changed(before, static.state())


PATTERN = [0, 0, 1, 0, 1, 1, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0, 0]

CONFIGS = {
    "new_defaults": lambda: dict(),
    "old_defaults": lambda: dict(use_pure_fp16=False),
    "paddle_args": lambda: dict(init_loss_scaling=8.0, incr_every_n_steps=2,
                                decr_every_n_nan_or_inf=2, incr_ratio=4.0, decr_ratio=0.25),
    # floors, ceilings and hysteresis that the native update_loss_scaling op cannot express
    "min_max_hysteresis": lambda: dict(policy=Policy(loss_scale=DynamicLossScale(
        scale=12.0, growth_interval=2, hysteresis=2, min_scale=0.75, max_scale=16.0,
        backoff_factor=0.25))),
    # within what update_loss_scaling + a clip compute exactly: 24 capped at 16, 1 raised to 3
    "native_op_plus_clip": lambda: dict(policy=Policy(loss_scale=DynamicLossScale(
        scale=12.0, growth_interval=2, hysteresis=2, min_scale=3.0, max_scale=16.0,
        backoff_factor=0.25))),
    "torch_no_floor": lambda: dict(policy=Policy(loss_scale=DynamicLossScale.from_torch(
        init_scale=2.0, growth_interval=3, backoff_factor=0.125))),
    "growth_to_inf_is_refused": lambda: dict(policy=Policy(loss_scale=DynamicLossScale(
        scale=2.0**125, growth_interval=1, max_scale=math.inf))),
    "static": lambda: dict(use_dynamic_loss_scaling=False, init_loss_scaling=128.0),
    # the cases: factors that are not float32 values run the core's elementary ops
    # (a float32 attribute would give 27.000001907348633 where the rule gives 27.0)
    "non_dyadic_1.7_0.3": lambda: dict(policy=Policy(loss_scale=DynamicLossScale(
        scale=10.0, growth_interval=1, growth_factor=1.7, backoff_factor=0.3, min_scale=0.5,
        max_scale=math.inf))),
    "non_dyadic_1.1_0.9": lambda: dict(policy=Policy(loss_scale=DynamicLossScale(
        scale=100.0, growth_interval=2, hysteresis=2, growth_factor=1.1, backoff_factor=0.9))),
    "non_dyadic_3.1_0.7": lambda: dict(policy=Policy(loss_scale=DynamicLossScale(
        scale=3.0, growth_interval=1, growth_factor=3.1, backoff_factor=0.7, min_scale=1.0,
        max_scale=math.inf))),
    # float32-exact non-dyadic ratios (Paddle's own arguments): the fused op is exact
    "paddle_ratios_1.5_0.8": lambda: dict(init_loss_scaling=1000.0, incr_every_n_steps=2,
                                          decr_every_n_nan_or_inf=1, incr_ratio=1.5,
                                          decr_ratio=0.8),
}


# which configs Paddle's fused update_loss_scaling op computes exactly (else elementary ops)
FUSED = {"new_defaults", "old_defaults", "paddle_args", "native_op_plus_clip",
         "growth_to_inf_is_refused", "paddle_ratios_1.5_0.8"}


@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_state_follows_core_machine_step_by_step(static, config):
    # a tiny loss keeps scale * gradients finite even at scale 2**127
    _, _, loss = mlp(loss_factor=1e-30)
    opt = paddle_amp.decorate(paddle.optimizer.SGD(0.01), **CONFIGS[config]())
    opt.minimize(loss)
    static.exe.run(static.startup)
    if pir_mode():
        fused = "update_loss_scaling" in op_names(static.main)
    else:
        fused = any(op.type == "update_loss_scaling" and not op.attr("stop_update")  # not the
                    for op in static.main.global_block().ops)  # SGD fold's gradient zeroing
    assert fused == (config in FUSED)
    expected = opt.policy.loss_scale
    assert opt.loss_scale() == expected
    scales = [expected.scale]
    for step, found_inf in enumerate(PATTERN):
        fetch = [loss, opt.get_scaled_loss(), opt.get_loss_scaling()]
        plain, scaled, scale = static.run(batch(step, overflow=bool(found_inf)), fetch)
        if not found_inf:  # the scale this step used is the one the last step left (no lag)
            assert scaled == plain * np.float32(expected.scale), f"step {step}: stale scale"
        expected = expected.adjust(bool(found_inf))
        assert scale[0] == np.float32(expected.scale)
        assert opt.loss_scale() == expected, f"step {step}"
        scales.append(expected.scale)
    if config == "min_max_hysteresis":
        assert 16.0 in scales and 0.75 in scales  # 24 capped at 16; 0.5 raised to 0.75
    if config == "native_op_plus_clip":
        assert 16.0 in scales and 3.0 in scales
    if config == "torch_no_floor":
        assert min(scales) < 1.0
    if config == "growth_to_inf_is_refused":
        assert max(scales) == np.float32(2.0**127)
    if config == "static":
        assert isinstance(expected, StaticLossScale) and set(scales) == {128.0}
    if config == "non_dyadic_1.7_0.3":
        assert scales[1] == np.float32(10.0 * 1.7) and 0.5 in scales


def test_guard_names_the_params_with_non_finite_grads(static):
    _, _, loss = mlp()
    policy = Policy(loss_scale=DynamicLossScale(max_consecutive_skips=3))
    opt = paddle_amp.decorate(paddle.optimizer.SGD(0.1), policy=policy)
    opt.minimize(loss)
    static.exe.run(static.startup)
    static.run(batch(0))
    for step in range(1, 3):
        static.run(batch(step, overflow=True))
        opt.check_guard()
    static.run(batch(3, overflow=True))
    with pytest.raises(OverflowGuardError, match="3 overflow steps in a row") as err:
        opt.check_guard()
    first_weight = static.main.global_block().all_parameters()[0].name
    assert first_weight in err.value.param_names


def test_state_dict_round_trip(static):
    _, _, loss = mlp()
    opt = paddle_amp.decorate(paddle.optimizer.SGD(0.1), init_loss_scaling=64.0)
    opt.minimize(loss)
    static.exe.run(static.startup)
    static.run(batch(0, overflow=True))
    saved = opt.state_dict()
    assert saved["kind"] == "dynamic" and saved["state"]["scale"] == 32.0
    assert saved["state"]["skipped_steps"] == 1
    static.run(batch(1))
    opt.load_state_dict(saved)
    assert opt.state_dict() == saved
    with pytest.raises(ValueError, match="growth_interval"):
        opt.load_state_dict({**saved, "config": {**saved["config"], "growth_interval": 7}})
    with pytest.raises(ValueError, match="'static'"):
        opt.load_state_dict(StaticLossScale().state_dict())
    assert opt.state_dict() == saved  # nothing half-loaded


@pytest.mark.skipif(not paddle.__version__.startswith("2.") and not pir_mode(),
                    reason="Paddle 3.3.1's ClipGradByGlobalNorm calls paddle.sqrt, which rejects "
                           "legacy-IR Variables, even without AMP")
@pytest.mark.parametrize("name", ["momentum", "adam"])
def test_global_norm_clipping_is_skipped_with_the_update(static, name):
    _, _, loss = mlp()
    clip = paddle.nn.ClipGradByGlobalNorm(1.0)
    inner = paddle.optimizer.Momentum(0.1, grad_clip=clip) if name == "momentum" else \
        paddle.optimizer.Adam(0.01, grad_clip=clip)
    opt = paddle_amp.decorate(inner, init_loss_scaling=2.0**10)
    opt.minimize(loss)
    static.exe.run(static.startup)
    static.run(batch(0))
    before = static.state()
    static.run(batch(1, overflow=True))
    assert not _changed(before, static.state())
    static.run(batch(2))
    assert _changed(before, static.state())


def test_fused_op_only_where_it_is_exact():
    """``update_loss_scaling`` multiplies by float32 attributes in float32: exact for the
    rule only when both factors are float32 values, the floor is >= 1 and growth cannot
    overflow below the ceiling."""
    from paddle_amp.scaling import native_update_is_exact
    exact = lambda **kw: native_update_is_exact(DynamicLossScale(**kw).config)  # noqa: E731
    assert exact() and exact(growth_factor=1.5, backoff_factor=0.75, max_scale=math.inf)
    assert not exact(growth_factor=1.7)          # 1.7 is not a float32 value
    assert not exact(backoff_factor=0.3)
    assert exact(**{"growth_factor": float(np.float32(1.7))})
    assert not exact(min_scale=0.5)              # the op's floor is 1
    assert not exact(scale=2.0**100, max_scale=2.0**127, growth_factor=4.0)  # inf below cap
    assert not native_update_is_exact(StaticLossScale().config)


def _scope_state(opt):
    return opt.loss_scale().state


def test_state_dict_corruptions_change_nothing(static):
    """Every corruption: an AmpConfigError naming key and value; the scope state unchanged,
    even when only a late key is bad (write all or nothing)."""
    from scaler_cases import CORRUPTIONS, corrupt
    _, _, loss = mlp()
    running = DynamicLossScale(hysteresis=2, max_scale=math.inf, scale=8.0)
    opt = paddle_amp.decorate(paddle.optimizer.SGD(0.1), policy=Policy(loss_scale=running))
    opt.minimize(loss)
    static.exe.run(static.startup)
    static.run(batch(0, overflow=True))
    before = _scope_state(opt)
    good = running.with_state_dict(running.state_dict()).state_dict()
    good["state"].update(scale=4.0, good_steps=1, bad_steps=1, total_steps=9, skipped_steps=3)
    cases = [(p, v, shown) for p, v, shown in CORRUPTIONS]
    # fits the core's int64, not the program's int32 counter: refused before any write
    cases.append((("state", "good_steps"), 2**40, str(2**40)))
    for path, value, shown in cases:
        with pytest.raises(AmpConfigError) as e:
            opt.load_state_dict(corrupt(path, value, good))
        assert path[-1] in str(e.value) and shown in str(e.value), str(e.value)
        assert _scope_state(opt) == before, (path, value)
    opt.load_state_dict(good)
    assert _scope_state(opt).as_dict() == good["state"]


NO_FLOOR = {"from_torch": lambda: DynamicLossScale.from_torch(2.0**-100, growth_interval=1000),
            "from_mxnet": lambda: DynamicLossScale.from_mxnet(scale=2.0**-100,
                                                              growth_interval=1000)}


@pytest.mark.parametrize("make", sorted(NO_FLOOR))
def test_no_floor_collapse_raises(static, make):
    """Interleaved overflows with no floor: the consecutive counter resets on each clean
    step, the scale sinks to a denormal; check_guard raises naming the settings."""
    _, _, loss = mlp(loss_factor=1e-30)
    config = NO_FLOOR[make]()
    opt = paddle_amp.decorate(paddle.optimizer.SGD(0.01), policy=Policy(loss_scale=config))
    opt.minimize(loss)
    static.exe.run(static.startup)
    with pytest.raises(OverflowGuardError, match="collapsed") as e:
        for step in range(200):
            static.run(batch(step, overflow=step % 2 == 0))
            opt.check_guard()
    state = opt.loss_scale()
    assert state.consecutive_skips <= 1 and 0 <= state.scale < np.finfo(np.float32).tiny
    assert "min_scale=0" in str(e.value) and "backoff_factor=0.5" in str(e.value)


def test_elementary_update_is_straight_line_ops(static):
    """The core's update is emitted branch-free: the only conditional block is the one that
    records which gradients overflowed (Adam skips itself), and the program holds the
    rounding rule's float64 multiply."""
    _, _, loss = mlp()
    opt = paddle_amp.decorate(paddle.optimizer.Adam(0.01), policy=Policy(
        loss_scale=DynamicLossScale(growth_factor=1.7, backoff_factor=0.3, min_scale=0.5)))
    opt.minimize(loss)
    block = static.main.global_block()
    ops = [legacy_name(op.name()) if pir_mode() else op.type for op in block.ops]
    assert ops.count("conditional_block") == 1 and "update_loss_scaling" not in ops
    assert {"where", "elementwise_max", "elementwise_min", "isfinite_v2"} <= set(ops)
    if pir_mode():
        muls = [op for op in block.ops if op.name() == "pd_op.multiply"
                and str(op.result(0).dtype) == "paddle.float64"]
    else:
        muls = [op for op in block.ops if op.type == "elementwise_mul" and op.output("Out")[0]
                and block.var(op.output("Out")[0]).dtype == paddle.base.core.VarDesc.VarType.FP64]
    assert len(muls) == 2  # scale * growth_factor and scale * backoff_factor, in float64


def test_skip_fraction_guard(static):
    _, _, loss = mlp()
    policy = Policy(loss_scale=DynamicLossScale(max_consecutive_skips=None,
                                                max_skip_fraction=0.5, skip_window=4))
    opt = paddle_amp.decorate(paddle.optimizer.SGD(0.1), policy=policy)
    opt.minimize(loss)
    static.exe.run(static.startup)
    with pytest.raises(OverflowGuardError, match="max_skip_fraction=0.5") as e:
        for step, f in enumerate([True, False, True, False, True, True, False, True]):
            static.run(batch(step, overflow=f))
            opt.check_guard()
    assert step == 7 and e.value.param_names  # window 2: 3 of 4 skipped


def test_block_ops_provide_the_whole_vocabulary(static):
    from amp_adapters.rules.loss_scale import ArrayOps
    from paddle_amp.ir.legacy.ops import BlockOps
    assert isinstance(BlockOps(static.main.global_block()), ArrayOps)


@pytest.mark.parametrize("make", [
    lambda: paddle_amp.decorate(paddle.optimizer.SGD(0.05), dtype="bfloat16"),
    lambda: paddle_amp.decorate(paddle.optimizer.SGD(0.05), dtype="bfloat16", level="O2"),
    lambda: paddle_amp.bf16.decorate_bf16(paddle.optimizer.SGD(0.05)),
], ids=["O1", "O2", "decorate_bf16"])
def test_a_program_that_scales_nothing_still_hands_out_its_loss_scale(static, make):
    """bf16 scales nothing, but the native API hands out the loss-scale var whatever the
    dtype (scripts fetch it each step): ours is a var at 1.0, never written (it raised
    KeyError: 'scale')."""
    _, _, loss = mlp()
    opt = make()
    opt.minimize(loss)
    static.exe.run(static.startup)
    opt.amp_init(paddle.CPUPlace())
    for step in range(2):
        _, scale = static.run(batch(step), [loss, opt.get_loss_scaling()])
        assert float(np.asarray(scale).reshape(-1)[0]) == 1.0
    assert opt.loss_scale().kind == "none"
