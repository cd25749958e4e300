"""One policy, three runtimes, one declared speed source: MXNet, Paddle's static programs (each
IR) and Paddle's dygraph each supply an ``amp_adapters.services.speed_source.SpeedSource`` (a job
per op
and shape class, a timer module), and the core's book keys each under its own framework in
the one cache."""
import importlib
import sys

import mxnet as mx
import paddle

from amp_adapters import Policy
from amp_adapters.services import speed_source
from amp_adapters.rules.device import ShapeClass
from amp_adapters.services.speed_source import SpeedSource


def sources():
    from mxnet_amp import speed as mx_speed
    from paddle_amp import ir
    from paddle_amp import speed as pd_speed
    from paddle_amp.dygraph import speed as dy_speed
    return [mx_speed.source(mx.cpu(), "bfloat16"),
            pd_speed.source("CPU", "bfloat16", ir.LegacyProgram.probe),
            dy_speed.source("bfloat16")]


def test_the_three_runtimes_supply_the_one_declared_protocol():
    found = sources()
    assert all(isinstance(s, SpeedSource) for s in found)
    assert [s.framework for s in found] == ["mxnet", "paddle", "paddle-dygraph"]
    assert [s.version for s in found] == [mx.__version__, paddle.__version__,
                                          paddle.__version__]
    for s in found:  # the child module loads the timer whose time_job times a job
        importlib.import_module(s.child)
        assert callable(sys.modules[s.timer].time_job)
        assert s.job("relu", ShapeClass.of([(4, 4)], 2), True) is None  # nothing to time


def test_each_runtimes_book_is_the_cores_under_its_own_framework(tmp_path, monkeypatch):
    monkeypatch.setenv("AMP_ADAPTERS_CACHE", str(tmp_path))
    speed_source.forget()
    try:
        books = [speed_source.book(s, None) for s in sources()]
        assert [b.framework for b in books] == ["mxnet", "paddle", "paddle-dygraph"]
        assert len({b.cache_path for b in books}) == 1  # one cache per machine
        assert speed_source.costs(sources()[2], Policy.preset("O1-bf16"), True) is None
    finally:
        speed_source.forget()


def test_the_runtimes_answer_profile_and_gpu_of_alike_and_keep_no_wrappers():
    """One shape for ``profile`` (policy, device, [the IR,] training; dygraph's device is a
    profile already for training or inference), ``gpu_of`` for the GPU in the key, and the
    core's ``measure``/``book``/``install`` called as they are (no per-runtime wrapper)."""
    import inspect

    from mxnet_amp import speed as mx_speed
    from paddle_amp import speed as pd_speed
    from paddle_amp.dygraph import speed as dy_speed

    def params(fn):
        return list(inspect.signature(fn).parameters)
    assert params(mx_speed.profile) == ["policy", "ctx", "training"]
    assert params(pd_speed.profile) == ["policy", "device", "probe", "training"]
    assert params(dy_speed.profile) == ["policy", "device"]
    assert mx_speed.gpu_of(mx.cpu()) is None and pd_speed.gpu_of(("CPUPlace",)) is None
    for module, names in ((mx_speed, ("measurer", "install_speed_book", "here", "book")),
                          (pd_speed, ("timer", "framework", "book"))):
        assert [n for n in names if hasattr(module, n)] == []


def test_every_runtime_times_a_job_through_the_cores_cost_of(monkeypatch):
    """The timing pattern (forward ratio, then training ratio, one budget) is the core's
    ``cost_of``: each runtime's timer hands it its two runs (answered as data here: nothing
    is timed, so this holds on every CPU class)."""
    from amp_adapters.rules.device import Cost
    from amp_adapters.services.speed_source import Job
    from mxnet_amp import speed as mx_speed
    from paddle_amp import ir
    from paddle_amp import speed as pd_speed
    from paddle_amp.dygraph import speed as dy_speed

    asked = []
    monkeypatch.setattr(speed_source, "cost_of", lambda low, base, training, *a: (
        asked.append(training) or Cost(0.5, 0.0, 0.5, 0.0)))
    gemm = ShapeClass.of([(8, 16), (16, 8)], 2)
    got = [mx_speed.measure("dot", gemm, True),
           pd_speed.time_job(Job("matmul_v2", gemm, True, "bfloat16", {
               "ir": ir.default_probe().name, "inputs": {"X": [8, 16], "Y": [16, 8]},
               "attrs": {"trans_x": False, "trans_y": False}, "onednn": False,
               "cast_in": None, "place": ["CPUPlace"]})),
           dy_speed.time_job(Job("matmul_v2", gemm, False, "bfloat16", {
               "x": [8, 16], "y": [16, 8], "trans": [False, False]}))]
    assert got == [Cost(0.5, 0.0, 0.5, 0.0)] * 3 and asked == [True, True, False]


def test_each_runtime_answers_info_measure_from_its_source(tmp_path, monkeypatch):
    """``amp-adapters info --measure`` / ``profile`` have rows for the three runtimes (setup.cfg
    registers each ``speed_probe``), each built by the core from the runtime's source: its
    book under its framework, the same GEMM samples (timed here as data: nothing runs)."""
    import configparser
    from pathlib import Path

    from amp_adapters.rules.device import Cost
    from amp_adapters.services import speed_report
    from mxnet_amp import speed as mx_speed
    from paddle_amp import speed as pd_speed
    from paddle_amp.dygraph import speed as dy_speed

    cfg = configparser.ConfigParser()
    cfg.read(Path(__file__).resolve().parents[2] / "setup.cfg")
    group = cfg["options.entry_points"][speed_report.SPEED_GROUP]
    assert "paddle-dygraph = paddle_amp.dygraph.speed:speed_probe" in group
    monkeypatch.setenv("AMP_ADAPTERS_CACHE", str(tmp_path))
    monkeypatch.setattr(speed_source, "measure", lambda source: lambda *a: Cost(0.6, 0.01,
                                                                                 0.7, 0.01))
    speed_source.forget()
    try:
        probes = [m.speed_probe("bfloat16") for m in (mx_speed, pd_speed, dy_speed)]
        assert [p.framework for p in probes] == [s.framework for s in sources()]
        assert all(p.book is speed_source.book(s) for p, s in zip(probes, sources()))
        assert len({tuple(s.what for s in p.samples) for p in probes}) == 1
        found = [speed_report.rows(p, "bfloat16") for p in probes]
        assert [r.framework for rows in found for r in rows][-3:] == ["paddle-dygraph"] * 3
    finally:
        speed_source.forget()
