"""`amp-adapters lists/explain` without --policy answer for what `paddle_amp.decorate()`
decides (the installed Paddle's native lists, in whichever IR)."""
import paddle

import paddle_amp
from amp_adapters import categorize, effective_lists
from amp_adapters.services.cli import main

OPS = ["matmul_v2", "mul", "softmax", "relu", "elementwise_add", "conv2d", "sum", "where",
       "lookup_table_v2"]


def _cli(capsys, *argv):
    assert main(list(argv)) == 0
    return capsys.readouterr().out


def test_lists_without_policy_are_what_decorate_decides(static, capsys):
    out = _cli(capsys, "lists", "--framework", "paddle")
    assert f"native lists of paddle {paddle.__version__} " in out.splitlines()[0]
    decided = effective_lists(paddle_amp.decorate(paddle.optimizer.SGD(0.1)).policy, "paddle")
    for cat, ops in decided.items():
        section = out.split(f"[{cat}] ")[1].split("\n[")[0]
        assert [line.split()[0] for line in section.splitlines()[1:] if line.strip()] \
            == list(ops), cat


def test_explain_without_policy_is_what_decorate_decides(static, capsys):
    policy = paddle_amp.decorate(paddle.optimizer.SGD(0.1)).policy
    for op in OPS:
        out = _cli(capsys, "explain", op, "--framework", "paddle")
        assert f"category: {categorize(policy, 'paddle', op).category} " in out, (op, out)


def test_explain_with_policy_o1_is_what_decorate_policy_o1_decides(static, capsys):
    policy = paddle_amp.decorate(paddle.optimizer.SGD(0.1), policy="O1").policy
    for op in OPS:
        out = _cli(capsys, "explain", op, "--framework", "paddle", "--policy", "O1")
        assert f"category: {categorize(policy, 'paddle', op).category} " in out, op
