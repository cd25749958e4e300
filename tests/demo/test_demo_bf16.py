"""The demo's bf16 row: it appears where the backend has a real bf16 GEMM kernel; elsewhere
one line says why and what runs instead (decided by the backend's answer, never assumed)."""
import pytest

from amp_adapters import Policy
from amp_demo import command
from amp_demo.result import mode_label
from amp_demo.trainers import real_kernel


def test_the_note_names_the_frameworks_without_a_row_and_what_runs_instead():
    line = command.bf16_note(["mxnet", "paddle"])
    assert line.startswith("bf16: no row for mxnet, paddle: no real bfloat16 GEMM kernel")
    assert "oneDNN" in line and "fp16 rows above are emulated" in line
    assert command.bf16_note([]) is None


def test_numpy_has_no_bf16_kernel_row():
    assert real_kernel("numpy", "bfloat16") is False


def test_mode_labels_say_real_emulated_or_fallback():
    bf = Policy.preset("O1-bf16")
    assert mode_label(bf, emulated=False) == "bf16 O1"  # every low op on a real kernel
    assert mode_label(bf, emulated=False, fell_back=True) == "bf16 O1 (fp32 fallback)"
    assert mode_label(Policy.preset("O1"), emulated=True) == "fp16 O1 (emulated)"
    assert mode_label(Policy.preset("O0"), emulated=False) == "fp32"


def test_the_mxnet_row_follows_the_probe(capsys):
    mx = pytest.importorskip("mxnet", reason="MXNet is not installed (it needs Python 3.11 "
                                             "and numpy<1.24)")
    from mxnet_amp.kernels import has_kernel
    gemm = has_kernel("FullyConnected", mx.cpu(), "bfloat16", backward=True)
    # no speed table: its MXNet rows run in test_demo_quiet.py; these lines come before it
    assert command.main(["--framework", "mxnet", "--steps", "3", "--no-memory",
                         "--no-speed"]) == 0
    out = capsys.readouterr().out
    assert ("mxnet      bf16 O1" in out) == gemm
    assert ("bf16: no row for mxnet" in out) == (not gemm)


def test_the_speed_table_says_what_speed_kept_float32_and_why_a_row_cannot_run():
    from amp_demo.speed import SpeedRow, format_rows
    text = format_rows([
        SpeedRow("mxnet", "O1-bf16", 2.41, 0.05, 3, 3),
        SpeedRow("mxnet", "auto", 1.01, 0.02, 0, 3, ("FullyConnected 2.40x",) * 3),
        SpeedRow("paddle", "auto", error="exit 1: ImportError")])
    assert [line.split()[:3] for line in text.splitlines()[2:4]] == [
        ["mxnet", "O1-bf16", "2.41x"], ["mxnet", "auto", "1.01x"]]
    assert "mxnet auto: kept float32, not measured faster in bf16 here (bf16/fp32, casts " \
        "included): FullyConnected 2.40x" in text
    assert "cannot run (exit 1: ImportError)" in text


def test_a_speed_child_that_fails_is_a_row_that_says_so():
    from amp_demo.speed import _child
    row = _child("numpy", "auto")
    assert row.error == "exit 2: amp_demo.speed: unknown framework 'numpy' (mxnet or paddle)"


def test_the_speed_budget_is_the_default_or_a_number_of_seconds():
    from amp_demo.speed import BUDGET_S, budget_s
    assert budget_s({}) == BUDGET_S
    assert budget_s({"AMP_DEMO_SPEED_BUDGET_S": "0"}) == 0.0
    for bad in ("-1", "soon", "nan"):
        with pytest.raises(ValueError, match="AMP_DEMO_SPEED_BUDGET_S must be a number of "
                                             "seconds >= 0, got"):
            budget_s({"AMP_DEMO_SPEED_BUDGET_S": bad})
