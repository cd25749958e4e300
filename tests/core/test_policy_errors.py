"""Every bad policy dict or file is one AmpConfigError naming the source, key path and value."""
import re

import pytest

from amp_adapters import AmpConfigError, DynamicLossScale, Policy, UnknownOpError
from amp_adapters.rules.policyfile import loss_scale_keys

RULE = {"op": "LeakyReLU", "attr": "act_type", "values": ["gelu"]}

# (policy dict, key path in the message, regex the rest of the message must match)
BAD_DICTS = [
    ({"preset": []}, "preset = []", "must be a string"),
    ({"preset": "O9"}, "preset = 'O9'", "one of"),
    ({"dtype": 16}, "dtype = 16", "must be a string"),
    ({"level": "o1"}, "level = 'o1'", "did you mean 'O1'"),
    ({"emulate": "yes"}, "emulate = 'yes'", "true or false"),
    ({"ops": 0}, "ops = 0", "must be a table"),
    ({"ops": ["softmax"]}, "ops = ['softmax']", "must be a table"),
    ({"ops": {"mxnet": "Dropout"}}, "ops.mxnet = 'Dropout'", "must be a table"),
    ({"ops": {"lower": "softmax"}}, "ops.lower = 'softmax'", r"write \['softmax'\]"),
    ({"ops": {"lower": [1]}}, "ops.lower[0] = 1", "op name"),
    ({"ops": {"lower": ["softmax", 1]}}, "ops.lower[1] = 1", "op name"),
    ({"ops": {"lower": {"softmax": 1}}}, "ops.lower = {'softmax': 1}", "list of op names"),
    ({"ops": {"replace": "true"}}, "ops.replace = 'true'", "true or false"),
    ({"ops": {"lower": ["softmx"]}}, "ops.lower[0] = 'softmx'", "did you mean 'softmax'"),
    ({"ops": {"lower": ["matmul"], "fp32": ["matmul"]}}, "ops.fp32[0] = 'matmul'",
     "already listed in ops.lower"),
    ({"ops": {"conditional_fp32": [{}]}}, "ops.conditional_fp32[0] = {}", "needs the keys"),
    ({"ops": {"mxnet": {"conditional_fp32": [{**RULE, "values": "gelu"}]}}},
     "ops.mxnet.conditional_fp32[0].values = 'gelu'", r"write \['gelu'\]"),
    ({"ops": {"mxnet": {"conditional_fp32": [{**RULE, "values": [3]}]}}},
     "ops.mxnet.conditional_fp32[0].values[0] = 3", "must be a string"),
    ({"ops": {"mxnet": {"conditional_fp32": "LeakyReLU"}}},
     "ops.mxnet.conditional_fp32 = 'LeakyReLU'", "list of rules"),
    ({"ops": {"mxnet": {"conditional_fp32": [{"op": 1, "attr": "a", "values": ["b"]}]}}},
     "ops.mxnet.conditional_fp32[0].op = 1", "must be a string"),
    ({"loss_scale": 0}, "loss_scale = 0", "must be a table"),
    ({"loss_scale": {"kind": []}}, "loss_scale.kind = []", "must be a string"),
    ({"loss_scale": {"kind": "Dynamic"}}, "loss_scale.kind = 'Dynamic'", "did you mean 'dynamic'"),
    ({"loss_scale": {"init_scale": 10**400}}, "loss_scale.init_scale = 1000", "out of range"),
    ({"loss_scale": {"init_scale": "1024"}}, "loss_scale.init_scale = '1024'", "a number"),
    ({"loss_scale": {"growth_interval": True}}, "loss_scale.growth_interval = true", "a number"),
    ({"loss_scale": {"init_scale": float("nan")}}, "loss_scale.init_scale = nan", "not nan"),
]


@pytest.mark.parametrize("d, path, what", BAD_DICTS, ids=[repr(c[0])[:60] for c in BAD_DICTS])
def test_bad_policy_dict_names_key_path_and_value(d, path, what):
    with pytest.raises(AmpConfigError) as info:
        Policy.from_dict(d, where="policy file 'p.toml'")
    msg = str(info.value)
    assert msg.startswith("policy file 'p.toml': "), msg
    assert path in msg, msg
    assert re.search(what, msg), msg


@pytest.mark.parametrize("d, key, hint", [
    ({"bogus": 1}, "'bogus'", "allowed: preset"),
    ({"dtyp": "float16"}, "'dtyp'", "did you mean 'dtype'"),
    ({"ops": {"lowr": []}}, "'lowr' in ops", "did you mean 'lower'"),
    ({"ops": {"mxnet": {"conditional_fp32": [{**RULE, "valeus": ["gelu"]}]}}},
     "'valeus' in ops.mxnet.conditional_fp32[0]", "did you mean 'values'"),
    ({"loss_scale": {"growth_intervall": 3}}, "'growth_intervall' in loss_scale",
     "did you mean 'growth_interval'"),
])
def test_misspelt_keys_rejected_with_a_close_match(d, key, hint):
    with pytest.raises(AmpConfigError, match=re.escape(key) + ".*" + re.escape(hint)):
        Policy.from_dict(d)


def test_rule_values_string_is_not_split_into_characters():
    # before: values = "gelu" became ("g", "e", "l", "u")
    with pytest.raises(AmpConfigError, match=r"write \['gelu'\]"):
        Policy.from_dict({"ops": {"mxnet": {"conditional_fp32": [{**RULE, "values": "gelu"}]}}})
    p = Policy.from_dict({"ops": {"mxnet": {"conditional_fp32": [RULE]}}})
    assert p.mxnet_ops.conditional_fp32 == (("LeakyReLU", "act_type", ("gelu",)),)


def test_framework_op_name_in_canonical_lists_says_where_it_belongs():
    with pytest.raises(AmpConfigError, match=r"belongs under \[ops.mxnet\].*canonical name is "
                                             r"'linear'"):
        Policy.from_dict({"ops": {"fp32": ["FullyConnected"]}})
    with pytest.raises(UnknownOpError, match=r"belongs under \[ops.paddle\]"):
        from amp_adapters import OpLists
        Policy(ops=OpLists(fp32={"elementwise_add"}))


def test_loss_scale_key_list_shows_documented_keys_only():
    with pytest.raises(AmpConfigError) as info:
        Policy.from_dict({"loss_scale": {"good_steps": 3}})
    msg = str(info.value)
    assert "'good_steps'" in msg and "init_scale" in msg
    allowed = msg.split("allowed: ")[1].rstrip(")").split(", ")
    assert not {"scale", "good_steps", "bad_steps", "total_steps", "skipped_steps",
                "consecutive_skips"} & set(allowed), allowed
    assert loss_scale_keys("none", ("total_steps",)) == ()
    with pytest.raises(AmpConfigError, match="'init_scale' in loss_scale \\(kind 'none'\\)"):
        Policy.from_dict({"loss_scale": {"kind": "none", "init_scale": 8}})


def test_scaler_errors_are_prefixed_with_the_source():
    with pytest.raises(AmpConfigError, match=r"^policy: \[loss_scale\]: .*backoff_factor"):
        Policy.from_dict({"loss_scale": {"backoff_factor": 2.0}})
    with pytest.raises(AmpConfigError, match="^policy: level 'O1' with dtype 'float32'"):
        Policy.from_dict({"dtype": "float32"})


def test_good_dict_still_builds():
    p = Policy.from_dict({"preset": "O2-bf16", "ops": {"fp32": ["gelu"], "replace": True,
                                                      "paddle": {"lower": ["matmul_v2"]}},
                          "loss_scale": {"init_scale": 256, "max_scale": "inf"}})
    assert (p.dtype, p.level, p.ops.replace, p.paddle_ops.lower) == (
        "bfloat16", "O2", True, {"matmul_v2"})
    assert p.loss_scale == DynamicLossScale(scale=256, max_scale=float("inf"))


def _write(tmp_path, data: bytes):
    path = tmp_path / "p.toml"
    path.write_bytes(data)
    return path


@pytest.mark.parametrize("data, needle", [
    (b"dtype = 'caf\xe9'\n", r"is not UTF-8 text \(byte 0xe9 on line 1\)"),
    (b"\xef\xbb\xbfdtype = 'float16'\n", "byte-order mark"),
    (b"dtype = 'float16'\nlevel = 'O1'\ndtype = 'bfloat16'\n", "key 'dtype' is given twice"),
    (b"[ops]\nlower = []\n[ops]\nfp32 = []\n", r"Cannot declare \('ops',\) twice.*line 3"),
    (b"[loss_scale]\ninit_scale = 1" + b"0" * 400 + b"\n", "loss_scale.init_scale = 1000"),
    (b"[ops.mxnet]\nconditional_fp32 = [{op = 'LeakyReLU', attr = 'act_type', "
     b"values = 'gelu'}]\n", r"ops.mxnet.conditional_fp32\[0\].values = 'gelu'"),
])
def test_bad_file_names_the_file(tmp_path, data, needle):
    path = _write(tmp_path, data)
    with pytest.raises(AmpConfigError) as info:
        Policy.from_file(path)
    assert f"policy file {str(path)!r}" in str(info.value)
    assert re.search(needle, str(info.value)), str(info.value)


def test_directory_is_not_a_policy_file(tmp_path):
    with pytest.raises(AmpConfigError, match="is a directory"):
        Policy.from_file(tmp_path)


def test_validation_happens_before_anything_is_built(monkeypatch):
    # An error anywhere in the dict (here the last key checked) means no OpLists, no loss
    # scale, no Policy was constructed.
    import amp_adapters.rules.policy as policy_mod
    built = []
    monkeypatch.setattr(policy_mod, "loss_scale_from_config",
                        lambda d: built.append(d))
    with pytest.raises(AmpConfigError):
        Policy.from_dict({"ops": {"lower": ["softmax"]}, "loss_scale": {"init_scale": "x"}})
    assert built == []


@pytest.mark.parametrize("kw, needle", [
    (dict(lower=5), "OpLists: lower = 5: must be a list of op names"),
    (dict(fp32=None), "OpLists: fp32 = None: must be a list"),
    (dict(lower=[1]), r"OpLists: lower\[0\] = 1: must be an op name"),
    (dict(promote="softmax"), r"write \['softmax'\]"),
    (dict(conditional_fp32=5), "conditional_fp32 = 5: must be a list of"),
    (dict(conditional_fp32=[("LeakyReLU", "act_type", "gelu")]), r"write \['gelu'\]"),
    (dict(conditional_fp32=[{"op": "x"}]), "needs the keys attr, values"),
    (dict(replace="yes"), "OpLists.replace must be true or false"),
])
def test_oplists_constructor_errors_name_the_field(kw, needle):
    from amp_adapters import OpLists
    with pytest.raises(AmpConfigError, match=needle):  # before: TypeError 'int' not iterable
        OpLists(**kw)
