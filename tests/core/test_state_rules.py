"""Issue 22/26 in the core: states that contradict their config are refused wherever they
enter; reachable ones are accepted; flags are bools; unhashable choices are plain errors;
state dicts of earlier formats upgrade, future ones are refused."""
import importlib
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from amp_adapters import (AmpConfigError, DynamicLossScale, LossScaleConfig, LossScaleState,
                          NoOpLossScale, Policy, StaticLossScale, UnknownChoiceError,
                          loss_scale_from_config, loss_scale_from_parts,
                          loss_scale_from_state_dict)
from amp_adapters.rules.errors import check_flag
sd = importlib.import_module("amp_adapters.rules.loss_scale.state_dict")
from amp_adapters.rules.loss_scale.consistency import check_state

ISSUE_CASES = [  # (constructor keywords, the field the error names)
    (dict(scale=1024.0, bad_steps=5, hysteresis=2), "bad_steps"),
    (dict(bad_steps=2, hysteresis=2), "bad_steps"),
    (dict(good_steps=3, growth_interval=3), "good_steps"),
    (dict(consecutive_skips=2, skipped_steps=1, total_steps=5), "consecutive_skips"),
    (dict(skipped_steps=6, total_steps=5), "skipped_steps"),
]


@pytest.mark.parametrize("kw, field", ISSUE_CASES)
def test_contradicting_counters_are_refused_at_every_entry(kw, field):
    with pytest.raises(AmpConfigError, match=f"DynamicLossScale.{field} = "):
        DynamicLossScale(**kw)
    config_kw = {k: v for k, v in kw.items() if k in ("hysteresis", "growth_interval")}
    config = LossScaleConfig(init_scale=kw.get("scale", 2.0**16), **config_kw)
    state = LossScaleState(**{k: v for k, v in kw.items() if k not in config_kw})
    with pytest.raises(AmpConfigError, match=field):
        loss_scale_from_parts(config, state)
    good = loss_scale_from_parts(config)
    with pytest.raises(AmpConfigError, match=field):
        good.with_state(state)
    d = good.state_dict()
    d["state"] = state.as_dict()
    with pytest.raises(AmpConfigError, match=rf"state_dict\['state'\]\['{field}'\]"):
        loss_scale_from_state_dict(d)
    with pytest.raises(AmpConfigError, match=field):
        good.with_state_dict(d)


@pytest.mark.parametrize("kw", [dict(good_steps=1), dict(bad_steps=1), dict(scale=512.0)])
def test_an_edited_kind_is_refused(kw):
    """A dynamic state dict relabelled "static": its counters or moved scale give it away."""
    d = DynamicLossScale(**{"scale": 1024.0, **kw}, init_scale=1024.0,
                         hysteresis=2).state_dict()
    d["kind"] = "static"
    with pytest.raises(AmpConfigError, match="static"):
        loss_scale_from_state_dict(d)


def test_an_edited_kind_with_dynamic_constants_is_refused():
    d = DynamicLossScale.from_paddle(8.0, 3, 2).state_dict()  # at its start: no counter moved
    d["kind"] = "static"
    with pytest.raises(AmpConfigError, match=r"\['config'\]\['growth_interval'\].*'static'"):
        loss_scale_from_state_dict(d)


def test_static_and_none_keep_no_dynamic_counters():
    config = LossScaleConfig(kind="static", init_scale=8.0)
    with pytest.raises(AmpConfigError, match="good_steps"):
        loss_scale_from_parts(config, LossScaleState(8.0, good_steps=1))
    none = NoOpLossScale().config
    with pytest.raises(AmpConfigError, match="skipped_steps"):
        loss_scale_from_parts(none, LossScaleState(1.0, total_steps=2, skipped_steps=1))


def _forbidden(config, state):
    """The rule, written out again independently: what no run of ``config`` reaches."""
    return (state.bad_steps >= config.hysteresis or state.good_steps >= config.growth_interval
            or state.consecutive_skips > state.skipped_steps
            or state.skipped_steps > state.total_steps)


configs = st.builds(LossScaleConfig, init_scale=st.sampled_from([1.0, 8.0, 1024.0]),
                    growth_interval=st.integers(1, 4), hysteresis=st.integers(1, 3),
                    backoff_factor=st.sampled_from([0.5, 0.25]),
                    min_scale=st.sampled_from([0.0, 1.0]), max_scale=st.sampled_from(
                        [2.0**12, math.inf]), max_consecutive_skips=st.none())
counters = st.integers(0, 6)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(configs, counters, counters, counters, counters, counters)
def test_any_forbidden_counter_state_is_refused(config, good, bad, total, skipped, row):
    state = LossScaleState(config.init_scale, good, bad, total, skipped, row)
    d = {**loss_scale_from_parts(config).state_dict(), "state": state.as_dict()}
    if _forbidden(config, state):
        with pytest.raises(AmpConfigError):
            check_state(config, state)
        with pytest.raises(AmpConfigError):
            loss_scale_from_state_dict(d)
    else:
        check_state(config, state)
        assert loss_scale_from_state_dict(d).state == state


@settings(max_examples=200, deadline=None, derandomize=True)
@given(configs, st.lists(st.booleans(), max_size=40))
def test_every_reachable_state_is_accepted(config, found_infs):
    value = loss_scale_from_parts(config)
    for found_inf in found_infs:
        value = value.adjust(found_inf)
        assert not _forbidden(config, value.state)
        again = DynamicLossScale(**{f: getattr(value, f) for f in value._fields()})
        assert again == value  # the constructor takes it
        assert loss_scale_from_parts(config, value.state) == value
        assert loss_scale_from_state_dict(value.state_dict()) == value


@pytest.mark.parametrize("build", [
    lambda: Policy(emulate="false"), lambda: Policy(emulate=1), lambda: Policy(emulate=None),
    lambda: Policy.preset("O1", emulate="true"),
])
def test_flags_are_bools(build):
    with pytest.raises(TypeError, match="Policy.emulate must be true or false"):
        build()


def test_check_flag():
    assert check_flag("x", True) is True and check_flag("x", False) is False
    with pytest.raises(TypeError, match="replace must be true or false.*str 'no'"):
        check_flag("replace", "no")


@pytest.mark.parametrize("build, needle", [
    (lambda: Policy.preset(["O1"]), "unknown preset"),
    (lambda: loss_scale_from_config({"kind": ["dynamic"]}), "unknown loss-scale kind"),
    (lambda: LossScaleConfig(kind={"dynamic": 1}), "unknown loss-scale kind"),
])
def test_unhashable_choices_are_plain_errors(build, needle):
    with pytest.raises(UnknownChoiceError, match=needle):
        build()


def test_a_policy_holds_config_not_a_run():
    running = DynamicLossScale(scale=8.0, growth_interval=3).adjust(False)
    with pytest.raises(AmpConfigError, match="good_steps = 1 is mid-run"):
        Policy(loss_scale=running)
    policy = Policy(loss_scale=running.config)
    assert policy.loss_scale_config == running.config
    assert policy.loss_scale == DynamicLossScale(scale=8.0, growth_interval=3)
    assert Policy(loss_scale=StaticLossScale(4.0)).loss_scale.state == LossScaleState(4.0)


def test_upgrade_walks_the_registered_steps():
    d = DynamicLossScale(scale=8.0).state_dict()
    del d["config"]["skip_window"]
    steps = {1: sd.add_config_key("skip_window", 1000), 2: lambda x: {**x, "seen": True}}
    out = sd.upgrade(d, current=3, upgrades=steps)
    assert out["format_version"] == 3 and out["seen"] and out["config"]["skip_window"] == 1000
    with pytest.raises(AmpConfigError, match="no upgrade from format 1 to 2"):
        sd.upgrade(d, current=2, upgrades={})
    with pytest.raises(AmpConfigError, match=r"format_version'\] = 4: written by a newer"):
        sd.upgrade({**d, "format_version": 4}, current=3)


def test_a_missing_config_key_takes_its_old_value(monkeypatch):
    """As it would be when a format adds a config field: a dict of the earlier format loads,
    the field taking the value that reproduces how it ran."""
    old = DynamicLossScale(scale=8.0, skip_window=1000).state_dict()
    del old["config"]["skip_window"]
    monkeypatch.setattr(sd, "FORMAT_VERSION", 2)
    monkeypatch.setitem(sd.UPGRADES, 1, sd.add_config_key("skip_window", 1000))
    assert loss_scale_from_state_dict(old).skip_window == 1000
    with pytest.raises(AmpConfigError, match="format_version'\\] = 3: written by a newer"):
        loss_scale_from_state_dict({**old, "format_version": 3})


def test_a_drop_in_emulate_argument_must_be_a_bool():
    """Both backends merge their ``emulate=`` through ``Policy.with_emulation``."""
    policy = Policy.preset("O1")
    assert policy.with_emulation(True).emulate and not policy.with_emulation(False).emulate
    with pytest.raises(TypeError, match="emulate must be true or false.*'false'"):
        policy.with_emulation("false")


def test_check_policy_must_be_a_bool(tmp_path):
    from amp_adapters.services import checkpoint
    with pytest.raises(TypeError, match="check_policy must be true or false"):
        checkpoint.load(tmp_path, framework="numpy", check_policy="no")


@pytest.mark.parametrize("text, key", [
    ('[ops]\nfp32 = [\n  "exp",\n]\nfp32 = [\n  "log",\n]\n', "ops.fp32"),  # values over lines
    ('dtype = "float16"\nlevel = "O1"\ndtype = """\nfloat16"""\n', "dtype"),
    ('preset = "O1"\n[preset]\n', "preset"),
    ('[ops]\nfp32 = ["exp"]\n[ops]\nlower = []\n', "ops"),
])
def test_a_duplicate_toml_key_is_named(tmp_path, text, key):
    path = tmp_path / "p.toml"
    path.write_text(text)
    with pytest.raises(AmpConfigError, match=f"the key '{key}' is given twice"):
        Policy.from_file(path)
