"""The amp-adapters command, run as a user runs it (a subprocess of the console script)."""
import os
import subprocess
import sys

from amp_adapters.cli import main

EXE = os.path.join(os.path.dirname(sys.executable), "amp-adapters")


def run(*args):
    return subprocess.run([EXE, *args], capture_output=True, text=True, timeout=120)


def test_lists_prints_every_category(capsys):
    assert main(["lists", "--framework", "mxnet", "--dtype", "float16"]) == 0
    out = capsys.readouterr().out
    for header in ("[lower]", "[fp32]", "[promote]", "[follow]"):
        assert header in out
    lower = out.split("[lower]")[1].split("[fp32]")[0]
    assert "FullyConnected  (linear)" in lower and "softmax" not in lower


def test_lists_follow_a_policy_file(tmp_path, capsys):
    path = tmp_path / "p.toml"
    path.write_text('[ops]\nlower = ["softmax"]\nfp32 = ["matmul"]\n')
    assert main(["lists", "--framework", "paddle", "--policy", str(path)]) == 0
    out = capsys.readouterr().out
    lower = out.split("[lower]")[1].split("[fp32]")[0]
    fp32 = out.split("[fp32]")[1].split("[promote]")[0]
    assert "  softmax" in lower and "  matmul_v2  (matmul)" in fp32


def test_explain_says_category_and_why():
    r = run("explain", "Activation", "--framework", "mxnet", "--attr", "act_type=softrelu")
    assert r.returncode == 0, r.stderr
    assert "canonical: softplus" in r.stdout and "category: fp32" in r.stdout
    assert "why: canonical op 'softplus' is fp32 by default for float16" in r.stdout


def test_explain_unknown_op_is_an_error_with_close_matches():
    r = run("explain", "softmx", "--framework", "paddle")
    assert r.returncode == 2
    assert "unknown op 'softmx'" in r.stderr and "'softmax'" in r.stderr


def test_bad_policy_file_is_a_clean_error(tmp_path):
    path = tmp_path / "p.toml"
    path.write_text("levl = 'O1'")
    r = run("lists", "--framework", "mxnet", "--policy", str(path))
    assert r.returncode == 2 and "'levl'" in r.stderr and "Traceback" not in r.stderr
