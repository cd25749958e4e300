"""`amp-adapters lists/explain` without --policy answer for what `mxnet_amp.init()` decides."""
from amp_adapters import categorize, effective_lists
from amp_adapters.services.cli import main
from amp_adapters.rules.oplists import load_table

import mxnet_amp as amp

OPS = ["dot", "batch_dot", "FullyConnected", "softmax", "_npi_matmul", "Activation", "exp"]


def _cli(capsys, *argv):
    assert main(list(argv)) == 0
    return capsys.readouterr().out


def test_lists_without_policy_are_what_init_decides(capsys):
    out = _cli(capsys, "lists", "--framework", "mxnet")
    decided = effective_lists(amp.init(), "mxnet")
    for cat, ops in decided.items():
        section = out.split(f"[{cat}] ")[1].split("\n[")[0]
        assert [line.split()[0] for line in section.splitlines()[1:] if line.strip()] \
            == list(ops), cat


def test_explain_without_policy_is_what_init_decides(capsys):
    policy = amp.init()
    for op in OPS:
        out = _cli(capsys, "explain", op, "--framework", "mxnet")
        assert f"category: {categorize(policy, 'mxnet', op).category} " in out, (op, out)
    softrelu = _cli(capsys, "explain", "Activation", "--framework", "mxnet",
                    "--attr", "act_type=softrelu")
    want = categorize(policy, "mxnet", "Activation", {"act_type": "softrelu"}).category
    assert f"category: {want} " in softrelu


def test_explain_with_policy_o1_is_what_init_policy_o1_decides(capsys):
    policy = amp.init(policy="O1")
    table = load_table("mxnet")
    for op in OPS:
        out = _cli(capsys, "explain", op, "--framework", "mxnet", "--policy", "O1")
        assert f"category: {categorize(policy, 'mxnet', op).category} " in out, op
    assert table.canonical_of["dot"] == "matmul"
