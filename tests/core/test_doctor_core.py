"""The doctor's core: range statistics, findings in order, the recommended policy file."""
import math
import tomllib

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from amp_adapters import OpLists, Policy
from amp_adapters.services.doctor import (Recorder, flush_fraction, policy_toml, range_stats,
                                          recommend, relative_error, scale_ceiling,
                                          scale_for_gradients)
from amp_adapters.rules.loss_scale import LossScaleConfig

finite32 = st.floats(allow_nan=False, allow_infinity=False, width=32)


@settings(max_examples=60, deadline=None)
@given(st.lists(finite32, min_size=1, max_size=40))
def test_range_stats_agree_with_a_real_float16_cast(values):
    x = np.array(values, np.float32)
    r = range_stats(x, "float16")
    with np.errstate(over="ignore"):
        h = x.astype(np.float16)
    assert r.overflow == pytest.approx(np.isinf(h).sum() / x.size)
    assert r.flush_zero == pytest.approx(((h == 0) & (x != 0)).sum() / x.size)
    assert r.max_abs == pytest.approx(float(np.abs(x).max()))
    assert r.nonfinite == 0.0


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(1e-30, 1.0), min_size=1, max_size=30),
       st.integers(0, 40))
@example([2.0 ** -52], 27)  # exactly half fp16's smallest subnormal: a tie, rounds to 0
def test_flush_fraction_agrees_with_scaling_then_casting(values, exp):
    g = np.array(values, np.float32)
    scale = 2.0 ** exp
    expect = ((g.astype(np.float64) * scale).astype(np.float16) == 0).sum() / g.size
    assert flush_fraction(g, scale, "float16") == pytest.approx(expect)


def test_scale_for_gradients_is_the_smallest_power_of_two_that_keeps_them():
    g = np.full(10, 1e-13)
    s = scale_for_gradients([g], "float16", 2.0 ** 24)
    assert flush_fraction(g, s, "float16") == 0 and flush_fraction(g, s / 2, "float16") == 1
    assert scale_for_gradients([np.full(3, 1e-20)], "float16", 2.0 ** 24) is None


def test_the_scale_ceiling_is_a_dynamic_scales_own_else_the_core_default():
    """The highest scale the doctor proposes: what a dynamic scale may grow to, else (a static
    scale, none: no growth) a dynamic scale's default ceiling, as the core defines it, which
    both backends' doctors take from here."""
    assert scale_ceiling(Policy(loss_scale=LossScaleConfig(max_scale=2.0 ** 20))
                         .loss_scale_config) == 2.0 ** 20
    default = LossScaleConfig().max_scale
    for kind in ("static", "none"):
        config = LossScaleConfig(kind=kind, init_scale=1.0, min_scale=0.0, max_scale=math.inf)
        assert scale_ceiling(config) == default
    assert scale_ceiling(Policy.preset("O1-bf16").loss_scale_config) == default
    assert Recorder("mxnet", "float16", emulated=False).max_scale == default


def test_relative_error():
    assert relative_error(np.ones(3), np.ones(3)) == 0
    assert relative_error(np.array([np.inf, 1]), np.ones(2)) == math.inf
    assert relative_error(np.array([2.0]), np.array([1.0])) == 1.0
    with pytest.raises(ValueError, match="shapes differ"):
        relative_error(np.ones(2), np.ones(3))


def _planted_report():
    """One step: a matmul overflows, a sum adds error, a weight's gradient underflows."""
    r = Recorder("mxnet", "float16", emulated=True)
    r.begin_step(2.0 ** 16)
    raw = np.array([1e5, 1.0], np.float32)
    r.forward("relu0", "relu", "relu", "follow", "float32", False, np.ones(2), np.ones(2))
    r.forward("dot0", "dot", "matmul", "lower", "float16", True, np.array([np.inf, 1.0]), raw,
              inputs=[np.ones(2)], input_refs=[np.ones(2)], raw=raw)
    r.forward("sum0", "sum", "sum", "lower", "float16", True, np.array([0.0]), np.array([1.0]))
    r.backward("dot0", [np.array([np.nan])])
    r.gradients({"w": np.zeros(2), "b": np.array([np.nan])},
                {"w": np.array([1e-13, 2e-13]), "b": np.array([1.0])})
    r.end_step()
    return r.report()


def test_findings_name_the_first_non_finite_op_first():
    rep = _planted_report()
    kinds = [(f.kind, f.name, f.action) for f in rep.findings()]
    assert kinds[0] == ("overflow", "dot0", "fp32")
    assert ("precision", "sum0", "fp32") in kinds
    under = [f for f in rep.findings() if f.kind == "underflow"][0]
    assert under.action == "loss_scale" and flush_fraction([1e-13], under.value, "float16") == 0
    step = rep.steps[0]
    assert step.overflow and step.first_forward == "dot0" and step.nonfinite_params == ("b",)
    text = rep.format()
    assert "EMULATED" in text and "dot0" in text and "first non-finite forward op: dot0" in text


def test_the_report_and_its_file_say_the_same_about_how_the_low_dtype_ran():
    """Non-finite gradients are named in sorted order (the IRs list parameters differently),
    and the policy file's header says what the report's first line says."""
    emulated = _planted_report()
    assert emulated.steps[0].nonfinite_params == ("b",) and emulated.mode == "fp16 EMULATED"
    r = Recorder("paddle", "bfloat16", emulated=False)
    r.begin_step(1.0)
    r.forward("relu0", "relu", "relu", "follow", "float32", False, np.ones(2), np.ones(2))
    r.gradients({"w2": np.array([np.nan]), "w1": np.array([np.inf])},
                {"w2": np.ones(1), "w1": np.ones(1)})
    r.end_step()
    idle = r.report()
    assert idle.steps[0].nonfinite_params == ("w1", "w2")
    assert idle.mode == "bf16 policy, but no op runs in bf16"
    for rep in (emulated, idle):
        head = recommend(rep, Policy.preset("O1")).toml.splitlines()[0]
        assert f", {rep.mode};" in head and rep.mode in rep.format().splitlines()[0]


@pytest.mark.parametrize("base", ["O1", "mxnet-native", "O2"])
def test_the_recommendation_loads_back_unchanged(base, tmp_path):
    policy = Policy.preset(base, emulate=True, ops=OpLists(lower=frozenset({"sum"})))
    rec = recommend(_planted_report(), policy)
    path = tmp_path / "fix.toml"
    rec.write(path)
    loaded = Policy.from_file(path)
    assert loaded == rec.policy
    assert {"matmul", "sum"} <= loaded.ops.fp32 and "sum" not in loaded.ops.lower
    assert loaded.loss_scale.scale == 2.0 ** 19
    text = path.read_text()
    assert "# overflow: dot output reaches" in text and "# precision: sum" in text


def test_every_fix_says_why_it_starts_the_loss_scale_higher():
    """The scale the underflowing gradients need is part of every fix, with its reason as
    the comment of init_scale, whichever fix it is (the loss scale alone, a layer, an op
    type); without a replay the recommendation is the widest fix, by the same code."""
    from amp_adapters.services.doctor.candidates import candidates
    policy = Policy.preset("O1", emulate=True)
    rep = _planted_report()
    fixes = candidates(rep, policy)
    assert [c.kind for c in fixes] == ["loss_scale", "layers", "ops"]
    for c in fixes:
        line = next(x for x in policy_toml(c.policy, c.reasons).splitlines()
                    if x.startswith("init_scale"))
        assert line.startswith("init_scale = 524288   # underflow: at loss scale 65536"), c.kind
    unverified = recommend(rep, policy)
    assert unverified.policy == fixes[-1].policy
    assert unverified.toml.split("\n[", 1)[1] == policy_toml(fixes[-1].policy,
                                                           fixes[-1].reasons).split("\n[", 1)[1]


op_names = st.sampled_from(["matmul", "sum", "exp", "softmax", "relu", "gelu", "add"])


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(["O1", "O2", "O1-bf16", "mxnet-native"]), st.booleans(),
       st.dictionaries(op_names, st.sampled_from(["lower", "fp32", "promote", "follow"]),
                       max_size=5),
       st.integers(0, 24))
def test_policy_toml_round_trips_through_the_core_loader(base, emulate, cats, exp):
    ops = OpLists(**{c: frozenset(n for n, k in cats.items() if k == c)
                     for c in ("lower", "fp32", "promote", "follow")})
    policy = Policy.preset(base, emulate=emulate, ops=ops)
    if policy.dtype == "float16":
        from amp_adapters import DynamicLossScale
        policy = policy.replace(loss_scale=DynamicLossScale(scale=2.0 ** exp, growth_interval=7))
    text = policy_toml(policy, {"ops": {n: "why # not a key = 1" for n in cats}})
    assert Policy.from_dict(tomllib.loads(text)) == policy


@settings(max_examples=80, deadline=None)
@given(st.lists(st.floats(width=32), min_size=1, max_size=40))
def test_a_non_finite_value_shows_in_max_and_counts_as_overflowed(values):
    """An output that is already inf or nan is inf or nan in float16 too: it counts in the
    overflow fraction and shows in max|out| (before: max 0 and 0% for an all-inf output)."""
    x = np.array(values, np.float32)
    r = range_stats(x, "float16")
    with np.errstate(over="ignore", invalid="ignore"):
        h = x.astype(np.float16)
    assert r.overflow == pytest.approx((~np.isfinite(h)).sum() / x.size)
    if np.isinf(x).any():
        assert r.max_abs == math.inf
    elif np.isnan(x).any():
        assert math.isnan(r.max_abs)
    else:
        assert r.max_abs == pytest.approx(float(np.abs(x).max()))


def test_the_table_shows_an_inf_or_nan_output_as_such():
    r = Recorder("mxnet", "float16", emulated=False)
    for out in (np.array([np.inf, 1.0]), np.array([np.nan, np.nan])):
        r.begin_step(1.0)
        r.forward("dot0", "dot", "matmul", "lower", "float16", False, np.ones(2), np.ones(2))
        r.forward("relu0", "relu", "relu", "follow", "float32", False, out, np.ones(2))
        r.forward("nan0", "exp", "exp", "fp32", "float32", False, np.array([np.nan]),
                  np.ones(1))
        r.end_step()
    rep = r.report()
    assert rep.op_named("relu0").worst()[:2] == (math.inf, 1.0)  # inf outranks a later nan
    assert math.isnan(rep.op_named("nan0").worst()[0])
    rows = {line.split()[1]: line.split() for line in rep.format().splitlines()
            if line.strip().startswith(("1 ", "2 "))}
    assert rows["relu0"][5:7] == ["inf", "100.0%"], rows    # was: 0  0.0%
    assert rows["nan0"][5:7] == ["nan", "100.0%"], rows


def test_a_policy_that_leaves_no_op_low_is_said_plainly():
    r = Recorder("paddle", "float16", emulated=True)
    r.begin_step(1.0)
    r.forward("matmul0", "matmul_v2", "matmul", "fp32", "float32", False, np.ones(2),
              np.ones(2))
    r.end_step()
    rep = r.report()
    text = rep.format().splitlines()
    assert text[1].startswith("NOTE: no op of this model runs in fp16 under this policy")
    assert text[-1] == "findings: none, but no op runs in fp16 (see the NOTE above)"
    assert rep.idle == text[1]
    r = Recorder("paddle", "float16", emulated=True)
    r.begin_step(1.0)
    r.forward("matmul0", "matmul_v2", "matmul", "lower", "float16", True, np.ones(2),
              np.ones(2))
    r.end_step()
    low = r.report()  # the same op, low this time: nothing to note
    assert low.idle is None and "NOTE" not in low.format()
