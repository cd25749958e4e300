"""``amp-adapters max-batch``: the largest batch of a model in a memory budget, in float32 and
under a policy. The command's own logic runs on peaks fed through its seam (``peak_of``, a
line per policy: no framework mocked); one test measures a real step in a fresh process,
and the models' steps run here once in each framework."""
import re

import pytest

from amp_adapters import Policy
from amp_adapters.services import cli
from amp_demo import command, max_batch_command
from amp_demo.batch_models import MODELS

DEMO = {"demo": command.register}
MIB = 1 << 20
# peak = fixed + per sample * batch, per policy: what the seam answers
LINES = {"fp32": (300 * MIB, 2 * MIB), "O1-bf16": (310 * MIB, 1 * MIB)}


@pytest.fixture
def measured(monkeypatch):
    """The command's measurements, answered from ``LINES`` (and recorded)."""
    asked = []

    def peak_of(framework, model, policy, batch, runs):
        asked.append((framework, model, policy, batch, runs))
        fixed, per_sample = LINES[policy]
        return fixed + per_sample * batch
    monkeypatch.setattr(max_batch_command, "peak_of", peak_of)
    return asked


def test_the_largest_batch_per_policy_is_predicted_from_the_line_and_checked(measured,
                                                                             capsys):
    pytest.importorskip("paddle", reason="the command asks for the framework's package")
    assert cli.main(["max-batch", "--framework", "paddle-dygraph", "--model", "cnn",
                     "--memory", "1GiB"], commands=DEMO) == 0
    out = capsys.readouterr().out
    # (1024 - 300) / 2 = 362 samples in float32; (1024 - 310) / 1 = 714 under O1-bf16
    rows = {line.split()[0]: line.split() for line in out.splitlines()
            if line.startswith(("fp32 ", "O1-bf16 "))}
    assert rows["fp32"][5] == "362" and rows["O1-bf16"][5] == "714"
    assert rows["fp32"][-1] == rows["O1-bf16"][-1] == "yes"       # the check runs fit
    assert "O1-bf16: 1.97x float32's largest batch (362 -> 714" in out
    # per policy: its 3 sizes (measured two at a time, so in any order), then the check
    fits = [(p, b) for _, _, p, b, _ in measured]
    sizes = len(MODELS["cnn"].batches)
    assert len(fits) == 2 * (sizes + 1)
    for half, (policy, largest) in zip((fits[:sizes + 1], fits[sizes + 1:]),
                                       (("fp32", 362), ("O1-bf16", 714))):
        assert sorted(half[:sizes]) == [(policy, b) for b in sorted(MODELS["cnn"].batches)]
        assert half[-1] == (policy, largest)


def test_a_check_that_does_not_fit_says_so_and_what_the_line_through_it_says(monkeypatch,
                                                                            capsys):
    def peak_of(framework, model, policy, batch, runs):  # the largest batch runs 1% over
        return 300 * MIB + 2 * MIB * batch + (20 * MIB if batch not in (4, 8, 16) else 0)
    monkeypatch.setattr(max_batch_command, "peak_of", peak_of)
    pytest.importorskip("paddle", reason="the command asks for the framework's package")
    assert cli.main(["max-batch", "--framework", "paddle", "--model", "cnn", "--memory",
                     "1GiB"], commands=DEMO) == 0
    assert "no: with this run, the line says" in capsys.readouterr().out


@pytest.mark.parametrize("argv, said", [
    (["--memory", "four gigs"], "'four gigs' is not a memory size"),
    (["--memory", "0GiB"], "'0GiB' is not a memory size: it must be more than 0 bytes"),
    (["--model", "resnet50"], "invalid choice: 'resnet50'"),
    (["--framework", "torch"], "invalid choice: 'torch'"),
    (["--batches", "8"], "two or three distinct batch sizes"),
    (["--policy", "O7"], "no preset name"),
    (["--memory", "100MiB"], "100.00 MiB is too small for batch 1: its predicted peak is "
                             "302.00 MiB"),
])
def test_bad_input_is_one_error_line_that_says_what_to_do(argv, said, measured, capsys):
    pytest.importorskip("paddle", reason="the command asks for the framework's package")
    base = {"--framework": "paddle", "--model": "cnn", "--memory": "1GiB"}
    base.update(zip(argv[::2], argv[1::2]))
    try:  # a usage error leaves through argparse's exit, an AmpConfigError through main
        status = cli.main(["max-batch", *[x for kv in base.items() for x in kv]],
                          commands=DEMO)
    except SystemExit as e:
        status = e.code
    err = capsys.readouterr().err
    assert status == 2 and err.startswith("amp-adapters: error:") and said in err, err
    assert len(err.strip().splitlines()) == 1
    if "too small" not in said:
        assert measured == []                         # refused before any measuring


@pytest.mark.parametrize("framework", ["mxnet", "paddle", "paddle-dygraph"])
def test_each_models_step_trains_in_each_framework(framework):
    pytest.importorskip("mxnet" if framework == "mxnet" else "paddle")
    from amp_demo.trainers import batch_workload
    for spec in MODELS.values():
        batch_workload(framework, spec, Policy.preset("O0"), 1)()


def test_a_point_is_one_step_measured_in_a_fresh_process():
    pytest.importorskip("paddle", reason="the measured step trains in Paddle")
    peak = max_batch_command.peak_of("paddle-dygraph", "digits", "O1-bf16", 64, runs=1)
    assert peak > 10 * MIB


def test_the_help_names_the_models_and_the_frameworks(capsys):
    with pytest.raises(SystemExit):
        cli.main(["max-batch", "--help"], commands=DEMO)
    out = capsys.readouterr().out
    assert re.search(r"\{mxnet,paddle,paddle-dygraph\}", out) and "digits,mlp,cnn" in out
