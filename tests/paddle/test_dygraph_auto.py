"""``policy="auto"`` in ``paddle_amp.dygraph``: a GEMM is lowered only where the core's speed
book measured it faster than float32 at its shape class, in the same cache as the other
runtimes under its own framework key (``paddle-dygraph``), measured once per shape class.

The book is seeded as data (this machine's cache, in a directory of the test's own) and
measuring is forbidden where the answer must come from it, so no assertion depends on
this machine's speed. The lowering tests need a bf16 GEMM on this CPU class (the device
truth); the class without one (``AMP_ADAPTERS_CPU=avx2``) lowers nothing and times nothing.
"""
import json
import math

import numpy as np
import paddle
import pytest

from amp_adapters.services import speed_source
from amp_adapters.rules.device import Cost
from amp_adapters.rules.isa import bf16_class, machine
from amp_adapters.services.speedbook import ProfileFile, cache_dir, machine_id, write_profile
from paddle_amp import dygraph as amp
from paddle_amp.dygraph import kernels, speed as dy_speed

NO_BF16 = bf16_class(machine()) == "none"
needs_bf16 = pytest.mark.skipif(NO_BF16, reason="the device truth (isa.bf16_class) says this "
                                "CPU class has no oneDNN bf16 kernel: the next tests")
FAST, SLOW = Cost(0.5, 0.01, 0.6, 0.01), Cost(2.5, 0.02, 2.4, 0.02)
FIRST, SECOND = "8x32;32x64>2", "8x64;64x16>2"  # the two Linears' GEMMs at a batch of 8
V = paddle.__version__


pytestmark = pytest.mark.usefixtures("own_speed_cache")  # (the root conftest)




def seed(entries):
    """This machine's cache holding ``entries``: {(framework, shape key): Cost}, for the
    training step of ``matmul_v2`` in bfloat16."""
    m = machine()
    write_profile(cache_dir() / f"profile-{machine_id(m)}.json", ProfileFile(m, {
        (fw, V, "bfloat16+train", "matmul_v2", shape): cost
        for (fw, shape), cost in entries.items()}))


def no_measuring(monkeypatch):
    monkeypatch.setattr(speed_source, "measure", lambda source: lambda *a: pytest.fail(
        f"measured {a} though the book had the answer"))


def net():
    paddle.seed(0)
    return paddle.nn.Sequential(paddle.nn.Linear(32, 64), paddle.nn.ReLU(),
                                paddle.nn.Linear(64, 16))


def x():
    return paddle.to_tensor(np.random.default_rng(0).standard_normal((8, 32)).astype("float32"))


def gemms(report):
    return [d for d in report.decisions if d.op == "matmul_v2"]


@needs_bf16
def test_auto_lowers_a_gemm_only_where_the_book_measured_it_faster(monkeypatch):
    seed({("paddle-dygraph", FIRST): FAST, ("paddle-dygraph", SECOND): SLOW})
    no_measuring(monkeypatch)
    first, second = gemms(amp.cast_report(net(), x(), policy="auto"))
    assert (first.run_dtype, first.execution) == ("bfloat16", "kernel")
    assert "measured faster here (0.60x" in first.reason and first.speed == 0.6
    # measured slower: float32, and the reason names the speed
    assert second.run_dtype == "float32" and second.refusal == "measured"
    assert "float32: slower here (2.40x float32 for its bfloat16 training step" in \
        second.reason and second.speed == 2.4
    # a training step under auto_cast runs as the report says: the slow GEMM exactly float32
    model, inputs = net(), x()
    with amp.auto_cast(policy="auto"):
        hidden = model[1](model[0](inputs))
        out = model[2](hidden)
    np.testing.assert_array_equal(out.numpy(), model[2](hidden).numpy())
    out.mean().backward()
    assert all(np.isfinite(p.grad.numpy()).all() for p in model.parameters())


@needs_bf16
def test_an_inference_forward_reads_the_forward_ratio(monkeypatch):
    m = machine()
    write_profile(cache_dir() / f"profile-{machine_id(m)}.json", ProfileFile(m, {
        ("paddle-dygraph", V, "bfloat16", "matmul_v2", shape): Cost(2.0, 0.01)
        for shape in (FIRST, SECOND)}))
    no_measuring(monkeypatch)
    decided = gemms(amp.cast_report(net(), x(), policy="auto", training=False))
    assert [d.run_dtype for d in decided] == ["float32", "float32"]
    assert all("2.00x float32 for its bfloat16 forward" in d.reason for d in decided)


@needs_bf16
def test_dygraph_entries_share_the_cache_under_their_own_key(monkeypatch):
    """A static program's entry at the same op and shape is not eager mode's answer; what
    eager mode measures is written beside it, once per shape class."""
    seed({("paddle", FIRST): FAST, ("paddle", SECOND): FAST})
    asked = []
    monkeypatch.setattr(speed_source, "measure", lambda source: lambda op, shape, training:
                        asked.append((source.framework, op, shape.key, training)) or SLOW)
    model = net()
    for _ in range(2):  # two steps, two regions: measured once per shape class
        with amp.auto_cast(policy="auto"):
            model(x()).mean().backward()
    assert sorted(asked) == [("paddle-dygraph", "matmul_v2", s, True) for s in (FIRST, SECOND)]
    assert all(d.run_dtype == "float32" for d in gemms(amp.cast_report(model, x(),
                                                                       policy="auto")))
    rows = json.loads(next(cache_dir().glob("profile-*.json")).read_text())["entries"]
    assert sorted((r["framework"], r["shape"]) for r in rows) == sorted(
        [("paddle", FIRST), ("paddle", SECOND), ("paddle-dygraph", FIRST),
         ("paddle-dygraph", SECOND)])


def test_without_a_bf16_kernel_auto_lowers_nothing_and_times_nothing(monkeypatch):
    """The CPU class without oneDNN bf16 (here ``AMP_ADAPTERS_CPU=avx2`` for the device
    layer): every GEMM float32 for lack of a kernel, nothing timed, nothing written."""
    monkeypatch.setenv("AMP_ADAPTERS_CPU", "avx2")
    kernels.forget()  # the device truth read again, as this class
    monkeypatch.setattr(speed_source, "measure", lambda source: lambda *a: pytest.fail(
        f"timed {a} on a CPU class without a bf16 kernel"))
    try:
        model = net()
        model = amp.decorate(model, policy="auto")
        decided = gemms(amp.cast_report(model, x(), policy="auto"))
        assert decided and all(d.run_dtype == "float32" and d.execution == "fell back"
                               and "no bfloat16 kernel" in d.reason for d in decided)
        with amp.auto_cast(policy="auto"):
            model(x()).mean().backward()
        assert not cache_dir().exists() or not list(cache_dir().glob("profile-*.json"))
    finally:
        monkeypatch.undo()
        kernels.forget()


def test_the_dygraph_source_satisfies_the_declared_protocol():
    src = dy_speed.source("bfloat16")
    assert isinstance(src, speed_source.SpeedSource)
    assert (src.framework, src.timer, src.gpu) == ("paddle-dygraph", "paddle_amp.dygraph.speed",
                                                  None)
    from amp_adapters.rules.device import ShapeClass
    job = src.job("matmul_v2", ShapeClass.of([(8, 32), (32, 64)], 2), True)
    if NO_BF16:
        assert job is None  # no low route here: nothing to time
        return
    assert job.how == {"x": [8, 32], "y": [32, 64], "trans": [False, False]}
    assert src.job("conv2d", ShapeClass.of([(8, 3, 8, 8), (4, 3, 3, 3)], 4), True) is None
    assert src.job("matmul_v2", ShapeClass.of([(8, 3), (5, 6)], 2), True) is None  # no fit


@needs_bf16
def test_the_dygraph_timer_answers_a_ratio_in_the_measuring_child():
    from amp_adapters.rules.device import ShapeClass
    book = speed_source.book(dy_speed.source("bfloat16"))
    got = book.lookup("matmul_v2", ShapeClass.of([(16, 32), (32, 32)], 2), True)
    assert isinstance(got, Cost) and got.error is None, got
    assert math.isfinite(got.forward) and got.forward > 0 and math.isfinite(got.train)


def test_without_policy_the_native_decisions_slower_here_are_said_once(monkeypatch, caplog):
    """A region without ``policy=`` runs the native's lists on this CPU (``paddle.amp`` would
    do nothing here): where this machine's cache measured the eager bf16 GEMM slower, one
    line says so and names ``policy="auto"``; the next regions say nothing more."""
    import logging

    from amp_adapters.services import speedbook
    monkeypatch.setattr(speedbook, "_warned", set())
    monkeypatch.setattr(dy_speed, "_noted", set())
    monkeypatch.setattr(dy_speed, "_seen", {})  # (a region earlier in the process asked)
    seed({("paddle-dygraph", FIRST): SLOW})
    with caplog.at_level(logging.WARNING, logger="paddle_amp.dygraph"):
        for _ in range(3):
            with amp.auto_cast(dtype="bfloat16"):
                net()(x())
    lines = [r.getMessage() for r in caplog.records if "native bfloat16" in r.getMessage()]
    assert len(lines) == 1 and lines[0].startswith("paddle_amp.dygraph: "), lines
    assert "matmul_v2 2.40x" in lines[0] and 'policy="auto"' in lines[0], lines[0]
