"""Policy: presets, files, overrides, and the errors that name what is wrong."""
import math

import pytest

from amp_adapters import (AmpConfigError, ConflictingOpError, DynamicLossScale, NoOpLossScale,
                          OpLists, Policy, StaticLossScale, UnknownChoiceError, UnknownOpError)


def test_presets():
    assert (Policy.preset("O1").dtype, Policy.preset("O1").level) == ("float16", "O1")
    assert Policy.preset("O2-bf16").dtype == "bfloat16"
    assert not Policy.preset("O0").enabled
    assert Policy.preset("O1", emulate=True).emulate


def test_default_loss_scale_follows_dtype():
    assert isinstance(Policy.preset("O1").loss_scale, DynamicLossScale)
    assert isinstance(Policy.preset("O1-bf16").loss_scale, NoOpLossScale)
    assert isinstance(Policy.preset("O0").loss_scale, NoOpLossScale)


@pytest.mark.parametrize("kwargs, needle", [
    (dict(dtype="float61"), "'float16'"),
    (dict(level="O3"), "level"),
    (dict(dtype="float32", level="O1"), "O0"),
    (dict(dtype="float16", level="O0"), "O0"),
])
def test_bad_dtype_or_level_is_named(kwargs, needle):
    with pytest.raises(AmpConfigError, match=needle):
        Policy(**kwargs)


@pytest.mark.parametrize("build, needle", [
    (lambda: Policy(emulate="false"), "emulate"),
    (lambda: Policy(loss_scale="garbage"), "loss_scale"),
    (lambda: OpLists(replace="false"), "replace"),
])
def test_wrong_types_are_named(build, needle):
    with pytest.raises(AmpConfigError, match=needle):
        build()


def test_unknown_preset_suggests():
    with pytest.raises(UnknownChoiceError, match="O1-bf16"):
        Policy.preset("O1-bf61")


def test_op_in_two_categories_is_an_error():
    with pytest.raises(ConflictingOpError, match="'softmax'.*fp32, lower"):
        OpLists(lower={"softmax"}, fp32={"softmax"})


def test_string_instead_of_list_is_an_error():
    with pytest.raises(AmpConfigError, match=r"\['softmax'\]"):
        OpLists(lower="softmax")


def test_unknown_canonical_name_with_close_match():
    with pytest.raises(UnknownOpError, match="'softmx'.*'softmax'"):
        Policy(ops=OpLists(lower={"softmx"}))
    assert issubclass(UnknownOpError, ValueError)


def test_framework_names_checked_against_a_registry():
    p = Policy(mxnet_ops=OpLists(fp32={"FullyConected"}))
    with pytest.raises(UnknownOpError, match="'FullyConected'.*'FullyConnected'"):
        p.validate_for("mxnet")
    Policy(mxnet_ops=OpLists(fp32={"_npi_sin"})).validate_for("mxnet", registry={"_npi_sin"})


POLICY_FILE = """
preset = "O1"
emulate = true
[ops]
lower = ["softmax"]
fp32 = ["matmul"]
[ops.mxnet]
fp32 = ["Dropout"]
conditional_fp32 = [{ op = "LeakyReLU", attr = "act_type", values = ["gelu"] }]
[ops.paddle]
promote = ["gelu"]
[loss_scale]
init_scale = 1024
growth_interval = 100
hysteresis = 2
max_scale = "inf"
"""


def test_from_file(tmp_path):
    path = tmp_path / "policy.toml"
    path.write_text(POLICY_FILE)
    p = Policy.from_file(path)
    assert (p.dtype, p.level, p.emulate) == ("float16", "O1", True)
    assert p.ops.lower == {"softmax"} and p.ops.fp32 == {"matmul"}
    assert p.mxnet_ops.fp32 == {"Dropout"}
    assert p.mxnet_ops.conditional_fp32 == (("LeakyReLU", "act_type", ("gelu",)),)
    assert p.paddle_ops.promote == {"gelu"}
    assert p.loss_scale == DynamicLossScale(scale=1024, growth_interval=100, hysteresis=2,
                                            max_scale=math.inf)
    assert hash(p) == hash(Policy.from_file(path))  # hashable, equal by value


@pytest.mark.parametrize("text, needle", [
    ("dtyp = 'float16'", "'dtyp'.*'dtype'"),
    ("[ops]\nlowr = ['matmul']", "'lowr'.*'lower'"),
    ("[loss_scale]\nkind = 'statik'", "'statik'.*'static'"),
    ("[ops]\nlower = ['matmul']\nfp32 = ['matmul']", "'matmul'"),
    ("preset = 'O9'", "'O9'"),
    ("dtype = ", "not valid TOML"),
])
def test_bad_file_is_named(tmp_path, text, needle):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(AmpConfigError, match=needle):
        Policy.from_file(path)


def test_missing_file():
    with pytest.raises(AmpConfigError, match="does not exist"):
        Policy.from_file("/nonexistent/policy.toml")


def test_static_loss_scale_from_file(tmp_path):
    path = tmp_path / "p.toml"
    path.write_text("[loss_scale]\nkind = 'static'\ninit_scale = 128")
    assert Policy.from_file(path).loss_scale == StaticLossScale(128.0)
