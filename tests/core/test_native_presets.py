"""The native presets (``mxnet-native``, ``paddle-native``) against the installed natives.

``amp_adapters/rules/oplists/native.toml`` must hold every default list of the
installed ``mxnet.contrib.amp`` and ``paddle.static.amp`` exactly, and the
planner must put each op where the native would. Each framework part skips
with a reason when the framework is not installed; run this file under both
Paddle versions (``make test`` and ``make test-paddle3`` do).
"""
import os

os.environ.setdefault("FLAGS_enable_pir_api", "0")

import pytest  # noqa: E402

from amp_adapters import AmpConfigError, Policy, categorize, effective_lists  # noqa: E402
from amp_adapters.rules.oplists import (installed_version, native_lists, native_versions,
                                        pick_version)
from amp_adapters.rules.policy import PRESETS, resolve_policy  # noqa: E402


@pytest.fixture(scope="module")
def mx_lists():
    pytest.importorskip("mxnet")
    from mxnet.contrib.amp.lists import symbol_bf16, symbol_fp16
    return {"float16": (symbol_fp16, "FP16"), "bfloat16": (symbol_bf16, "BF16")}


@pytest.fixture(scope="module")
def pd_lists():
    pytest.importorskip("paddle")
    import paddle
    paddle.enable_static()
    return paddle.static.amp


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_mxnet_native_data_is_the_installed_lists(mx_lists, dtype):
    mod, p = mx_lists[dtype]
    n = native_lists("mxnet", dtype)
    import mxnet
    assert n.version == mxnet.__version__
    assert n.lower == set(getattr(mod, f"{p}_FUNCS"))
    assert n.follow == set(getattr(mod, f"{p}_FP32_FUNCS"))
    assert n.fp32 == set(mod.FP32_FUNCS)
    assert n.promote == set(mod.WIDEST_TYPE_CASTS)
    assert list(n.loss_output) == sorted(mod.LOSS_OUTPUT_FUNCTIONS)
    assert [(o, a, list(v)) for o, a, v in n.conditional_fp32] == \
        [(o, a, list(v)) for o, a, v in mod.CONDITIONAL_FP32_FUNCS]


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_mxnet_native_preset_decides_like_the_native_lists(mx_lists, dtype):
    mod, p = mx_lists[dtype]
    policy = Policy.preset("mxnet-native", dtype=dtype)
    lists = effective_lists(policy, "mxnet")
    assert lists["lower"] == sorted(getattr(mod, f"{p}_FUNCS"))
    assert lists["fp32"] == sorted(mod.FP32_FUNCS)
    assert lists["promote"] == sorted(mod.WIDEST_TYPE_CASTS)
    assert lists["follow"] == sorted(getattr(mod, f"{p}_FP32_FUNCS"))
    for op, attr, values in mod.CONDITIONAL_FP32_FUNCS:
        for v in values:
            assert categorize(policy, "mxnet", op, {attr: v}).category == "fp32"
    # an op the native lists do not name follows its inputs, as natively (no wrapper)
    assert categorize(policy, "mxnet", "_npi_exp").category == "follow"


def test_paddle_native_data_is_the_installed_lists(pd_lists):
    import paddle
    for dtype in ("float16", "bfloat16"):
        native = pd_lists.AutoMixedPrecisionLists(dtype=dtype)
        n = native_lists("paddle", dtype)
        assert n.version == paddle.__version__
        assert (n.lower, n.fp32, n.promote) == (native.white_list, native.black_list,
                                                native.gray_list)
    bf16 = pd_lists.bf16.AutoMixedPrecisionListsBF16()
    n = native_lists("paddle", "bfloat16-lists")
    assert (n.lower, n.fp32, n.promote, n.initializers) == (
        bf16.bf16_list, bf16.fp32_list, bf16.gray_list, bf16.bf16_initializer_list)


def test_paddle_native_preset_decides_like_paddle(pd_lists):
    native = pd_lists.AutoMixedPrecisionLists()
    policy = Policy.preset("paddle-native")
    for op in sorted(native.black_list):
        assert categorize(policy, "paddle", op).category == "fp32", op
    for op in sorted(native.white_list - native.black_list):
        assert categorize(policy, "paddle", op).category == "lower", op
    for op in sorted(native.gray_list - native.white_list - native.black_list):
        assert categorize(policy, "paddle", op).category == "promote", op
    # Paddle's O1 runs an op in no list in fp32 ("for numerical safety"); use_promote promotes
    assert categorize(policy, "paddle", "abs").category == "fp32"
    assert categorize(policy.replace(unlisted="promote"), "paddle", "abs").category == "promote"
    # level OD: only white ops run low precision
    od = policy.replace(level="OD")
    assert categorize(od, "paddle", "matmul_v2").category == "lower"
    assert categorize(od, "paddle", "elementwise_add").category == "fp32"
    # O2 drops the default black list (only the extra black ops stay fp32)
    o2 = policy.replace(level="O2")
    assert categorize(o2, "paddle", "exp").category == "follow"
    assert categorize(o2, "paddle", "lookup_table").category == "fp32"


def test_version_pick():
    assert native_versions("paddle") == ("2.6.2", "3.3.1")
    assert pick_version("paddle", "3.0.0") == "2.6.2"
    assert pick_version("paddle", "3.3.1") == "3.3.1"
    assert pick_version("paddle", "9.0") == "3.3.1"
    assert pick_version("paddle", "1.0") == "2.6.2"
    if installed_version("paddle") in native_versions("paddle"):
        assert pick_version("paddle") == installed_version("paddle")
    # the two Paddle versions differ (3.3.1 has more white ops): both are held
    assert native_lists("paddle", "float16", "2.6.2").lower < \
        native_lists("paddle", "float16", "3.3.1").lower


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_resolve_policy_takes_every_preset_name(name):
    assert resolve_policy(name) == Policy.preset(name)


def test_resolve_policy_takes_a_policy_and_a_file(tmp_path):
    p = Policy.preset("O1-bf16")
    assert resolve_policy(p) is p
    f = tmp_path / "p.toml"
    f.write_text('preset = "paddle-native"\nemulate = true\n')
    assert resolve_policy(f) == Policy.preset("paddle-native", emulate=True)
    assert resolve_policy(str(f), dtype="bfloat16").dtype == "bfloat16"


@pytest.mark.parametrize("bad", ["O3", "mxnet_native"])
def test_resolve_policy_rejects_unknown_names_with_close_matches(bad):
    with pytest.raises(AmpConfigError, match="preset"):
        resolve_policy(bad)


@pytest.mark.parametrize("bad", [3, None, ["O1"]])
def test_resolve_policy_rejects_other_types(bad):
    with pytest.raises(TypeError, match="policy= must be a Policy, a preset name"):
        resolve_policy(bad)


def test_native_and_shared_differ_and_policy_fields_are_validated():
    assert Policy.preset("mxnet-native") != Policy.preset("O1")
    with pytest.raises(AmpConfigError, match="defaults"):
        Policy(defaults="torch")
    with pytest.raises(AmpConfigError, match="unlisted"):
        Policy(unlisted="lowest")


@pytest.mark.parametrize("framework, version", [("mxnet", "1.9.1"), ("paddle", "2.6.2"),
                                                ("paddle", "3.3.1")])
def test_readme_lists_every_difference_between_o1_and_the_native_defaults(framework, version):
    """The tables in docs/migrating.md (moved there from the README) are `amp-adapters diff`
    output: regenerate them when this fails."""
    from pathlib import Path

    from amp_adapters.services.native_diff import differences, markdown
    readme = (Path(__file__).resolve().parents[2] / "docs" / "migrating.md").read_text("utf-8")
    assert markdown(framework, "float16", version) in readme
    native = Policy.preset(f"{framework}-native", native_version=version)
    for d in differences(framework, "float16", version):
        assert categorize(native, framework, d.op).category == d.native
        assert categorize(Policy.preset("O1"), framework, d.op).category == d.shared != d.native


def test_cli_diff_prints_the_table(capsys):
    from amp_adapters.services.cli import main
    assert main(["diff", "--framework", "paddle", "--version", "2.6.2"]) == 0
    out = capsys.readouterr().out
    assert "| `relu` | relu | promote | follow |" in out


def test_an_op_in_a_list_and_in_conditional_fp32_is_a_conflict():
    from amp_adapters import ConflictingOpError, OpLists
    with pytest.raises(ConflictingOpError, match="'Activation'.*conditional_fp32"):
        OpLists(lower={"Activation"}, conditional_fp32=(("Activation", "act_type", ("relu",)),))
    OpLists(lower={"relu"}, conditional_fp32=(("Activation", "act_type", ("relu",)),))


def test_native_version_pins_the_lists():
    old = Policy.preset("paddle-native", native_version="2.6.2")
    new = Policy.preset("paddle-native", native_version="3.3.1")
    only_new = sorted(native_lists("paddle", "float16", "3.3.1").lower -
                      native_lists("paddle", "float16", "2.6.2").lower)
    assert only_new
    for op in only_new:
        assert categorize(new, "paddle", op).category == "lower"
        assert categorize(old, "paddle", op).category != "lower"


def test_cli_takes_a_preset_name_for_policy(capsys):
    from amp_adapters.services.cli import main
    assert main(["lists", "--framework", "mxnet", "--policy", "mxnet-native"]) == 0
    out = capsys.readouterr().out
    lower = effective_lists(Policy.preset("mxnet-native"), "mxnet")["lower"]
    assert f"[lower] ({len(lower)} ops)" in out and "  FullyConnected" in out
