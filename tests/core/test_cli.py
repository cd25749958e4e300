"""The amp-adapters command, run as a user runs it (a subprocess of the console script)."""
import os
import subprocess
import sys

import pytest

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


def demo_rows(out):
    """{mode: row cells} from the demo's table."""
    lines = out.split("framework  mode")[1].splitlines()[2:]
    return {" ".join(line.split()[1:-7]): line.split() for line in lines if line.strip()}


def test_demo_trains_fp32_and_amp_side_by_side(tmp_path, capsys):
    pytest.importorskip("sklearn")
    png = tmp_path / "demo.png"
    assert main(["demo", "--framework", "numpy", "--steps", "300", "--k-log2", "24",
                 "--plot", str(png)]) == 0
    out = capsys.readouterr().out
    assert "step 300/300" in out                       # progress while it trains
    rows = demo_rows(out)
    fp32, amp = float(rows["fp32"][-7]), float(rows["fp16 O1 (emulated)"][-7])
    assert fp32 > 0.9 and abs(amp - fp32) < 0.02       # dynamic scaling matches fp32
    assert png.stat().st_size > 10_000


def test_demo_without_loss_scaling_learns_nothing(tmp_path, capsys):
    pytest.importorskip("sklearn")
    policy = tmp_path / "noscale.toml"
    policy.write_text('preset = "O1"\n[loss_scale]\nkind = "none"\n')
    assert main(["demo", "--framework", "numpy", "--steps", "300", "--k-log2", "24",
                 "--policy", str(policy)]) == 0
    rows = demo_rows(capsys.readouterr().out)
    assert float(rows["fp16 O1 (emulated)"][-7]) < 0.3   # gradients flush to zero in fp16
