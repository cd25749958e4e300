"""``amp-adapters demo``: the subcommand amp_demo adds to the core's CLI, run as a user runs it."""
import configparser
import importlib.metadata
import os
import subprocess
import sys
from pathlib import Path

import pytest

from amp_adapters.services import cli
from amp_demo import command
from demo_table import demo_rows

ROOT = Path(__file__).resolve().parents[2]
EXE = os.path.join(os.path.dirname(sys.executable), "amp-adapters")
DEMO = {"demo": command.register}


def test_demo_trains_fp32_and_amp_side_by_side(tmp_path, capsys):
    pytest.importorskip("sklearn")
    png = tmp_path / "demo.png"
    assert cli.main(["demo", "--framework", "numpy", "--steps", "300", "--k-log2", "24",
                     "--plot", str(png)], commands=DEMO) == 0
    out = capsys.readouterr().out
    assert "step 300/300" in out                       # progress while it trains
    rows = demo_rows(out)
    fp32, amp = float(rows["fp32"]["accuracy"]), float(rows["fp16 O1 (emulated)"]["accuracy"])
    assert fp32 > 0.9 and abs(amp - fp32) < 0.02       # dynamic scaling matches fp32
    assert png.stat().st_size > 10_000


def test_demo_without_loss_scaling_learns_nothing(tmp_path, capsys):
    pytest.importorskip("sklearn")
    policy = tmp_path / "noscale.toml"
    policy.write_text('preset = "O1"\n[loss_scale]\nkind = "none"\n')
    assert command.main(["--framework", "numpy", "--steps", "300", "--k-log2", "24",
                         "--policy", str(policy)]) == 0     # python -m amp_demo
    rows = demo_rows(capsys.readouterr().out)
    assert float(rows["fp16 O1 (emulated)"]["accuracy"]) < 0.3  # gradients flush to zero


def test_a_bad_policy_file_is_one_error_line(tmp_path, capsys):
    policy = tmp_path / "bad.toml"
    policy.write_text("levl = 'O1'")
    assert cli.main(["demo", "--framework", "numpy", "--policy", str(policy)],
                    commands=DEMO) == 2
    err = capsys.readouterr().err
    assert err.startswith("amp-adapters: error:") and "'levl'" in err


def test_policy_takes_a_preset_name_as_policy_does_in_both_backends(capsys):
    """``--policy`` goes through ``amp_adapters.resolve_policy``: a preset name works, and a
    name that is neither a preset nor a file is one error line naming the presets."""
    pytest.importorskip("sklearn")
    assert command.main(["--framework", "numpy", "--steps", "3", "--policy", "O2"]) == 0
    assert "fp16 O2 (emulated)" in demo_rows(capsys.readouterr().out)
    assert cli.main(["demo", "--framework", "numpy", "--policy", "O7"], commands=DEMO) == 2
    err = capsys.readouterr().err
    assert err.startswith("amp-adapters: error:") and "no preset name" in err and "'O1'" in err


def test_setup_cfg_declares_the_demo_entry_point():
    """What ``pip install`` turns into the entry point the core's CLI looks up."""
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    group = cfg["options.entry_points"][cli.COMMAND_GROUP]
    (line,) = [ln for ln in group.strip().splitlines() if ln.strip()]
    name, target = (part.strip() for part in line.split("="))
    module, attr = target.split(":")
    assert (name, module, attr) == ("demo", "amp_demo.command", "register")
    assert "amp_demo*" in cfg["options.packages.find"]["include"]


def test_the_installed_console_script_finds_demo():
    eps = importlib.metadata.entry_points(group=cli.COMMAND_GROUP)
    if "demo" not in eps.names:
        pytest.skip("this environment's amp-adapters metadata predates the amp_adapters.commands "
                    "entry points: reinstall (make test does) to run the installed script")
    r = subprocess.run([EXE, "demo", "--help"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "--k-log2" in r.stdout and "--framework" in r.stdout


def test_the_figures_loss_scale_axis_is_labelled_in_powers_of_two():
    """The scale moves by x2: its axis is log2 with every power of two in range labelled."""
    pytest.importorskip("matplotlib")
    from amp_demo.plot import figure
    from amp_demo.result import TrainResult
    fields = TrainResult.__dataclass_fields__
    scales = [2.0**16] * 5 + [2.0**17] * 5 + [2.0**19] * 5
    results = [TrainResult(**{**{k: None for k in fields}, "framework": "numpy",
                              "mode": mode, "losses": [2.0 - 0.1 * i for i in range(15)],
                              "scales": [1.0] * 15 if mode == "fp32" else scales})
               for mode in ("fp32", "fp16 O1")]
    fig = figure(results)
    fig.canvas.draw()
    ax_scale = fig.axes[1]
    lo, hi = ax_scale.get_ylim()
    labels = [t.get_text() for t, v in zip(ax_scale.get_yticklabels(), ax_scale.get_yticks())
              if lo <= v <= hi and t.get_text()]
    assert ax_scale.get_yscale() == "log" and (lo, hi) == (2.0**15, 2.0**20)
    assert labels == [f"$2^{{{k}}}$" for k in range(15, 21)], labels
