"""``loss_scale.mxnet_fields``: the native MXNet LossScaler's fields over one config and state.

A hypothesis state machine over steps (the core's transition) and field writes, valid or
not, for every kind of loss scale: after each, the fields read the state and config, the
state is one ``check_state`` accepts, and a refused write changed nothing.
"""
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from amp_adapters import AmpConfigError, DynamicLossScale, NoOpLossScale, StaticLossScale
from amp_adapters.rules.loss_scale import check_state, mxnet_fields, step
from amp_adapters.rules.loss_scale.checks import f32

VALUES = st.one_of(
    st.integers(-3, 12), st.sampled_from([0.0, -1.0, 0.5, math.nan, math.inf, 1e-45, 3.0e38,
                                          True, "4", None]),
    st.integers(-20, 40).map(lambda e: 2.0**e))
LOSS_SCALES = st.sampled_from([
    DynamicLossScale.from_mxnet(growth_interval=3),
    DynamicLossScale(scale=2.0**8, growth_interval=2, hysteresis=2, min_scale=1.0),
    StaticLossScale(scale=2.0**6), NoOpLossScale()])


def _reads(config, state):
    return {n: mxnet_fields.read(config, state, n) for n in mxnet_fields.FIELDS + ("loss_scale",)}


@settings(max_examples=300, deadline=None)
@given(LOSS_SCALES, st.lists(st.one_of(
    st.tuples(st.just("step"), st.booleans()),
    st.tuples(st.sampled_from(mxnet_fields.FIELDS), VALUES)), max_size=25))
def test_fields_stay_the_state_under_steps_and_writes(loss_scale, ops):
    config, state = loss_scale.config, loss_scale.state
    for op, value in ops:
        if op == "step":
            state = step(config, state, value)
            continue
        try:
            new_config, new_state = mxnet_fields.write(config, state, op, value)
        except AmpConfigError as e:
            assert f"LossScaler.{op}" in str(e)
            continue
        check_state(new_config, new_state)
        if op in mxnet_fields.SCALES:
            assert new_state.scale == f32(value)
        elif op == "_unskipped":
            assert new_state.good_steps == value
        others = {k: v for k, v in _reads(new_config, new_state).items()
                  if k not in (op, "loss_scale") + (mxnet_fields.SCALES if op in
                                                     mxnet_fields.SCALES else ())}
        assert others == {k: v for k, v in _reads(config, state).items() if k in others}
        assert new_config.kind == config.kind
        config, state = new_config, new_state
        got = _reads(config, state)
        assert got["_loss_scale"] == got["_next_loss_scale"] == got["loss_scale"] == state.scale
        assert (got["_unskipped"], got["_scale_seq_len"], got["_max_loss_scale"]) == (
            state.good_steps, config.growth_interval, config.max_scale)


def test_non_dynamic_scales_refuse_growth_settings_that_change():
    static = StaticLossScale(scale=2.0**6)
    for name in ("_scale_seq_len", "_max_loss_scale"):
        same = mxnet_fields.read(static.config, static.state, name)
        assert mxnet_fields.write(static.config, static.state, name, same) == (
            static.config, static.state)
        with pytest.raises(AmpConfigError, match="'static' loss scale never grows"):
            mxnet_fields.write(static.config, static.state, name, 7)
    none = NoOpLossScale()
    with pytest.raises(AmpConfigError, match="never moves from 1"):
        mxnet_fields.write(none.config, none.state, "_loss_scale", 2.0)


def test_a_ceiling_below_the_initial_scale_lowers_it():
    ls = DynamicLossScale.from_mxnet()  # init_scale 2**16
    config, state = mxnet_fields.write(ls.config, ls.state, "_loss_scale", 2.0**4)
    config, state = mxnet_fields.write(config, state, "_max_loss_scale", 2.0**10)
    assert (config.max_scale, config.init_scale, state.scale) == (2.0**10, 2.0**10, 2.0**4)


def test_unknown_and_read_only_names():
    ls = DynamicLossScale.from_mxnet()
    with pytest.raises(AttributeError, match="no attribute '_scale'.*_loss_scale"):
        mxnet_fields.write(ls.config, ls.state, "_scale", 1.0)
    with pytest.raises(AttributeError, match="read-only"):
        mxnet_fields.write(ls.config, ls.state, "loss_scale", 1.0)
    with pytest.raises(AttributeError, match="no attribute"):
        mxnet_fields.read(ls.config, ls.state, "_scale")
