"""Measured speed on MXNet (issue 31): profiles as data decide the plan of a real Gluon net,
a saved profile replays it, the real timer runs on the real framework (its value never
asserted), a crash while timing is "no kernel", and the native's slowdown is said once.

A plan from costs given as data needs no kernel: those tests give the kernel set as data
too (``kernel_as_data``) and trace the net without running it where the plan lowers an op,
so they run on every CPU class; only the tests that run a bfloat16 kernel (the real timer,
an imperative call computing in bf16) are skipped where the device truth
(``amp_adapters.rules.isa.bf16_class``) says oneDNN has none."""
import logging
import math
import os

import mxnet as mx
import numpy as np
import pytest
from mxnet import autograd, gluon

import mxnet_amp as amp
from amp_adapters import Policy
from amp_adapters.services import measure_process, speedbook
from amp_adapters.rules.device import Cost, ShapeClass
from amp_adapters.services.speedbook import SpeedBook, machine_id, ProfileFile, write_profile
from amp_adapters.rules.isa import bf16_class, describe_bf16, machine
from mxnet_amp import kernels
from amp_adapters.services import speed_source
from mxnet_amp.speed import measure, source

needs_bf16 = pytest.mark.skipif(
    bf16_class(machine()) == "none",
    reason=f"runs a bfloat16 kernel, and this CPU has none: {describe_bf16(machine())} "
    f"(amp_adapters.rules.isa.bf16_class: 'none'; oneDNN's bf16 kernels need AVX-512)")
AUTO = Policy.preset("auto")


@pytest.fixture
def kernel_as_data(monkeypatch):
    """The device's bfloat16 FullyConnected kernel (forward and backward) given as data, in
    the probe's cache: the plan reads it, nothing here runs it."""
    for backward in (False, True):
        monkeypatch.setitem(kernels._probed, ("cpu", "bfloat16", "FullyConnected", backward),
                            True)


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("AMP_ADAPTERS_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("AMP_ADAPTERS_REFRESH", raising=False)
    return tmp_path / "cache"


def _net():
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Dense(32, in_units=16), gluon.nn.Dense(4, in_units=32))
    net.initialize()
    net.hybridize()
    return net


def _train_once(net):
    with autograd.record():
        out = net(mx.nd.ones((8, 16)))
    out.backward()
    out.wait_to_read()
    return out


def _trace(net):
    """Trace ``net`` under ``init`` as its first forward does, without running it (the plan
    may lower an op to a kernel this CPU does not have: it is given as data)."""
    net._get_graph(mx.nd.ones((8, 16)))
    return net


def _plan(net):
    return {d.reason.split(";")[-1].strip(): d.run_dtype
            for d in amp.cast_report(net).decisions if d.op == "FullyConnected"}


def slow_first_layer(op, shape, training):
    """The first Dense (32 outputs) measured slower, the second faster."""
    slow = shape.operands[1][0] == 32
    return Cost(forward=2.5 if slow else 0.5, train=2.5 if slow else 0.5, train_spread=0.01)


def test_auto_lowers_fully_connected_only_where_the_profile_says_faster(kernel_as_data):
    calls = []
    book = SpeedBook("mxnet", mx.__version__, "bfloat16",
                     lambda *a: calls.append(a) or slow_first_layer(*a))
    amp.init(policy="auto")
    speed_source.install(source(mx.cpu(), AUTO.dtype), book, AUTO.profile)
    net = _trace(_net())
    plan = amp.cast_report(net).decisions
    fc = [d for d in plan if d.op == "FullyConnected"]
    assert [d.run_dtype for d in fc] == ["float32", "bfloat16"]
    assert "float32: slower here (2.50x" in fc[0].reason and fc[0].speed == 2.5
    assert "measured faster here (0.50x" in fc[1].reason
    assert {(op, s.key, t) for op, s, t in calls} == {
        ("FullyConnected", "8x16;32x16;32", True), ("FullyConnected", "8x32;4x32;4", True)}
    # the same lists without measuring (O1 bf16) lower both, as the native bf16 lists do
    amp.reset()
    amp.init(policy="O1-bf16")
    fixed = _trace(_net())
    assert [d.run_dtype for d in amp.cast_report(fixed).decisions
            if d.op == "FullyConnected"] == ["bfloat16", "bfloat16"]


def _imperative():
    amp.init(policy="auto")
    speed_source.install(source(mx.cpu(), AUTO.dtype),
                         SpeedBook("mxnet", mx.__version__, "bfloat16", slow_first_layer),
                         AUTO.profile)
    net = gluon.nn.Sequential()
    net.add(gluon.nn.Dense(32, in_units=16), gluon.nn.Dense(4, in_units=32))
    net.initialize()
    return net


def test_auto_keeps_an_imperative_call_measured_slower_in_float32(kernel_as_data):
    h = _imperative()[0](mx.nd.ones((8, 16)))
    assert np.dtype(h.dtype) == np.float32  # kept float32: slower here


@needs_bf16
def test_auto_decides_per_shape_class_on_imperative_calls():
    net = _imperative()
    h = net[0](mx.nd.ones((8, 16)))
    assert np.dtype(h.dtype) == np.float32  # kept float32: slower here
    assert np.dtype(net[1](h).dtype) != np.float32  # lowered: bf16 out, as the native's lowered op gives


def test_a_saved_profile_replays_the_plan_whatever_this_machine_measures(tmp_path,
                                                                         kernel_as_data):
    book = SpeedBook("mxnet", mx.__version__, "bfloat16", slow_first_layer)
    amp.init(policy="auto")
    speed_source.install(source(mx.cpu(), AUTO.dtype), book, AUTO.profile)
    _trace(_net())
    book.save(tmp_path / "profile.json")
    amp.reset()

    def opposite(op, shape, training):
        raise AssertionError("a saved profile must not be measured again")
    replay = AUTO.replace(profile=str(tmp_path / "profile.json"))
    speed_source.install(source(mx.cpu(), replay.dtype),
                         SpeedBook("mxnet", mx.__version__, "bfloat16", opposite,
                                   profile=replay.profile, cache=tmp_path / "other.json"),
                         replay.profile)
    amp.init(policy=replay)
    net = _trace(_net())
    assert [d.run_dtype for d in amp.cast_report(net).decisions
            if d.op == "FullyConnected"] == ["float32", "bfloat16"]


@needs_bf16
def test_the_real_timer_gives_finite_ratios_for_training_and_inference():
    shape = ShapeClass.of([(None, 64), (64, 64), (64,)])  # the batch measured at UNKNOWN_DIM
    cost = measure("FullyConnected", shape, True, budget_s=0.01)
    assert math.isfinite(cost.forward) and cost.forward > 0
    assert math.isfinite(cost.train) and cost.train > 0 and cost.error is None
    assert measure("FullyConnected", shape, False, budget_s=0.01).train is None
    assert measure("_npi_einsum", ShapeClass.of([(4, 4), (4, 4)]), False) is None  # no recipe


@needs_bf16
def test_the_book_times_in_the_measuring_child_not_in_this_process(cache):
    """Timing allocates a model's sizes; done here it left the training process slower
    (``amp_adapters.services.measure_process``), so the book's measurement runs in the child."""
    measure_process.close_all()
    book = SpeedBook("mxnet", mx.__version__, "bfloat16", speed_source.measure(source(mx.cpu(), "bfloat16")))
    cost = book.lookup("FullyConnected", ShapeClass.of([(8, 64), (64, 64), (64,)]), True)
    assert cost is not None and cost.error is None and math.isfinite(cost.train)
    children = [c for key, c in measure_process._children.items()
                if key[1] == "mxnet_amp.speed_child" and c.proc.poll() is None]
    assert len(children) == 1 and children[0].proc.pid != os.getpid()


def test_an_op_that_fails_while_timed_is_no_kernel_and_does_not_raise(cache):
    # MXNet 1.9.1 has no bfloat16 dot on CPU: the real timer raises, the book records it
    book = SpeedBook("mxnet", mx.__version__, "bfloat16", speed_source.measure(source(mx.cpu(), "bfloat16")))
    cost = book.lookup("dot", ShapeClass.of([(8, 8), (8, 8)]), False)
    assert cost.error and "MXNetError" in cost.error
    # the bf16 Deconvolution gradient would end the process: refused before running
    cost = book.lookup("Deconvolution", ShapeClass.of([(2, 4, 8, 8), (4, 4, 3, 3)]), True)
    assert cost.error and "aborts the process" in cost.error
    mx.nd.waitall()  # nothing pending from the failures


def test_a_crash_while_timing_keeps_the_op_in_float32(kernel_as_data):
    def crash(op, shape, training):
        raise RuntimeError("kernel exploded")
    amp.init(policy="auto")
    speed_source.install(source(mx.cpu(), AUTO.dtype),
                         SpeedBook("mxnet", mx.__version__, "bfloat16", crash), AUTO.profile)
    net = _net()
    out = _train_once(net)
    assert np.dtype(out.dtype) == np.float32
    fc = [d for d in amp.cast_report(net).decisions if d.op == "FullyConnected"]
    assert all(d.run_dtype == "float32" and "failed while being timed" in d.reason
               for d in fc)


def test_the_native_decisions_slower_here_are_said_once(cache, monkeypatch, caplog):
    monkeypatch.setattr(speedbook, "_warned", set())
    here = machine()
    write_profile(cache / f"profile-{machine_id(here)}.json", ProfileFile(here, {
        ("mxnet", mx.__version__, "bfloat16+train", "FullyConnected", "64x2048;2048x2048"):
            Cost(forward=2.4, train=2.5, train_spread=0.02)}))
    with caplog.at_level(logging.WARNING, logger="mxnet_amp"):
        amp.init(target_dtype="bfloat16")
        amp.reset()
        amp.init(target_dtype="bfloat16")
    lines = [r.getMessage() for r in caplog.records if "native bfloat16 decisions" in
             r.getMessage()]
    assert len(lines) == 1 and "\n" not in lines[0]
    assert "FullyConnected 2.50x" in lines[0] and 'policy="auto"' in lines[0]
    caplog.clear()
    amp.reset()
    monkeypatch.setattr(speedbook, "_warned", set())
    with caplog.at_level(logging.WARNING, logger="mxnet_amp"):
        amp.init(policy="O1-bf16")  # a policy given: the user chose; nothing said
    assert not [r for r in caplog.records if "native bfloat16" in r.getMessage()]


def test_a_gpu_book_is_keyed_by_the_gpus_name_and_compute_capability():
    """A GPU profile given as data (no GPU here): each GPU model is its own machine in the
    key, not every GPU "mxnet gpu"; a CPU has none."""
    from mxnet_amp import speed
    a100 = speed.gpu_of(mx.gpu(1), facts=("NVIDIA A100-SXM4-40GB", (8, 0)))
    v100 = speed.gpu_of(mx.gpu(1), facts=("Tesla V100-SXM2-16GB", (7, 0)))
    assert a100 == "NVIDIA A100-SXM4-40GB (compute capability 8.0)"
    assert machine_id(machine(gpu=a100)) != machine_id(machine(gpu=v100))
    assert speed.gpu_of(mx.cpu()) is None
    assert speed.source(mx.cpu(), "bfloat16").gpu is None

