"""``amp-adapters doctor`` on a demo model: a readable report and a policy file that loads."""
import pytest

from amp_adapters import Policy
from amp_adapters.services import cli

pytest.importorskip("mxnet")
from amp_demo import doctor_command  # noqa: E402

DOCTOR = {"doctor": doctor_command.register}  # also added by the demo entry point


def test_doctor_prints_the_report_and_writes_the_fix(tmp_path, capsys):
    fix = tmp_path / "fix.toml"
    assert cli.main(["doctor", "--framework", "mxnet", "--model", "overflow", "--write",
                     str(fix)], commands=DOCTOR) == 0
    out = capsys.readouterr().out
    assert "fp16 EMULATED" in out and "first non-finite forward op: planted_dot0" in out
    assert "1. planted_dot0: move 'matmul' to fp32" in out
    # the narrowest fix that a replay shows to work: the planted block (its two dots are
    # the model), not every matmul of any model the file is used with
    assert Policy.from_file(fix).mxnet_layers.fp32 == {"planted"}
    assert "recommendation: keep 'planted' in float32" in out and "  verified: " in out
    assert max(len(line) for line in out.splitlines() if not line.startswith(("  \"", "#"))) \
        < 200  # a terminal table, not a dump


def test_doctor_rejects_an_unknown_model(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["doctor", "--model", "nan"], commands=DOCTOR)
    assert e.value.code == 2 and "invalid choice" in capsys.readouterr().err


def test_doctor_under_auto_writes_a_file_that_loads_back(tmp_path, monkeypatch, capsys):
    """``--policy auto`` failed on every run: the file it wrote lacked ``speed``, and the
    load-back check raised ValueError (issue 38)."""
    monkeypatch.setenv("AMP_ADAPTERS_CACHE", str(tmp_path / "cache"))  # not the user's
    fix = tmp_path / "fix.toml"
    assert cli.main(["doctor", "--framework", "mxnet", "--model", "overflow", "--policy",
                     "auto", "--write", str(fix)], commands=DOCTOR) == 0
    assert f"written to {fix}" in capsys.readouterr().out
    assert Policy.from_file(fix) == Policy.preset("auto")


def test_doctor_runs_the_planted_model_as_eager_layers(tmp_path, capsys):
    """``--framework paddle-dygraph``: the planted reduction as one eager ``Linear`` (path
    ``0``), examined by ``paddle_amp.dygraph.doctor``; the fix names it by its path."""
    pytest.importorskip("paddle")
    fix = tmp_path / "fix.toml"
    assert cli.main(["doctor", "--framework", "paddle-dygraph", "--model", "reduction",
                     "--write", str(fix)], commands=DOCTOR) == 0
    out = capsys.readouterr().out
    assert "recommendation: keep '0' in float32" in out and "  verified: " in out
    assert Policy.from_file(fix).paddle_layers.fp32 == {"0"}
