"""The memory section's verdicts (bench/memory.py): which targets a model's rows hold, from
given figures (no measurement here)."""
from amp_adapters import ParamPlan
from amp_adapters.services.memory import StepMemory
from bench.memory import _row, _targets, o2_param_bytes

MIB = 1 << 20


def _got(peak_mib):
    return StepMemory(peak=peak_mib * MIB, before=0, transient=peak_mib * MIB,
                      peak_source="VmHWM")


def test_each_target_holds_or_is_missed_by_its_ratio():
    rows = {"fp32": _got(100), "native": _got(90), "ours": _got(95), "auto": _got(104),
            "O1-bf16": _got(86)}
    got = _targets("MXNet", "CNN 3x3 64ch 56x56", rows)
    assert got == ["- MXNet, CNN 3x3 64ch 56x56: ours (drop-in) <= 1.05x native: 1.06x, MISSED",
                   "- MXNet, CNN 3x3 64ch 56x56: auto <= 1.05x fp32: 1.04x, holds",
                   "- MXNet, CNN 3x3 64ch 56x56: O1-bf16 <= 0.85x fp32: 0.86x, MISSED"]


def test_the_cnn_target_is_the_cnn_only_and_a_failed_row_is_not_a_verdict():
    rows = {"fp32": _got(100), "native": "failed: no kernel", "ours": _got(95),
            "auto": _got(100), "O1-bf16": _got(50)}
    got = _targets("Paddle (legacy IR)", "MLP 4x512", rows)
    assert got == ["- Paddle (legacy IR), MLP 4x512: ours (drop-in) <= 1.05x native: not "
                   "measured (native failed)",
                   "- Paddle (legacy IR), MLP 4x512: auto <= 1.05x fp32: 1.00x, holds"]


def test_a_target_whose_config_did_not_run_is_left_out():
    rows = {"fp32": _got(100), "native": _got(110), "ours": _got(80)}  # the reuse case: no auto
    assert _targets("MXNet", "Dense(2048) x8, imperative", rows) == [
        "- MXNet, Dense(2048) x8, imperative: ours (drop-in) <= 1.05x native: 0.73x, holds"]


def test_o2_plans_a_low_copy_and_a_float32_master_per_low_parameter():
    plan = ParamPlan({"w": "bfloat16", "b": "float32"}, {"w": "O2", "b": "a bias add"})
    got = o2_param_bytes(plan, {"w": (512, 512), "b": (512,)})
    assert got == {"o2_param_bytes": 512 * 512 * (2 + 4) + 512 * 4,
                   "fp32_param_bytes": 512 * 512 * 4 + 512 * 4, "o2_low_params": 1,
                   "params": 2}


def test_an_o2_row_shows_its_planned_parameter_bytes_beside_the_peak():
    o2 = StepMemory(peak=90 * MIB, before=0, transient=90 * MIB, peak_source="VmHWM",
                    facts={"o2_param_bytes": 6 * MIB, "fp32_param_bytes": 4 * MIB,
                           "o2_low_params": 4, "params": 8})
    row = _row("Paddle 3.3.1 (PIR)", "MLP 4x512", 8192, "O2-bf16", o2, _got(100))
    assert row.endswith("| 0.90 | 0.90 | - | 90 / 90 | 6.0 / 4.0 (4 of 8 low) |")


def test_a_runtime_without_a_native_says_so_rather_than_that_it_failed():
    rows = {"fp32": _got(100), "ours": _got(95), "auto": _got(100)}  # PIR: no native AMP
    assert _targets("Paddle 3.3.1 (PIR)", "MLP 4x512", rows)[0] == (
        "- Paddle 3.3.1 (PIR), MLP 4x512: ours (drop-in) <= 1.05x native: no native in this "
        "runtime")


def test_no_paddle_runtime_can_show_the_cnn_target_and_its_line_says_why():
    rows = {"fp32": _got(100), "O1-bf16": _got(103)}
    for label in ("Paddle 2.6.2 (legacy IR)", "Paddle 3.3.1 (PIR)", "Paddle 2.6.2 (dygraph)"):
        line, = _targets(label, "CNN 3x3 64ch 56x56", rows, "native")
        assert line.startswith(f"- {label}, CNN 3x3 64ch 56x56: O1-bf16 <= 0.85x fp32: cannot "
                               "show: Paddle runs conv2d float32 on a CPU in every runtime")
        assert line.endswith("; measured 1.03x") and "MISSED" not in line


def test_a_cpu_whose_bf16_kernels_do_not_run_cannot_show_the_cnn_target():
    rows = {"fp32": _got(100), "O1-bf16": _got(101)}
    for cls in ("emulated", "none"):
        assert _targets("MXNet", "CNN 3x3 64ch 56x56", rows, cls) == [
            f"- MXNet, CNN 3x3 64ch 56x56: O1-bf16 <= 0.85x fp32: cannot show: no bf16 kernel "
            f"runs on this CPU (bf16 class {cls!r}); measured 1.01x"]


def test_a_ratio_that_two_decimals_would_round_onto_the_limit_gets_three():
    rows = {"fp32": _got(1000), "O1-bf16": _got(854)}
    assert _targets("MXNet", "CNN 3x3 64ch 56x56", rows) == [
        "- MXNet, CNN 3x3 64ch 56x56: O1-bf16 <= 0.85x fp32: 0.854x, MISSED"]
