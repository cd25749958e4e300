"""The dtype vocabulary: every spelling to one name, and the rules the backends used to copy."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from amp_adapters import (AmpConfigError, DynamicLossScale, NoOpLossScale, Policy,
                          StaticLossScale, UnknownChoiceError)
from amp_adapters.rules.dtypes import (ALIASES, AMP_DTYPES, FLOAT_DTYPES, LOW_DTYPES, POLICY_DTYPES,
                                       SHORT_NAMES, dtype_name, low_dtype, short_name, widest)
from amp_adapters.rules.policy import default_loss_scale

MXNET_BF16 = np.dtype([("bfloat16", np.uint16)])  # how MXNet 1.x spells bfloat16 (no mxnet here)


@pytest.mark.parametrize("spelling, name", [
    ("float16", "float16"), ("fp16", "float16"), ("half", "float16"), (" FP16 ", "float16"),
    ("bfloat16", "bfloat16"), ("bf16", "bfloat16"), ("BF16", "bfloat16"),
    ("float32", "float32"), ("fp32", "float32"), ("single", "float32"),
    ("float64", "float64"), ("double", "float64"),
    (np.float16, "float16"), (np.dtype("float32"), "float32"), (float, "float64"),
    (MXNET_BF16, "bfloat16"),
    ("paddle.float16", "float16"), ("torch.bfloat16", "bfloat16"), ("VarType.FP32", "float32"),
    ("int32", "int32"), (np.int64, "int64"), ("bool", "bool"), ("f2", "float16"),
])
def test_every_spelling_has_one_name(spelling, name):
    assert dtype_name(spelling) == name


class VarTypeLike:
    """A framework dtype object, known only by its str (as Paddle's VarType.FP16)."""

    def __init__(self, text):
        self.text = text

    def __str__(self):
        return self.text


@pytest.mark.parametrize("text, name", [("VarType.FP16", "float16"), ("VarType.BF16", "bfloat16"),
                                        ("paddle.float32", "float32"), ("VarType.INT64", "int64")])
def test_framework_dtype_objects_are_read_by_their_last_name(text, name):
    assert dtype_name(VarTypeLike(text)) == name


@pytest.mark.parametrize("bad", ["fp8", "flaot16", "", None, 3, VarTypeLike("<nothing>")])
def test_a_value_that_names_no_dtype_is_an_error_naming_it(bad):
    with pytest.raises(UnknownChoiceError, match="dtype"):
        dtype_name(bad)


def test_float_alone_is_refused_not_guessed():
    with pytest.raises(AmpConfigError, match="ambiguous.*'float32' or 'float64'"):
        dtype_name("float")


def test_a_misspelling_gets_close_matches():
    with pytest.raises(UnknownChoiceError, match="Did you mean 'float16'"):
        dtype_name("flaot16")


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.sampled_from(sorted(ALIASES)), st.lists(st.booleans(), min_size=8, max_size=8),
       st.sampled_from(["", " ", "\t"]))
def test_aliases_ignore_case_and_space_and_are_idempotent(alias, upper, pad):
    spelled = pad + "".join(c.upper() if u else c for c, u in zip(alias, upper * 2)) + \
        alias[16:] + pad
    name = dtype_name(spelled)
    assert name in FLOAT_DTYPES
    assert dtype_name(name) == name                 # canonical names are fixed points
    assert name == ALIASES[alias]


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.one_of(st.text(max_size=12), st.integers(), st.none(), st.floats()))
def test_any_value_gives_a_name_or_a_config_error(value):
    try:
        name = dtype_name(value)
    except AmpConfigError:
        return
    assert isinstance(name, str) and dtype_name(name) == name


def test_the_vocabulary_is_consistent():
    assert set(LOW_DTYPES) < set(POLICY_DTYPES) == AMP_DTYPES < set(FLOAT_DTYPES)
    assert set(SHORT_NAMES) == set(FLOAT_DTYPES)
    assert [short_name(d) for d in FLOAT_DTYPES] == ["fp16", "bf16", "fp32", "fp64"]
    assert widest(list(LOW_DTYPES)) == "float32"    # neither low dtype holds the other


@pytest.mark.parametrize("spelling, ok", [("fp16", "float16"), (np.float16, "float16"),
                                          ("bf16", "bfloat16"), (MXNET_BF16, "bfloat16"),
                                          ("float32", None), ("int8", None), ("fp8", None)])
def test_low_dtype_accepts_only_the_low_dtypes_and_names_the_argument(spelling, ok):
    if ok:
        assert low_dtype(spelling, "target_dtype") == ok
    else:
        with pytest.raises(UnknownChoiceError, match=r"unknown target_dtype .*'bfloat16'"):
            low_dtype(spelling, "target_dtype")


def test_a_policy_takes_any_spelling_and_keeps_one_name():
    assert Policy(dtype="fp16") == Policy(dtype="float16")
    assert Policy(dtype=np.float16).dtype == "float16"
    assert Policy.from_dict({"dtype": "bf16"}).dtype == "bfloat16"
    with pytest.raises(UnknownChoiceError, match="dtype 'int8'"):
        Policy(dtype="int8")


# -- rules that used to be written in two places ----------------------------------------------

def test_default_loss_scale_per_dtype():
    """float16 scales (dynamic unless the caller supplies its native default); the dtypes with
    float32's exponent range do not, and their ``scaled`` default is never even built."""
    def never():
        raise AssertionError("built a loss scale for a dtype that needs none")

    assert default_loss_scale("float16") == DynamicLossScale()
    assert default_loss_scale("float16", lambda: StaticLossScale(8.0)) == StaticLossScale(8.0)
    for dtype in ("bfloat16", "float32"):
        assert default_loss_scale(dtype, never) == NoOpLossScale()
    for dtype in POLICY_DTYPES:
        level = "O0" if dtype == "float32" else "O1"
        assert Policy(dtype=dtype, level=level).loss_scale == default_loss_scale(dtype)


@pytest.mark.parametrize("policy_emulates, argument, result", [
    (False, False, False), (False, True, True), (True, False, True), (True, True, True),
])
def test_the_emulate_argument_adds_to_the_policy_never_removes(policy_emulates, argument, result):
    policy = Policy.preset("O1", emulate=policy_emulates)
    merged = policy.with_emulation(argument)
    assert merged.emulate is result
    assert merged.replace(emulate=policy_emulates) == policy  # nothing else changes
