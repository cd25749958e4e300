"""Fuzz the three entry points: policy dicts, loss-scale constructor arguments, state dicts.

Every input either builds a value that is internally consistent, or raises an
``AmpConfigError`` (or a ``TypeError`` naming the argument): never a KeyError,
an OverflowError, an AttributeError, a half-built value. Derandomized and
bounded so ``make test`` stays fast and deterministic.
"""
import importlib.util
import json
import math
from decimal import Decimal
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from amp_adapters import (AmpConfigError, DynamicLossScale, NoOpLossScale, Policy,
                          StaticLossScale, loss_scale_from_state_dict)
from amp_adapters.services.checkpoint import describe_policy
from amp_adapters.rules.oplists import CATEGORIES, canonical_ops, load_table

# The loss-scale fuzz needs issue 11's strict core (amp_adapters/rules/loss_scale/): the older one
# fails it at once (a state_dict with kind=[] raises "unhashable type", a missing key is filled
# with its default).
STRICT_CORE = importlib.util.find_spec("amp_adapters.rules.loss_scale") is not None
needs_strict_core = pytest.mark.skipif(
    not STRICT_CORE, reason="needs issue 11's strict loss-scale core (amp_adapters.rules.loss_scale)")

FUZZ = settings(derandomize=True, max_examples=300, deadline=None,
                suppress_health_check=list(HealthCheck))

CANONICAL = sorted(canonical_ops())[:12]
MXNET = sorted(load_table("mxnet").names)[:8]
PADDLE = sorted(load_table("paddle").names)[:8]

# Scalars of every kind a user (or a TOML file, or numpy) can hand over.
numbers = st.one_of(
    st.integers(-5, 70000), st.integers(), st.just(10**400), st.just(-(10**400)),
    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([0.0, 1e-46, 1e39, 2.0**16]),
    st.booleans(),
    st.builds(np.float32, st.floats(-1e6, 1e6, width=32)), st.builds(np.int64, st.integers(-3, 9)),
    st.just(Decimal("1024")), st.just(Fraction(3, 2)))
junk = st.one_of(st.none(), numbers, st.text(max_size=6), st.just("inf"),
                 st.lists(st.integers(), max_size=2), st.dictionaries(st.text(max_size=3),
                                                                       st.integers(), max_size=2))
names = st.one_of(st.sampled_from(CANONICAL + MXNET + PADDLE + ["softmx", "", "Dropot"]),
                  st.integers(), st.none())
name_lists = st.one_of(st.lists(names, max_size=3), st.sampled_from(CANONICAL), junk)
rule = st.one_of(
    st.fixed_dictionaries({"op": names, "attr": st.sampled_from(["act_type", 3]),
                           "values": st.one_of(st.lists(st.sampled_from(["gelu", 1]), max_size=2),
                                               st.just("gelu"))},
                          optional={"valeus": st.just(["gelu"])}),
    st.tuples(names, st.just("act_type"), st.lists(st.just("gelu"), max_size=1)), junk)
op_table = st.one_of(
    st.dictionaries(st.sampled_from([*CATEGORIES, "replace", "conditional_fp32", "lowr"]),
                    st.one_of(name_lists, st.booleans(), st.lists(rule, max_size=2)),
                    max_size=4), junk)
SCALE_KEYS = ["kind", "init_scale", "scale", "growth_factor", "backoff_factor",
              "growth_interval", "hysteresis", "min_scale", "max_scale",
              "max_consecutive_skips", "good_steps", "growth_intervall"]
loss_table = st.one_of(
    st.dictionaries(st.sampled_from(SCALE_KEYS),
                    st.one_of(numbers, st.sampled_from(["dynamic", "static", "none", "inf"]),
                              junk), max_size=4), junk)
ops_section = st.one_of(
    st.dictionaries(st.sampled_from([*CATEGORIES, "mxnet", "paddle", "replace",
                                     "conditional_fp32"]),
                    st.one_of(name_lists, op_table), max_size=4), junk)
policy_dicts = st.dictionaries(
    st.sampled_from(["preset", "dtype", "level", "emulate", "ops", "loss_scale", "dtyp"]),
    st.one_of(st.sampled_from(["O1", "O2", "O0", "O1-bf16", "float16", "bf16", "float32",
                               "fp8", True, False]), ops_section, loss_table, junk),
    max_size=5)


def _check_loss_scale(s):
    """Invariants of an accepted loss scale, and two steps of it."""
    assert math.isfinite(s.scale) and s.scale > 0 or isinstance(s, NoOpLossScale)
    if isinstance(s, DynamicLossScale):
        assert s.min_scale <= s.scale <= s.max_scale
        assert s.growth_factor > 1 and 0 < s.backoff_factor < 1
        assert s.growth_interval >= 1 and s.hysteresis >= 1
    for field in ("good_steps", "bad_steps", "total_steps", "skipped_steps",
                  "consecutive_skips"):
        value = getattr(s, field, 0)
        assert isinstance(value, int) and not isinstance(value, bool) and value >= 0
    for found_inf in (True, False):
        nxt = s.adjust(found_inf)
        assert math.isfinite(nxt.scale) and nxt.scale > 0
        assert nxt.total_steps == s.total_steps + 1
    assert loss_scale_from_state_dict(s.state_dict()) == s
    json.dumps(s.state_dict())


def _is_clear(e, names=()):
    """An AmpConfigError, or a TypeError whose message names one of the arguments."""
    if isinstance(e, AmpConfigError):
        return True
    return isinstance(e, TypeError) and any(n in str(e) for n in names)


@FUZZ
@given(policy_dicts)
def test_policy_dict_is_a_consistent_policy_or_a_clear_error(d):
    try:
        p = Policy.from_dict(d, where="policy file 'f.toml'")
    except AmpConfigError as e:
        assert str(e).startswith("policy file 'f.toml'"), e
        return
    assert p == Policy.from_dict(d) and hash(p) == hash(Policy.from_dict(d))
    assert (p.dtype, p.level) in {("float32", "O0"), ("float16", "O1"), ("float16", "O2"),
                                  ("bfloat16", "O1"), ("bfloat16", "O2")}
    assert p.ops.names() <= canonical_ops()
    for lists in (p.ops, p.mxnet_ops, p.paddle_ops):
        seen = [n for c in CATEGORIES for n in getattr(lists, c)]
        assert len(seen) == len(set(seen)) and all(isinstance(n, str) and n for n in seen)
        for op, attr, values in lists.conditional_fp32:
            assert isinstance(op, str) and isinstance(attr, str)
            assert values and all(isinstance(v, str) for v in values)
    _check_loss_scale(p.loss_scale)
    json.dumps(describe_policy(p))


KINDS = {"dynamic": DynamicLossScale, "static": StaticLossScale, "none": NoOpLossScale}
FIELDS = {"dynamic": ["scale", "growth_factor", "backoff_factor", "growth_interval",
                      "hysteresis", "min_scale", "max_scale", "max_consecutive_skips",
                      "good_steps", "total_steps"],
          "static": ["scale", "max_consecutive_skips", "skipped_steps", "total_steps"],
          "none": ["total_steps"]}


@needs_strict_core
@FUZZ
@given(st.sampled_from(sorted(KINDS)).flatmap(lambda k: st.tuples(
    st.just(k), st.dictionaries(st.sampled_from(FIELDS[k]), st.one_of(numbers, junk),
                                max_size=4))))
def test_loss_scale_arguments_build_a_consistent_value_or_a_clear_error(case):
    kind, kw = case
    try:
        s = KINDS[kind](**kw)
    except (AmpConfigError, TypeError) as e:
        assert _is_clear(e, kw), f"{type(e).__name__}: {e}"
        return
    _check_loss_scale(s)


def _valid_states():
    return st.one_of(
        st.builds(lambda sc, g: DynamicLossScale(scale=sc, growth_interval=g),
                  st.sampled_from([1.0, 8.0, 2.0**16]), st.integers(1, 5)),
        st.builds(lambda sc: StaticLossScale(scale=sc), st.sampled_from([1.0, 128.0])),
        st.just(NoOpLossScale()))


def _mutated(draw_state, edits):
    d = draw_state.state_dict()
    for op, key, value in edits:
        target = d
        if isinstance(d.get("state"), dict) and key in d["state"]:  # nested formats too
            target = d["state"]
        elif isinstance(d.get("config"), dict) and key in d["config"]:
            target = d["config"]
        if op == "del":
            target.pop(key, None)
        else:
            target[key] = value
    return d


STATE_KEYS = ["kind", "scale", "good_steps", "bad_steps", "total_steps", "skipped_steps",
              "consecutive_skips", "growth_factor", "growth_interval", "min_scale",
              "max_scale", "max_consecutive_skips", "format_version", "config", "state", "extra"]


@needs_strict_core
@FUZZ
@given(_valid_states(), st.lists(st.tuples(st.sampled_from(["del", "set"]),
                                           st.sampled_from(STATE_KEYS),
                                           st.one_of(numbers, junk,
                                                     st.sampled_from(["dynamic", "static"]))),
                                 min_size=1, max_size=3))
def test_state_dict_loads_a_consistent_value_or_a_clear_error(state, edits):
    d = _mutated(state, edits)
    try:
        s = loss_scale_from_state_dict(d)
    except (AmpConfigError, TypeError) as e:
        assert _is_clear(e, ["state_dict", "d"]), f"{type(e).__name__}: {e}"
        return
    _check_loss_scale(s)


@FUZZ
@given(st.one_of(st.binary(max_size=80),
                 st.lists(st.sampled_from([b"preset = 'O1'\n", b"dtype = 'bf16'\n", b"[ops]\n",
                                           b"lower = ['softmax']\n", b"[ops.mxnet]\n",
                                           b"fp32 = 'Dropout'\n", b"[loss_scale]\n",
                                           b"init_scale = 1" + b"0" * 400 + b"\n",
                                           b"\xef\xbb\xbf", b"\xff", b"x = [1,\n", b"dtype = 1\n"]),
                          max_size=5).map(b"".join)))
def test_policy_file_bytes_are_a_policy_or_a_clear_error(tmp_path_factory, data):
    path = tmp_path_factory.mktemp("f") / "p.toml"
    path.write_bytes(data)
    try:
        p = Policy.from_file(path)
    except AmpConfigError as e:
        assert f"policy file {str(path)!r}" in str(e), e
        return
    assert p == Policy.from_file(path)


@FUZZ
@given(st.dictionaries(st.sampled_from(["dtype", "level", "emulate", "ops", "mxnet_ops",
                                        "paddle_ops", "loss_scale"]),
                       st.one_of(junk, st.sampled_from(["float16", "bf16", "O1", "O2"]),
                                 st.builds(lambda **kw: __import__("amp_adapters").OpLists(**kw),
                                           lower=st.just(["softmax"]))),
                       max_size=3),
       st.dictionaries(st.sampled_from([*CATEGORIES, "conditional_fp32", "replace"]),
                       st.one_of(name_lists, st.lists(rule, max_size=2), st.booleans()),
                       max_size=3))
def test_policy_and_oplists_constructors_build_or_raise_clearly(policy_kw, lists_kw):
    from amp_adapters import OpLists
    for build, kw in ((Policy, policy_kw), (OpLists, lists_kw)):
        try:
            value = build(**kw)
        except AmpConfigError:
            continue
        assert value == build(**kw) and hash(value) == hash(build(**kw))


@pytest.mark.parametrize("scale", [10**400, -(10**400), 0, float("inf")])
def test_static_scale_out_of_range_is_a_config_error(scale):
    """A static scale that is no finite positive float32 (an int too large for a float
    included: math.isfinite would raise OverflowError on it) is a clear AmpConfigError."""
    with pytest.raises(AmpConfigError, match="StaticLossScale.scale must be finite and > 0"):
        StaticLossScale(scale=scale)
