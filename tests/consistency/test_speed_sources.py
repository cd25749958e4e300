"""One policy, three runtimes, one declared speed source: MXNet, Paddle's static programs (each
IR) and Paddle's dygraph each supply an ``amp_adapters.services.speed_source.SpeedSource`` (a job per op
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
