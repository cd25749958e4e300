"""The demo's Paddle dygraph rows (``paddle_amp.dygraph`` under the same policy as the other
rows) and its peak-memory column (one step per row, measured in a fresh process by
``amp_adapters.services.memory``, over that framework's fp32 row). The column's figures are not
asserted (a measured memory); its form is."""
import re

import pytest
from demo_table import table

from amp_adapters.services.memory import StepMemory
from amp_demo import command
from amp_demo.result import TrainResult
from amp_demo.table import format_table
from amp_demo.trainers import real_kernel


def _row(framework, mode, peak):
    memory = None if peak is None else StepMemory(peak=peak, before=peak // 2,
                                                   transient=peak // 2, peak_source="VmHWM")
    return TrainResult(framework, mode, 0.9, (1.0,), (1.0,), 0, 0, 1e-3, memory=memory)


def test_the_peak_column_is_over_the_frameworks_fp32_row_and_marks_emulated_rows():
    mib = 1 << 20
    text = format_table([_row("mxnet", "fp32", 200 * mib),
                         _row("mxnet", "fp16 O1 (emulated)", 210 * mib),
                         _row("paddle", "fp32", 300 * mib), _row("paddle", "bf16 O1", 270 * mib),
                         _row("paddle-dygraph", "bf16 O1", 280 * mib),  # no fp32 row
                         _row("numpy", "fp32", None)])                  # not measured
    cells = [(r["framework"], r["peak MiB"], r["peak vs fp32"]) for r in table(text)]
    assert cells == [("mxnet", "200", "1.00x"), ("mxnet", "210", "1.05x*"),
                     ("paddle", "300", "1.00x"), ("paddle", "270", "0.90x"),
                     ("paddle-dygraph", "280", "-"), ("numpy", "-", "-")]


def test_the_paddle_dygraph_rows_train_under_the_demos_policy_with_their_peak(capsys,
                                                                             monkeypatch):
    """The rows in this process; each row's measuring process named by its framework and
    policy (the measuring itself is the next test's: here its answer is given)."""
    pytest.importorskip("paddle", reason="the dygraph rows train in Paddle")
    pytest.importorskip("sklearn", reason="the demo trains on scikit-learn's digits")
    from amp_demo import memory
    asked = []

    def measured(framework, spec):
        asked.append((framework, spec))
        return StepMemory(peak=(300 + len(asked)) << 20, before=1, transient=1,
                          peak_source="VmHWM")
    monkeypatch.setattr(memory, "row_memory", measured)
    assert command.main(["--framework", "paddle-dygraph", "--steps", "3", "--no-speed"]) == 0
    out = capsys.readouterr().out
    rows = table(out)
    bf16 = real_kernel("paddle-dygraph", "bfloat16")  # the backend's answer for this CPU
    assert [(r["framework"], r["mode"]) for r in rows] == \
        [("paddle-dygraph", "fp32"), ("paddle-dygraph", "fp16 O1 (emulated)")] + \
        [("paddle-dygraph", "bf16 O1")] * bf16
    assert sorted(asked) == sorted([("paddle-dygraph", "fp32"), ("paddle-dygraph", "demo")]
                                   + [("paddle-dygraph", "bf16")] * bf16)
    fp32, fp16 = rows[0], rows[1]
    assert fp16["final scale"] == f"{command.DEMO_POLICY.loss_scale.scale:g}"  # the policy's
    assert int(fp16["casts"]) > 0 and fp32["casts"] == "0"
    assert fp32["peak vs fp32"] == "1.00x"
    assert re.fullmatch(r"\d+\.\d\dx\*", fp16["peak vs fp32"])  # emulated: marked
    assert all(int(r["peak MiB"]) > 300 for r in rows)
    assert "peak memory: the process's peak resident size during one training step" in out
    assert ("bf16: no row for paddle-dygraph" in out) == (not bf16)


def test_a_rows_peak_is_one_step_of_its_trainer_measured_in_a_fresh_process():
    pytest.importorskip("paddle", reason="the dygraph rows train in Paddle")
    from amp_demo.memory import row_memory
    got = row_memory("paddle-dygraph", "demo")
    assert got is not None and got.runs == 1 and got.peak_source in ("VmHWM", "ru_maxrss")
    assert got.peak >= got.before > 0


def test_both_trains_paddle_as_a_static_program_and_as_a_dynamic_graph():
    assert command.RUNTIMES["both"] == ("mxnet", "paddle", "paddle-dygraph")
