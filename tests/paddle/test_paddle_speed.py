"""Measured speed on Paddle (``policy="auto"``): the plan follows the measured cost, in the IR
under test (``AMP_TEST_IR``).

Profiles are given as data (a ``SpeedBook`` whose ``measure`` returns fixed costs, in a
cache directory of the test's own), so no assertion depends on this machine's speed; the
real timer runs once per IR on a tiny GEMM and must answer a finite ratio or an error,
never raise. The kernel set is given explicitly (what a CPU with ``avx512_bf16`` answers)
where only the plan is checked; a step runs only where this CPU runs the bf16 GEMM.
"""
import math
import os

import numpy as np
import paddle
import pytest

import paddle_amp
from amp_adapters import Policy
from amp_adapters.services import measure_process, speed_source
from amp_adapters.rules.device import Cost, DeviceProfile, ShapeClass
from amp_adapters.rules.isa import describe_bf16, machine
from paddle_amp import ir, kernels, speed
from paddle_helpers import batch, is_pir, mlp

BF16 = "bfloat16"
GEMMS = ("mul", "matmul_v2")  # what paddle.static.nn.fc builds: 2.6 mul, 3.x matmul_v2
ONEDNN_HERE = frozenset({"matmul_v2", "mul", "elementwise_add", "relu"})
FAST, SLOW = Cost(0.5, 0.01, 0.6, 0.01), Cost(2.5, 0.02, 2.4, 0.02)


pytestmark = pytest.mark.usefixtures("own_speed_cache")


class _Made:
    """The static programs' books the core made in this test (``values()``: read when asked)."""

    def values(self):
        return [b for (src, _), b in speed_source._books.items()
                if isinstance(src, speed.StaticSource)]


def fake_books(monkeypatch, measure):
    """The core's books answering from ``measure(op, shape, training)``: costs as data.
    Returns the books made."""
    monkeypatch.setattr(speed_source, "measure", lambda source: measure)
    speed_source.forget()
    return _Made()


def onednn_cpu(monkeypatch):
    """The profile of a CPU whose oneDNN runs the MLP's ops in bf16, with the costs the
    caller passes (the planner reads them; the kernels are not this CPU's)."""
    monkeypatch.setattr(
        "paddle_amp.speed.device_profile",
        lambda device, dtype, probe, training=True: DeviceProfile(
            kernels.plain_kernels(device, dtype) | ONEDNN_HERE, ONEDNN_HERE, training=training))


def gemm_decisions(report):
    return [d for d in report.decisions if d.op in GEMMS]


def auto_plan(static, policy="auto"):
    _, _, loss = mlp()
    opt = paddle_amp.decorate(paddle.optimizer.SGD(0.01), policy=policy)
    opt.minimize(loss)
    return opt, loss


@pytest.mark.parametrize("cost,lowered", [(FAST, True), (SLOW, False)], ids=["faster", "slower"])
def test_auto_lowers_a_gemm_only_where_it_was_measured_faster(static, monkeypatch, cost,
                                                              lowered):
    onednn_cpu(monkeypatch)
    asked = []
    fake_books(monkeypatch, lambda op, shape, training: asked.append((op, shape, training))
               or (cost if op in GEMMS else None))
    opt, _ = auto_plan(static)
    gemms = gemm_decisions(opt.cast_report())
    assert gemms and all((d.run_dtype == BF16) == lowered for d in gemms)
    for d in gemms:
        assert ("measured faster here" if lowered else "float32: slower here") in d.reason
        assert d.speed == pytest.approx(cost.train)
    # asked at the model's shapes (the unknown batch at the size it is measured at), for a
    # training step
    assert {(op, training) for op, _, training in asked} == {(gemms[0].op, True)}  # GEMMs only
    shapes = {shape.key for op, shape, _ in asked if op in GEMMS}
    assert "64x8;8x16>2" in shapes  # the key says which batch was measured (UNKNOWN_DIM)


def test_without_measured_speed_nothing_is_measured(static, monkeypatch):
    """The O1 preset keeps the lists' decisions: no book, no timing."""
    onednn_cpu(monkeypatch)
    fake_books(monkeypatch, lambda *a: pytest.fail("measured under speed=fixed"))
    opt, _ = auto_plan(static, Policy.preset("O1").replace(dtype=BF16))
    assert all(d.run_dtype == BF16 and d.speed is None
               for d in gemm_decisions(opt.cast_report()))


def test_a_timer_crash_counts_as_no_kernel(static, monkeypatch):
    onednn_cpu(monkeypatch)

    def crash(op, shape, training):
        raise RuntimeError("oneDNN: could not create a primitive")
    fake_books(monkeypatch, crash)
    opt, _ = auto_plan(static)
    gemms = gemm_decisions(opt.cast_report())
    assert gemms and all(d.run_dtype != BF16 for d in gemms)
    assert all("failed while being timed" in d.reason and "could not create" in d.reason
               for d in gemms)


def test_a_saved_profile_replays_the_same_plan(static, monkeypatch, tmp_path):
    onednn_cpu(monkeypatch)
    books = fake_books(monkeypatch, lambda op, shape, training:
                       (FAST if shape.operands[0][-1] == 8 else SLOW) if op in GEMMS else None)
    opt, _ = auto_plan(static)
    first = opt.cast_report()
    assert {d.run_dtype for d in gemm_decisions(first)} == {BF16, "float32"}  # one each
    path = tmp_path / "cpu.json"
    book, = books.values()
    book.save(path)

    # another process: no cache, and a timer that must not run; the real book reads the file
    monkeypatch.undo()
    onednn_cpu(monkeypatch)
    monkeypatch.setenv("AMP_ADAPTERS_CACHE", str(tmp_path / "empty"))
    monkeypatch.setattr(speed_source, "measure",
                        lambda *a: lambda *b: pytest.fail("measured again"))
    speed_source.forget()
    from paddle_helpers import Static
    env = Static.new()
    with paddle.static.program_guard(env.main, env.startup), \
            paddle.utils.unique_name.guard():
        again, _ = auto_plan(env, Policy.preset("auto").replace(profile=str(path)))
    assert [(d.op, d.run_dtype, d.reason, d.speed) for d in gemm_decisions(again.cast_report())] \
        == [(d.op, d.run_dtype, d.reason, d.speed) for d in gemm_decisions(first)]


def test_an_eval_program_is_planned_by_its_forward_cost(static, monkeypatch):
    """amp_init(test_program=...): the eval program's GEMMs go by the inference cost (here
    faster), the training program's by the training step's (here slower)."""
    onednn_cpu(monkeypatch)
    fake_books(monkeypatch, lambda op, shape, training:
               (SLOW if training else FAST) if op in GEMMS else None)
    _, _, loss = mlp()
    test = static.main.clone() if is_pir(static.main) else static.main.clone(for_test=True)
    opt = paddle_amp.decorate(paddle.optimizer.SGD(0.01), policy="auto")
    opt.minimize(loss)
    static.exe.run(static.startup)
    opt.amp_init(paddle.CPUPlace(), test_program=test, use_fp16_test=True)
    assert {d.run_dtype for d in gemm_decisions(opt.cast_report())} == {"float32"}
    evals = gemm_decisions(paddle_amp.cast_report(test))
    assert evals and {d.run_dtype for d in evals} == {BF16}
    assert all(d.speed == pytest.approx(FAST.forward) for d in evals)


# -- the real timer -------------------------------------------------------------------------

def _speed_children():
    return [c.proc.pid for key, c in measure_process._children.items()
            if key[1] == "paddle_amp.speed_child" and c.proc.poll() is None]


def _gemm_runs_low(program, training):
    return kernels.device_profile("CPU", BF16, ir.of(program).probe, training).route(
        "matmul_v2") != "none"


@pytest.mark.parametrize("training", [False, True], ids=["inference", "training"])
def test_without_a_bf16_kernel_the_real_timer_times_nothing(static, training):
    if _gemm_runs_low(static.main, training):
        pytest.skip(f"this CPU runs a bf16 matmul: the next test times it "
                    f"({describe_bf16(machine())})")
    measure_process.close_all()
    measure = speed_source.measure(speed.source("CPU", BF16, ir.of(static.main).probe))
    assert measure("matmul_v2", ShapeClass.of([(-1, 32), (32, 32)], 2), training) is None
    assert _speed_children() == []  # no child was started to time it


@pytest.mark.parametrize("training", [False, True], ids=["inference", "training"])
def test_the_real_timer_answers_a_ratio_or_an_error(static, training):
    if not _gemm_runs_low(static.main, training):
        pytest.skip(f"no oneDNN bf16 matmul here, nothing to time: the previous test "
                    f"({describe_bf16(machine())})")
    measure = speed_source.measure(speed.source("CPU", BF16, ir.of(static.main).probe))
    gemm = "matmul_v2"
    got = measure(gemm, ShapeClass.of([(-1, 32), (32, 32)], 2), training)
    assert isinstance(got, Cost) and got.error is None, got  # a kernel that runs: a ratio
    assert math.isfinite(got.forward) and got.forward > 0
    assert (got.train is not None and math.isfinite(got.train)) == training
    # timed in the measuring child (timing here left the training process slower)
    assert _speed_children() not in ([], [os.getpid()])
    assert measure("relu", ShapeClass.of([(4, 4)], 2), training) is None  # no recipe
    assert measure(gemm, ShapeClass.of([(4, 3), (5, 6)], 2), training) is None  # no fit
    assert measure(gemm, ShapeClass.of([None, (4, 4)], 2), training) is None  # unknown rank


def test_shapes_become_the_op_that_fits_them():
    assert speed.fit("matmul_v2", ((64, 128), (256, 128))) == (
        {"X": (64, 128), "Y": (256, 128)}, {"trans_x": False, "trans_y": True})
    assert speed.fit("matmul", ((8, 64, 32), (32, 16)))[1] == {"transpose_X": False,
                                                              "transpose_Y": False}
    assert speed.fit("mul", ((64, 4, 8), (32, 16)))[1] == {"x_num_col_dims": 1,
                                                          "y_num_col_dims": 1}
    conv = speed.fit("conv2d", ((64, 32, 32, 32), (64, 32, 4, 4)))[1]
    assert (conv["groups"], conv["paddings"]) == (1, [2, 2])
    assert speed.fit("conv2d", ((64, 3, 8, 8), (8, 2, 3, 3))) is None
    # the legacy IR lists a conv2d's slots by name (Filter, Input): the same conv, not a
    # 64x64 window over a 3x3 image
    image, window = (32, 64, 64, 64), (64, 64, 3, 3)
    assert speed.fit("conv2d", (window, image)) == speed.fit("conv2d", (image, window))
    assert speed.fit("conv2d", (window, image))[0] == {"Input": image, "Filter": window}
    assert speed.fit("matmul_v2", ((2, 4, 8), (3, 8, 4))) is None  # batches do not broadcast
    assert speed.StaticSource(BF16, ir.LegacyProgram.probe.name).framework == "paddle"
    assert speed.StaticSource(BF16, ir.PirProgram.probe.name).framework == "paddle-pir"


REAL_GEMM = kernels.runs_onednn_bf16("matmul_v2", backward=True)


@pytest.mark.skipif(not REAL_GEMM, reason=(
    "this CPU runs no oneDNN bf16 matmul (it needs AVX-512, and avx512_bf16 to be fast): "
    "the kernel probe's answer"))
def test_auto_trains_with_the_real_timer(static):
    """policy="auto" end to end: the real kernels and the real timer (measuring while the
    rewrite runs inside the user's program), then training steps; whatever the timings,
    each GEMM's reason says what speed decided."""
    x, y, loss = mlp()
    opt = paddle_amp.decorate(paddle.optimizer.SGD(0.01), policy="auto")
    opt.minimize(loss)
    static.exe.run(static.startup)
    opt.amp_init(paddle.CPUPlace())
    losses = [float(static.run(batch(i), [loss])[0]) for i in range(3)]
    assert np.all(np.isfinite(losses))
    assert gemm_decisions(opt.cast_report())
    for d in gemm_decisions(opt.cast_report()):
        assert d.speed is not None or "failed while being timed" in d.reason, d.reason
        assert ("measured faster here" in d.reason) == (d.run_dtype == BF16), d.reason


def test_the_native_decisions_slower_here_are_said_once(static, caplog, tmp_path, monkeypatch):
    """Without policy= (the native's lists), on a CPU class where oneDNN emulates bf16 (here:
    this machine's speed cache says so), one line names the op, its ratio and policy="auto";
    a second decorate says nothing more."""
    import logging

    from amp_adapters.services import speedbook
    from amp_adapters.rules.device import Cost
    from amp_adapters.services.speedbook import ProfileFile, cache_dir, machine_id, write_profile
    from paddle_amp import ir

    monkeypatch.setenv("AMP_ADAPTERS_CACHE", str(tmp_path))
    monkeypatch.setattr(speedbook, "_warned", set())
    m = machine()
    write_profile(cache_dir() / f"profile-{machine_id(m)}.json", ProfileFile(m, {
        (speed.source("CPU", BF16, ir.of(static.main).probe).framework, paddle.__version__, "bfloat16+train", op,
         "64x2048;2048x2048"): Cost(2.0, 0.01, 2.5, 0.02) for op in ("mul", "matmul_v2")}))
    with caplog.at_level(logging.WARNING, logger="paddle_amp"):
        for _ in range(2):  # two programs, one line
            main, startup = paddle.static.Program(), paddle.static.Program()
            with paddle.static.program_guard(main, startup):
                x = paddle.static.data("x", [None, 8], "float32")
                loss = paddle.mean(paddle.static.nn.fc(x, 4))
                paddle_amp.bf16.decorate_bf16(paddle.optimizer.SGD(0.1)).minimize(loss)
    lines = [r.getMessage() for r in caplog.records if "native bfloat16" in r.getMessage()]
    assert len(lines) == 1 and 'policy="auto"' in lines[0], lines
    assert "mul 2.50x" in lines[0] or "matmul_v2 2.50x" in lines[0], lines[0]


def test_the_timer_times_on_the_place_the_program_runs_on():
    """A program on the CPU is timed on a ``CPUPlace``; on a GPU, on that GPU (a
    ``CUDAPlace`` of its index, built in the child: a CPU build of Paddle ends the process
    when one is built, so here the place is checked as the child receives it)."""
    assert speed.timing_place("CPU") == ("CPUPlace",)
    assert isinstance(speed.place_of(speed.timing_place("CPU")), type(paddle.CPUPlace()))
    assert speed.timing_place("GPU", 1) == ("CUDAPlace", 1)


def test_the_timer_hands_the_child_its_place(static, monkeypatch):
    sent = []
    monkeypatch.setattr(speed_source, "call",
                        lambda server, fn, *args: sent.append(args) or FAST)
    onednn_cpu(monkeypatch)
    measure = speed_source.measure(speed.source("CPU", BF16, ir.of(static.main).probe,
                                                ("CUDAPlace", 1)))
    assert measure("matmul_v2", ShapeClass.of([(64, 32), (32, 32)], 2), True) == FAST
    assert sent[-1][-1]["how"]["place"] == ["CUDAPlace", 1]


def test_a_gpu_book_is_keyed_by_the_gpus_name_and_compute_capability():
    from amp_adapters.services.speedbook import machine_id
    a100 = speed.gpu_of(("CUDAPlace", 0), facts=("NVIDIA A100-SXM4-40GB", (8, 0)))
    v100 = speed.gpu_of(("CUDAPlace", 0), facts=("Tesla V100-SXM2-16GB", (7, 0)))
    assert a100 == "NVIDIA A100-SXM4-40GB (compute capability 8.0)"
    assert machine_id(machine(gpu=a100)) != machine_id(machine(gpu=v100))
    assert speed.gpu_of(("CPUPlace",)) is None
