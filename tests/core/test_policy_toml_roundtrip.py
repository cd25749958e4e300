"""Every policy a user can pass writes a policy file that loads back as the same policy:
``policy_toml`` (what the doctor writes) is the inverse of the core's loader, over every
preset and over generated policies (op lists, layers, loss-scale config, speed, profile,
dtype, level, unlisted, native version). Before, ``speed``/``profile`` were not written, so
every doctor run under ``auto`` failed its own load-back check."""
import os
import tomllib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from amp_adapters import (DynamicLossScale, NoOpLossScale, OpLists, Policy, StaticLossScale,
                          resolve_policy)
from amp_adapters.services.doctor import policy_toml
from amp_adapters.rules.layers import LayerLists
from amp_adapters.rules.oplists import CATEGORIES, canonical_ops, load_table, native_versions
from amp_adapters.rules.policy import PRESETS

LISTS = (*CATEGORIES, "conditional_fp32")


def _back(policy, tmp_path=None):
    text = policy_toml(policy, {"ops": {"matmul": "why # not a key = 1"}})
    loaded = Policy.from_dict(tomllib.loads(text))
    if tmp_path is not None:  # and through a file, read from its own folder
        path = tmp_path / "p.toml"
        path.write_text(text)
        assert Policy.from_file(path) == loaded
    return loaded


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_loads_back_as_itself(name, tmp_path):
    policy = Policy.preset(name)
    assert _back(policy, tmp_path) == policy


def test_auto_writes_its_speed_and_a_profile_by_an_absolute_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    policy = resolve_policy("auto").replace(profile="cpu.json")
    text = policy_toml(policy)
    assert 'speed = "measured"' in text
    assert f"profile = \"{tmp_path / 'cpu.json'}\"" in text  # not relative to the file
    (tmp_path / "sub").mkdir()
    path = tmp_path / "sub" / "fix.toml"
    path.write_text(text)
    assert Policy.from_file(path) == policy.replace(profile=str(tmp_path / "cpu.json"))


def _names(pool):
    return st.lists(st.sampled_from(pool), max_size=4, unique=True)


@st.composite
def op_lists(draw, pool):
    names = draw(_names(pool))
    given_cat = {n: draw(st.sampled_from(CATEGORIES)) for n in names}
    cats = {c: frozenset(n for n, k in given_cat.items() if k == c) for c in CATEGORIES}
    rest = [n for n in pool if n not in names]
    rules = ()
    if draw(st.booleans()) and rest:
        op = draw(st.sampled_from(rest))
        rules = ((op, "act_type", tuple(draw(st.lists(st.sampled_from(["gelu", "softrelu",
                                                                         "tanh"]),
                                                        min_size=1, max_size=2, unique=True)))),)
    replace = draw(st.one_of(st.booleans(),
                             st.frozensets(st.sampled_from(LISTS), max_size=3)))
    return OpLists(**cats, conditional_fp32=rules, replace=replace)


@st.composite
def layer_lists(draw):
    names = draw(st.lists(st.sampled_from(["dense2", "encoder.layers.3.ffn", "2", "fc_*",
                                           "linear_2.w_0", "block/conv1"]),
                          max_size=4, unique=True))
    fp32 = frozenset(n for n in names if draw(st.booleans()))
    return LayerLists(fp32=fp32, lower=frozenset(names) - fp32)


powers = st.integers(0, 24).map(lambda e: 2.0 ** e)


@st.composite
def loss_scales(draw, dtype):
    kind = draw(st.sampled_from(["dynamic", "static", "none"] if dtype == "float16" else
                                ["none", "static", "dynamic"]))
    guard = dict(max_consecutive_skips=draw(st.one_of(st.none(), st.integers(1, 500))),
                 max_skip_fraction=draw(st.one_of(st.none(), st.floats(0.01, 0.99))),
                 skip_window=draw(st.integers(1, 5000)))
    if kind == "none":
        return NoOpLossScale()
    if kind == "static":
        return StaticLossScale(scale=draw(powers), **guard)
    low = draw(st.sampled_from([0.0, 1.0]))
    high = draw(st.sampled_from([2.0 ** 24, float("inf"), 2.0 ** 30]))
    return DynamicLossScale(scale=draw(powers), growth_factor=draw(st.floats(1.01, 8.0)),
                            backoff_factor=draw(st.floats(0.01, 0.99)),
                            growth_interval=draw(st.integers(1, 10 ** 6)),
                            hysteresis=draw(st.integers(1, 10)), min_scale=low, max_scale=high,
                            **guard)


@st.composite
def policies(draw):
    dtype, level = draw(st.sampled_from([("float32", "O0"), ("float16", "O1"),
                                         ("float16", "O2"), ("float16", "OD"),
                                         ("bfloat16", "O1"), ("bfloat16", "O2")]))
    speed = draw(st.sampled_from(["fixed", "measured"]))
    profile = draw(st.sampled_from([None, "/profiles/cpu.json", "/p/with space.json"])) \
        if speed == "measured" else None
    return Policy(
        dtype=dtype, level=level, speed=speed, profile=profile,
        ops=draw(op_lists(sorted(canonical_ops()))),
        mxnet_ops=draw(op_lists(sorted(load_table("mxnet").names)[:40])),
        paddle_ops=draw(op_lists(sorted(load_table("paddle").names)[:40])),
        layers=draw(layer_lists()), mxnet_layers=draw(layer_lists()),
        paddle_layers=draw(layer_lists()),
        loss_scale=draw(loss_scales(dtype)), emulate=draw(st.booleans()),
        defaults=draw(st.sampled_from(["shared", "native"])),
        unlisted=draw(st.sampled_from([None, *CATEGORIES])), use_promote=draw(st.booleans()),
        native_version=draw(st.sampled_from([None, *native_versions("paddle")])))


@settings(max_examples=150, deadline=None)
@given(policies())
def test_a_generated_policy_loads_back_as_itself(policy):
    assert _back(policy) == policy


def test_a_loss_scale_without_a_skip_limit_is_written_as_false():
    policy = Policy(loss_scale=DynamicLossScale(max_consecutive_skips=None))
    text = policy_toml(policy)
    assert "max_consecutive_skips = false" in text
    assert _back(policy).loss_scale_config.max_consecutive_skips is None


def test_replace_naming_lists_is_written_as_those_lists():
    """What ``mxnet_amp.init(target_precision_ops=[...])`` builds: it replaces the default
    low list and only that one (was written ``replace = true``: every list replaced)."""
    policy = Policy.preset("mxnet-native", mxnet_ops=OpLists(lower={"FullyConnected"},
                                                            replace={"lower"}))
    assert 'replace = ["lower"]' in policy_toml(policy)
    assert _back(policy) == policy


def test_paddle_use_promote_policy_loads_back():
    """``paddle_amp.decorate(use_promote=True)`` sets ``unlisted="promote"``: it has a file
    form now (it raised 'no policy-file form')."""
    policy = Policy.preset("paddle-native", unlisted="promote", native_version="2.6.2")
    assert 'unlisted = "promote"' in policy_toml(policy)
    assert _back(policy) == policy
    assert os.fspath(policy.native_version) == "2.6.2"


def test_the_doctor_under_auto_writes_a_file_that_loads_back(tmp_path):
    """``recommendation()`` under ``auto`` raised ValueError on every run (its load-back
    check found ``speed`` missing)."""
    import numpy as np

    from amp_adapters.services.doctor import Recorder, recommend
    policy = resolve_policy("auto")
    r = Recorder("mxnet", policy.dtype, emulated=False)
    r.begin_step(1.0)
    r.forward("dense0_fwd", "FullyConnected", "linear", "lower", policy.dtype, False,
              np.ones(2), np.ones(2))
    r.end_step()
    rec = recommend(r.report(), policy)
    rec.write(tmp_path / "fix.toml")
    assert Policy.from_file(tmp_path / "fix.toml") == rec.policy == policy


@pytest.mark.parametrize("text,says", [
    ('[ops]\nreplace = ["lowr"]', "ops.replace[0] = 'lowr': must be one of"),
    ('[ops]\nreplace = "lower"', "must be true or false, or a list of the default lists"),
    ('[loss_scale]\nmax_consecutive_skips = true', "or false: no limit"),
    ('unlisted = "fp16"', "unlisted = 'fp16': must be one of"),
    ('native_version = 2.6', "native_version = 2.6: must be a string"),
])
def test_the_new_keys_refuse_bad_values_naming_them(text, says):
    from amp_adapters import AmpConfigError
    with pytest.raises(AmpConfigError) as e:
        Policy.from_dict(tomllib.loads(text), where="p.toml")
    assert says in str(e.value), str(e.value)
