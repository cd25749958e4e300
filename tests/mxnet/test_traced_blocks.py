"""Traced blocks: reset restores float32, init warns, cast_report tells the truth."""
import gc
import json
import warnings
import weakref

import mxnet as mx
import pytest

import mxnet_amp as amp
from mxnet_amp import traced
from mxnet_testutil import batch, mlp


def _casts(net):
    nodes = json.loads(net._cached_graph[1].tojson(remove_amp_cast=False))["nodes"]
    return sum(n["op"] in ("amp_cast", "amp_multicast") for n in nodes)


def test_reset_restores_float32_in_blocks_traced_under_init():
    amp.init(emulate=True)
    net = mlp()
    net.hybridize()
    x, _ = batch(0)
    amp_out = net(x).asnumpy()
    assert _casts(net) > 0
    amp.reset()
    out = net(x)  # traced again, without AMP
    assert _casts(net) == 0
    fresh = mlp()  # the same weights (seeded), never under AMP
    fresh.hybridize()
    assert out.asnumpy().tobytes() == fresh(x).asnumpy().tobytes()
    assert out.asnumpy().tobytes() != amp_out.tobytes()  # the emulated run was rounded


def test_a_block_traced_before_init_and_run_after_it_warns_once_and_report_says_float32():
    net = mlp()
    net.hybridize()
    x, _ = batch(0)
    net(x)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        amp.init(emulate=True)  # alive but not used yet: nothing to say
    with pytest.warns(UserWarning, match=rf"block '{net.name}' .*hybridize\(\) again"):
        net(x)  # used after init, on its float32 graph
    report = amp.cast_report(net)
    assert {d.run_dtype for d in report.decisions} <= {"float32", None}
    assert all("traced before mxnet_amp.init()" in d.reason for d in report.decisions)
    amp.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        amp.init(emulate=True)
        net(x)  # warned once per block, not again
    net.hybridize()
    net(x)  # traced under AMP now: the report describes the AMP graph
    assert _casts(net) > 0
    report = amp.cast_report(net)
    assert not any("traced before" in d.reason for d in report.decisions)
    assert "float16" in {d.low_dtype for d in report.decisions}


def _fp32_run_left_for_the_collector(x):
    """The demo's fp32 run: a hybridized block traced and run, then dropped while a
    reference cycle keeps it for the garbage collector. Returns a weak reference."""
    net = mlp()
    net(x)
    cycle = [net]
    cycle.append(cycle)  # garbage only the collector frees, with net in it
    return weakref.ref(net)


def test_a_dead_block_traced_before_init_does_not_warn_the_next_model():
    """The demo's sequence: an fp32 run of a hybridized block, then ``init``, then a new
    AMP model. The fp32 block is garbage the collector has not freed yet: ``init``'s
    scan finds it (the old false warning), but it is never run again, so nothing warns."""
    x, _ = batch(0)
    gc.collect()
    gc.disable()  # the collector runs when it likes; here it must not run before init
    try:
        dead = _fp32_run_left_for_the_collector(x)
        assert dead() is not None and dead() in traced.traced_blocks()  # what init's scan sees
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            amp.init(emulate=True)
            net = mlp()
            net(x)
            assert _casts(net) > 0
    finally:
        gc.enable()


def test_converted_symbol_blocks_are_left_alone():
    amp.init()
    net = mlp()
    net.hybridize()
    x, _ = batch(0)
    net(x)
    converted = amp.convert_hybrid_block(net, ctx=mx.cpu())
    graph = converted._cached_graph
    amp.reset()
    assert converted._cached_graph is graph


def test_under_o0_a_block_traced_before_init_runs_what_o0_gives_and_nothing_warns():
    """O0 is float32: the graph traced before init is the one O0 would trace, so a warning
    that it 'runs without AMP' and a report saying so would be false."""
    net = mlp()
    net.hybridize()
    x, _ = batch(0)
    net(x)
    amp.init(policy="O0")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        net(x)
    assert not traced.traced_without_amp(net)
