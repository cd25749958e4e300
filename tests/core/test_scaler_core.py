"""The loss-scale core: config/state validation, the one ``update``, the guard, state dicts."""
import copy
import json
import math
from decimal import Decimal
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from amp_adapters import AmpConfigError, DynamicLossScale, OverflowGuardError, StaticLossScale
from scaler_cases import CORRUPTIONS, GOOD, corrupt

from amp_adapters.rules.loss_scale import (NUMPY_OPS, LossScaleConfig, LossScaleState, SkipWindow,
                                           StateArrays, check_guard, load_state, state_dict, step,
                                           update)


def reference(config, s, found_inf):
    """DESIGN.md's transition written the obvious, branchy way (the spec to test against)."""
    f32 = lambda x: float(np.float32(x))  # noqa: E731
    total = s.total_steps + 1
    if config.kind == "none":
        return LossScaleState(1.0, total_steps=total)
    skipped = s.skipped_steps + found_inf
    consec = s.consecutive_skips + 1 if found_inf else 0
    scale, good, bad = s.scale, s.good_steps, s.bad_steps
    if config.kind == "dynamic":
        if found_inf:
            good, bad = 0, bad + 1
            if bad == config.hysteresis:
                with np.errstate(over="ignore"):
                    scale, bad = max(f32(scale * config.backoff_factor), config.min_scale), 0
        else:
            good, bad = good + 1, 0
            if good == config.growth_interval:
                with np.errstate(over="ignore"):
                    grown = min(f32(scale * config.growth_factor), config.max_scale)
                scale, good = (grown if math.isfinite(grown) else scale), 0
    return LossScaleState(scale, good, bad, total, skipped, consec)


configs = st.builds(
    LossScaleConfig,
    kind=st.sampled_from(["dynamic", "dynamic", "dynamic", "static", "none"]),
    init_scale=st.sampled_from([1.0, 3.0, 1000.0, 2.0**16, 2.0**120]),
    growth_factor=st.sampled_from([1.1, 1.5, 1.7, 2.0, 3.1, 1e10]),
    backoff_factor=st.sampled_from([0.3, 0.5, 0.7, 0.9, 1e-3]),
    growth_interval=st.integers(1, 5),
    hysteresis=st.integers(1, 3),
    min_scale=st.sampled_from([0.0, 0.25, 1.0]),
    max_scale=st.sampled_from([2.0**120, 2.0**127, math.inf]),
)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(configs, st.lists(st.booleans(), max_size=80))
def test_update_equals_the_spec_bit_for_bit(config, flags):
    ours = ref = LossScaleState.initial(config)
    for f in flags:
        ours, ref = step(config, ours, f), reference(config, ref, f)
        assert ours == ref
        assert np.float32(ours.scale) == ours.scale  # always a float32 value


def test_update_returns_the_record_type_it_was_given():
    config = LossScaleConfig(growth_interval=1)
    arrays = StateArrays(np.float32(8), *(np.int64(0),) * 5)
    out = update(config, arrays, np.bool_(False), NUMPY_OPS)
    assert isinstance(out, StateArrays) and out.scale == 16 and out.total_steps == 1


def test_the_issue_case_non_dyadic_factors():
    """1.7 / 0.3: the double product rounded once to float32, as torch does."""
    config = LossScaleConfig(init_scale=10.0, growth_factor=1.7, backoff_factor=0.3,
                             growth_interval=1, min_scale=0.0, max_scale=math.inf)
    s = LossScaleState.initial(config)
    scales = []
    for f in (False, True, False):
        s = step(config, s, f)
        scales.append(s.scale)
    assert scales[0] == float(np.float32(10.0 * 1.7))
    assert scales[1] == float(np.float32(scales[0] * 0.3))


@pytest.mark.parametrize("value", [3, 3.0, np.float32(3), np.int64(3), np.float64(3),
                                   Fraction(3), Decimal("3")])
def test_any_real_number_is_accepted(value):
    c = LossScaleConfig(init_scale=value, growth_factor=value, min_scale=0, max_scale=value * 2)
    assert c.init_scale == 3.0 and type(c.init_scale) is float
    assert LossScaleConfig(growth_interval=value if not isinstance(value, np.floating) else 3
                           ).growth_interval == 3


@pytest.mark.parametrize("kwargs, words", [
    (dict(growth_factor=True), ["growth_factor", "real number", "bool"]),
    (dict(growth_factor="2"), ["growth_factor", "real number", "str"]),
    (dict(growth_factor=math.inf), ["growth_factor", "finite"]),
    (dict(growth_factor=1e300), ["growth_factor", "float32"]),
    (dict(backoff_factor=1e-300), ["backoff_factor", "0"]),
    (dict(init_scale=1e-50, min_scale=0), ["init_scale", "rounds to 0"]),
    (dict(init_scale=1e-40, min_scale=0), ["init_scale", "denormal"]),
    (dict(init_scale=1e39, max_scale=math.inf), ["init_scale", "overflows float32"]),
    (dict(max_scale=1e39), ["max_scale", "overflows float32", "inf for no ceiling"]),
    (dict(min_scale=-1), ["min_scale", ">= 0"]),
    (dict(growth_interval=True), ["growth_interval", "whole number", "bool"]),
    (dict(growth_interval=2.5), ["growth_interval", "whole number"]),
    (dict(hysteresis=0), ["hysteresis", ">= 1" if False else "[1, 2**63-1]"]),
    (dict(max_skip_fraction=1.5), ["max_skip_fraction", "(0, 1)"]),
    (dict(kind="dynamc"), ["loss-scale kind", "dynamic"]),
])
def test_bad_config_names_field_and_value(kwargs, words):
    with pytest.raises(AmpConfigError) as e:
        LossScaleConfig(**kwargs)
    for w in words:
        assert w in str(e.value), (w, str(e.value))


def test_the_views_use_the_core_records():
    s = DynamicLossScale.from_torch(9.0, backoff_factor=0.8)
    assert s.config == LossScaleConfig(init_scale=9.0, backoff_factor=0.8, min_scale=0.0,
                                       max_scale=math.inf)
    assert s.state == LossScaleState(9.0)
    nxt = s.adjust(True)
    assert nxt.state == step(s.config, s.state, True) and nxt.config == s.config
    assert nxt.init_scale == 9.0 and nxt.scale == float(np.float32(9.0 * 0.8))


# ----------------------------------------------------------------------------- guard

def test_guard_collapse_of_a_no_floor_config():
    """from_torch under interleaved overflows: the consecutive counter resets, the scale dies."""
    s = DynamicLossScale.from_torch(2.0**16, growth_interval=2000)
    with pytest.raises(OverflowGuardError) as e:
        for t in range(1000):
            s = s.adjust(t % 2 == 0)
            check_guard(s.config, s.state, ["w"])
    assert s.consecutive_skips <= 1 and s.scale < float(np.finfo(np.float32).tiny)
    msg = str(e.value)
    assert "collapsed" in msg and "min_scale=0" in msg and "backoff_factor=0.5" in msg
    assert "w" in e.value.param_names


def test_guard_consecutive_and_static():
    c = LossScaleConfig(kind="static", init_scale=8.0, max_consecutive_skips=2)
    s = step(c, step(c, LossScaleState(8.0), True), True)
    with pytest.raises(OverflowGuardError, match="2 overflow steps in a row"):
        check_guard(c, s)
    assert check_guard(LossScaleConfig(kind="none"), LossScaleState(1.0)) is None


def test_guard_skip_fraction_window():
    c = LossScaleConfig(max_consecutive_skips=None, max_skip_fraction=0.5, skip_window=4,
                        growth_interval=10**6)
    s, w = LossScaleState.initial(c), None
    for f in [True, False, True, False, True, False, True, False]:  # exactly 1/2: allowed
        s = step(c, s, f)
        w = check_guard(c, s, window=w)
    assert w == SkipWindow(8, 4)
    with pytest.raises(OverflowGuardError, match="max_skip_fraction=0.5"):
        for f in [True, True, True, False]:
            s = step(c, s, f)
            w = check_guard(c, s, window=w)


# ----------------------------------------------------------------------------- state dicts

@pytest.mark.parametrize("path, value, shown", CORRUPTIONS,
                         ids=[f"{'.'.join(p)}={v!r}" for p, v, _ in CORRUPTIONS])
def test_every_corruption_is_named(path, value, shown):
    running = DynamicLossScale(hysteresis=2, max_scale=math.inf, scale=8.0)
    d = corrupt(path, value)
    before = copy.deepcopy(d)
    with pytest.raises(AmpConfigError) as e:
        running.with_state_dict(d)
    msg = str(e.value)
    assert path[-1] in msg and shown in msg, msg
    assert d == before or (math.isnan(value) if isinstance(value, float) else False)


def test_config_mismatch_names_both_values():
    with pytest.raises(AmpConfigError, match=r"growth_factor.*3.0.*2.0"):
        load_state(corrupt(("config", "growth_factor"), 3.0), GOOD_CONFIG())


def GOOD_CONFIG():
    return DynamicLossScale(hysteresis=2, max_scale=math.inf, scale=8.0).config


def test_round_trip_through_json_and_resume():
    running = DynamicLossScale(hysteresis=2, max_scale=math.inf, scale=8.0)
    d = json.loads(json.dumps(GOOD))
    resumed = running.with_state_dict(d)
    assert resumed.state == LossScaleState(4.0, 1, 1, 9, 3, 0)
    assert state_dict(resumed.config, resumed.state) == GOOD


def test_static_checkpoint_cannot_carry_another_scale():
    d = corrupt(("state", "scale"), 32.0, StaticLossScale(64.0).state_dict())
    with pytest.raises(AmpConfigError, match="never moves"):
        load_state(d)


def test_a_policy_and_a_trainer_take_the_core_config():
    from amp_adapters import Policy
    config = LossScaleConfig(init_scale=256.0, growth_factor=1.7, growth_interval=3)
    policy = Policy(loss_scale=config)
    assert isinstance(policy.loss_scale, DynamicLossScale)
    assert policy.loss_scale.config == config and policy.loss_scale.state == LossScaleState(256.0)
    with pytest.raises(AmpConfigError, match="LossScaleConfig"):
        Policy(loss_scale={"kind": "dynamic"})


@pytest.mark.parametrize("value", [Fraction(3, 2), Decimal("1.5"), np.float64(1.5), 1.5])
def test_native_constructors_take_any_real(value):
    p = DynamicLossScale.from_paddle(incr_ratio=value, decr_ratio=value / 2)
    assert (p.growth_factor, p.backoff_factor) == (1.5, 0.75)
    assert DynamicLossScale.from_torch(value * 2, growth_factor=value).scale == 3.0


def test_native_constructors_refuse_bools_plainly():
    with pytest.raises(AmpConfigError, match="incr_ratio must be a real number.*bool"):
        DynamicLossScale.from_paddle(incr_ratio=True)
    with pytest.raises(AmpConfigError, match="init_scale must be a real number.*bool"):
        DynamicLossScale.from_torch(True)


def test_numpy_ops_provide_the_whole_vocabulary():
    from amp_adapters.rules.loss_scale import ArrayOps
    assert isinstance(NUMPY_OPS, ArrayOps)
    assert not isinstance(object(), ArrayOps)


ANY_VALUE = st.one_of(
    st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=True),
    st.text(max_size=5), st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
    st.sampled_from([Decimal("1.5"), Fraction(1, 3), np.float32(2), np.int64(3), np.bool_(True),
                     math.inf, -math.inf, 1e300, 1e-300]))


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.sampled_from([("format_version",), ("kind",), ("config",), ("state",)]
                       + [("config", k) for k in GOOD["config"]]
                       + [("state", k) for k in GOOD["state"]]), ANY_VALUE)
def test_a_corrupted_state_dict_loads_or_is_refused_cleanly(path, value):
    """Whatever a key holds, loading either gives a valid state or an AmpConfigError that
    names the key: never a TypeError, KeyError or OverflowError from inside."""
    try:
        config, state = load_state(corrupt(path, value))
    except AmpConfigError as e:
        assert path[-1] in str(e) or "kind" in str(e), str(e)
        return
    assert isinstance(state, LossScaleState) and math.isfinite(state.scale) and state.scale > 0
    assert isinstance(config, LossScaleConfig)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.sampled_from([f for f in LossScaleConfig.__dataclass_fields__ if f != "kind"]),
       ANY_VALUE)
def test_a_config_field_of_any_value_is_accepted_or_named(field, value):
    try:
        config = LossScaleConfig(**{field: value})
    except AmpConfigError as e:
        assert field in str(e) or (field in ("min_scale", "max_scale", "init_scale")
                                   and "scale" in str(e)), str(e)
        return
    for name in ("init_scale", "growth_factor", "backoff_factor", "min_scale", "max_scale"):
        assert type(getattr(config, name)) is float
    assert config.min_scale <= config.init_scale <= config.max_scale
