"""The loss-scale state machine: each transition, the golden traces, and its invariants."""
import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from amp_adapters import (AmpConfigError, DynamicLossScale, NoOpLossScale, StaticLossScale,
                          UnknownChoiceError, loss_scale_from_config, loss_scale_from_state_dict)


def trace(state, found_infs):
    out = []
    for f in found_infs:
        state = state.adjust(bool(f))
        out.append(state)
    return out


def test_defaults_are_design_md():
    s = DynamicLossScale()
    assert (s.scale, s.growth_factor, s.backoff_factor, s.growth_interval, s.hysteresis,
            s.min_scale, s.max_scale) == (2.0**16, 2.0, 0.5, 2000, 1, 1.0, 2.0**24)
    assert (s.good_steps, s.bad_steps, s.total_steps, s.skipped_steps) == (0, 0, 0, 0)


def test_torch_golden_trace():
    # ANCHORS.md: interval 3, start 8.0, found_inf -> (scale, growth tracker)
    s = DynamicLossScale.from_torch(init_scale=8.0, growth_interval=3)
    got = [(t.scale, t.good_steps) for t in trace(s, [0, 0, 0, 1, 0, 0, 0, 0])]
    assert got == [(8, 1), (8, 2), (16, 0), (8, 0), (8, 1), (8, 2), (16, 0), (16, 1)]


@pytest.mark.parametrize("found_infs, expected", [
    # (scale, good, bad, total, skipped) after each step; interval 2, hysteresis 2
    ([1], [(8, 0, 1, 1, 1)]),
    ([1, 1], [(8, 0, 1, 1, 1), (4, 0, 0, 2, 2)]),
    ([1, 0, 1], [(8, 0, 1, 1, 1), (8, 1, 0, 2, 1), (8, 0, 1, 3, 2)]),
    ([0, 0, 0], [(8, 1, 0, 1, 0), (16, 0, 0, 2, 0), (16, 1, 0, 3, 0)]),
    ([0, 1, 0, 0], [(8, 1, 0, 1, 0), (8, 0, 1, 2, 1), (8, 1, 0, 3, 1), (16, 0, 0, 4, 1)]),
])
def test_transition_table_with_hysteresis(found_infs, expected):
    s = DynamicLossScale(scale=8.0, growth_interval=2, hysteresis=2, min_scale=1, max_scale=64)
    got = [(t.scale, t.good_steps, t.bad_steps, t.total_steps, t.skipped_steps)
           for t in trace(s, found_infs)]
    assert got == expected


def test_floor_and_ceiling_hold():
    s = DynamicLossScale(scale=2.0, min_scale=1.0, max_scale=4.0, growth_interval=1)
    assert [t.scale for t in trace(s, [1, 1, 0, 0, 0])] == [1.0, 1.0, 2.0, 4.0, 4.0]


def test_growth_skipped_when_float32_overflows():
    s = DynamicLossScale.from_torch(init_scale=2.0**127, growth_interval=1)
    nxt = s.adjust(False)
    assert nxt.scale == 2.0**127 and nxt.good_steps == 0


def test_scale_arithmetic_is_float32():
    s = DynamicLossScale.from_paddle(init_loss_scaling=2.0**15, decr_ratio=0.8)
    assert s.adjust(True).scale == float(np.float32(2.0**15) * np.float32(0.8))


def test_consecutive_skips_and_guard():
    s = DynamicLossScale(max_consecutive_skips=3)
    t = trace(s, [1, 1, 0, 1, 1, 1])
    assert [x.consecutive_skips for x in t] == [1, 2, 0, 1, 2, 3]
    assert [x.exhausted for x in t] == [False] * 5 + [True]
    assert not any(x.exhausted for x in trace(s.__class__(max_consecutive_skips=None), [1] * 100))


def test_static_skips_but_never_moves():
    t = trace(StaticLossScale(128.0, max_consecutive_skips=2), [1, 0, 1, 1])
    assert {x.scale for x in t} == {128.0}
    assert (t[-1].total_steps, t[-1].skipped_steps, t[-1].exhausted) == (4, 3, True)


def test_noop_has_scale_one_and_checks_nothing():
    s = NoOpLossScale().adjust(True).adjust(False)
    assert (s.scale, s.skipped_steps, s.total_steps, s.checks_overflow) == (1.0, 0, 2, False)


@pytest.mark.parametrize("kwargs, field", [
    (dict(growth_factor=1.0), "growth_factor"),
    (dict(backoff_factor=1.0), "backoff_factor"),
    (dict(backoff_factor=0.0), "backoff_factor"),
    (dict(growth_interval=0), "growth_interval"),
    (dict(hysteresis=0), "hysteresis"),
    (dict(min_scale=-1.0), "min_scale"),
    (dict(scale=2.0**30), "scale"),
    (dict(scale=0.5), "scale"),
    (dict(scale=float("nan")), "scale"),
    (dict(good_steps=-1), "good_steps"),
    (dict(max_consecutive_skips=0), "max_consecutive_skips"),
    (dict(growth_interval=2.5), "growth_interval"),
])
def test_validation_names_the_field(kwargs, field):
    with pytest.raises(AmpConfigError, match=field):
        DynamicLossScale(**kwargs)


def test_static_validation():
    with pytest.raises(AmpConfigError, match="scale"):
        StaticLossScale(float("inf"))


def test_native_constructors_map_arguments():
    p = DynamicLossScale.from_paddle(init_loss_scaling=2.0**15, incr_every_n_steps=1000,
                                     decr_every_n_nan_or_inf=2, incr_ratio=2.0, decr_ratio=0.8)
    assert (p.scale, p.growth_interval, p.hysteresis, p.backoff_factor, p.min_scale,
            p.max_scale) == (2.0**15, 1000, 2, pytest.approx(0.8), 1.0, math.inf)
    t = DynamicLossScale.from_torch(init_scale=4.0, growth_interval=10)
    assert (t.min_scale, t.max_scale, t.hysteresis) == (0.0, math.inf, 1)
    m = DynamicLossScale.from_mxnet()
    assert (m.scale, m.max_scale, m.min_scale) == (2.0**16, 2.0**24, 0.0)


@pytest.mark.parametrize("state", [
    DynamicLossScale(scale=4.0, good_steps=1, bad_steps=1, total_steps=9, skipped_steps=3,
                     hysteresis=2, max_scale=math.inf),
    StaticLossScale(64.0, total_steps=3, skipped_steps=1),
    NoOpLossScale(total_steps=5),
])
def test_state_dict_round_trips_through_json(state):
    d = json.loads(json.dumps(state.state_dict(), allow_nan=True))
    assert loss_scale_from_state_dict(d) == state
    assert type(state).from_state_dict(d) == state


def test_state_dict_kind_mismatch_is_an_error():
    with pytest.raises(AmpConfigError, match="static"):
        DynamicLossScale.from_state_dict(StaticLossScale().state_dict())
    with pytest.raises(UnknownChoiceError, match="loss-scale kind"):
        loss_scale_from_state_dict({**DynamicLossScale().state_dict(), "kind": "dynamc"})


def test_from_config_reads_policy_file_keys():
    s = loss_scale_from_config({"init_scale": 1024, "growth_interval": 10, "max_scale": "inf"})
    assert (s.scale, s.growth_interval, s.max_scale) == (1024.0, 10, math.inf)
    assert isinstance(loss_scale_from_config({"kind": "none"}), NoOpLossScale)
    with pytest.raises(UnknownChoiceError, match="growth_intervall"):
        loss_scale_from_config({"growth_intervall": 3})


configs = st.builds(
    DynamicLossScale,
    scale=st.sampled_from([1.0, 8.0, 2.0**16]),
    growth_factor=st.sampled_from([1.5, 2.0, 4.0]),
    backoff_factor=st.sampled_from([0.25, 0.5, 0.8]),
    growth_interval=st.integers(1, 5),
    hysteresis=st.integers(1, 4),
    min_scale=st.sampled_from([0.0, 1.0]),
    max_scale=st.sampled_from([2.0**16, 2.0**24, math.inf]),
)


@settings(max_examples=200, deadline=None)
@given(configs, st.lists(st.booleans(), max_size=60))
def test_scale_stays_finite_and_within_bounds(s, found_infs):
    for t in trace(s, found_infs):
        assert math.isfinite(t.scale) and t.min_scale <= t.scale <= t.max_scale


@settings(max_examples=200, deadline=None)
@given(configs, st.lists(st.booleans(), max_size=60))
def test_scale_moves_only_when_the_rules_say_so(s, found_infs):
    clean = bad = 0
    for f in found_infs:
        nxt = s.adjust(f)
        clean, bad = (0, bad + 1) if f else (clean + 1, 0)
        if nxt.scale > s.scale:   # growth only after growth_interval clean steps in a row
            assert not f and clean % s.growth_interval == 0 and clean > 0
        if nxt.scale < s.scale:   # backoff only after hysteresis overflows in a row
            assert f and bad % s.hysteresis == 0
        assert nxt.total_steps == s.total_steps + 1
        assert nxt.skipped_steps == s.skipped_steps + f
        s = nxt


@settings(max_examples=100, deadline=None)
@given(configs, st.lists(st.booleans(), max_size=40), st.lists(st.booleans(), max_size=40))
def test_state_dict_resumes_the_exact_trajectory(s, before, after):
    mid = trace(s, before)[-1] if before else s
    resumed = loss_scale_from_state_dict(json.loads(json.dumps(mid.state_dict())))
    assert trace(resumed, after) == trace(mid, after)
