"""One policy, two frameworks: every canonical op both models have runs in the same precision.

Reports are compared by precision (an op emulated in fp16 on this CPU counts
as fp16), under O1 fp16, O1 bf16, O2 fp16 and a custom policy file that moves
softmax to fp16 and matmul to fp32. A canonical op that only one framework's
model has is named explicitly, never silently taken as agreement. Where this
machine's two frameworks run an op on different kernels (a bf16 conv real in
MXNet, emulated in Paddle 2.6.2, whose oneDNN conv takes no bf16 filter), the
ops downstream that follow their inputs differ too; the ops whose category fixes
their precision must still agree (``policy_disagreements``).
"""
import pytest

from amp_adapters import Policy, compare, kernel_differences, policy_disagreements

from consistency_models import MODELS, mxnet_report, paddle_report

CUSTOM = """
preset = "O1"
emulate = true
[ops]
lower = ["softmax"]
fp32 = ["matmul"]
"""

# Canonical ops each model must have in BOTH frameworks (so the comparison is not vacuous),
# and the ones only one framework expresses that way (MXNet's Dense is one `linear` op;
# Paddle's fc is a matmul and an add).
SHARED = {
    "mlp": {"relu"},
    "cnn": {"conv", "batch_norm", "relu", "pool"},
    "transformer": {"matmul", "softmax", "add", "layer_norm", "gelu"},
    "lstm": {"embedding", "rnn"},
}


def policies(tmp_path):
    path = tmp_path / "custom.toml"
    path.write_text(CUSTOM)
    return {
        "O1 fp16": Policy.preset("O1", emulate=True),
        "O1 bf16": Policy.preset("O1-bf16", emulate=True),
        "O2 fp16": Policy.preset("O2", emulate=True),
        "custom file": Policy.from_file(path),
    }


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("policy_name", ["O1 fp16", "O1 bf16", "O2 fp16", "custom file"])
def test_reports_agree_on_every_shared_canonical_op(model, policy_name, tmp_path):
    policy = policies(tmp_path)[policy_name]
    mx_report, pd_report = mxnet_report(model, policy), paddle_report(model, policy)
    diffs = compare(mx_report, pd_report)
    where = f"{model} under {policy_name}:\n" + "\n".join(diffs)
    assert policy_disagreements(mx_report, pd_report) == [], where
    if not kernel_differences(mx_report, pd_report):  # same kernels: every shared op agrees
        assert [d for d in diffs if " only " not in d] == [], where
    shared = set(mx_report.precisions()) & set(pd_report.precisions())
    assert SHARED[model] <= shared
    only = {d.split(":")[0] for d in diffs if " only " in d}
    assert only == set(mx_report.precisions()) ^ set(pd_report.precisions())


def test_custom_policy_moves_softmax_and_matmul_in_both(tmp_path):
    policy = policies(tmp_path)["custom file"]
    for report in (mxnet_report("transformer", policy), paddle_report("transformer", policy)):
        precisions = report.precisions()
        assert precisions["softmax"] == {"float16"}, report.format()
        assert precisions["matmul"] == {"float32"}, report.format()


def test_o1_lowers_gemms_and_keeps_norms_fp32(tmp_path):
    policy = policies(tmp_path)["O1 fp16"]
    for report in (mxnet_report("transformer", policy), paddle_report("transformer", policy)):
        precisions = report.precisions()
        assert precisions["matmul"] == {"float16"} and precisions["layer_norm"] == {"float32"}
