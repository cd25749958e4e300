"""Traced blocks: reset restores float32, init warns, cast_report tells the truth."""
import json
import warnings

import mxnet as mx
import pytest

import mxnet_amp as amp
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


def test_init_after_tracing_warns_once_naming_the_block_and_report_says_float32():
    net = mlp()
    net.hybridize()
    x, _ = batch(0)
    net(x)
    with pytest.warns(UserWarning, match=rf"block '{net.name}' .*hybridize\(\) again"):
        amp.init(emulate=True)
    report = amp.cast_report(net)
    assert {d.run_dtype for d in report.decisions} <= {"float32", None}
    assert all("traced before mxnet_amp.init()" in d.reason for d in report.decisions)
    amp.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        amp.init(emulate=True)  # warned once per block, not again
    net.hybridize()
    net(x)  # traced under AMP now: the report describes the AMP graph
    assert _casts(net) > 0
    report = amp.cast_report(net)
    assert not any("traced before" in d.reason for d in report.decisions)
    assert "float16" in {d.low_dtype for d in report.decisions}


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
