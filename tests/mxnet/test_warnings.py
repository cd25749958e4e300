"""What mxnet_amp tells the user: a fallback to float32 warns once per op, and each traced
model gets one summary line; emulation (asked for) is INFO, not a warning."""
import logging

import pytest
from mxnet import gluon, nd

import mxnet_amp as amp


def _mlp():
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Dense(8, activation="relu", in_units=4), gluon.nn.Dense(3, in_units=8),
            gluon.nn.Dense(2, in_units=3))
    net.initialize()
    net.hybridize()
    return net


def _records(caplog, level):
    return [r.getMessage() for r in caplog.records if r.name == "mxnet_amp"
            and r.levelno == level]


def test_fallback_warns_once_per_op_and_summarizes_the_model(caplog):
    caplog.set_level(logging.INFO, logger="mxnet_amp")
    amp.init()
    net = _mlp()
    for _ in range(3):
        net(nd.ones((2, 4)))
    warnings = _records(caplog, logging.WARNING)
    per_op = [m for m in warnings if m.startswith("FullyConnected on cpu")]
    assert len(per_op) == 1, warnings  # three Dense layers, three calls: one warning
    assert "no float16 kernel for FullyConnected" in per_op[0]
    assert "pass emulate=True" in per_op[0]
    summaries = [m for m in warnings if m.startswith("mxnet_amp: block ")]
    assert len(summaries) == 1, warnings  # one per traced model, not per call
    assert net.name in summaries[0]
    assert "3 in float32 for lack of a float16 kernel on cpu(0) (FullyConnected x3)" in \
        summaries[0]
    assert "pass emulate=True to emulate float16 on them" in summaries[0]


def test_a_second_model_gets_its_own_summary_but_no_second_op_warning(caplog):
    caplog.set_level(logging.WARNING, logger="mxnet_amp")
    amp.init()
    a, b = _mlp(), _mlp()
    a(nd.ones((2, 4)))
    b(nd.ones((2, 4)))
    warnings = _records(caplog, logging.WARNING)
    assert sum(m.startswith("FullyConnected on") for m in warnings) == 1
    assert [m.split(":")[1].split()[1] for m in warnings if m.startswith("mxnet_amp: block")] \
        == [a.name, b.name]


def test_reset_lets_the_next_init_warn_again_and_restores_get_graph(caplog):
    caplog.set_level(logging.WARNING, logger="mxnet_amp")
    original = gluon.HybridBlock._get_graph
    amp.init()
    assert gluon.HybridBlock._get_graph is not original
    _mlp()(nd.ones((2, 4)))
    amp.reset()
    assert gluon.HybridBlock._get_graph is original
    amp.init()
    _mlp()(nd.ones((2, 4)))
    assert sum(m.startswith("FullyConnected on") for m in _records(caplog, logging.WARNING)) == 2


def test_emulation_is_info_not_a_warning(caplog):
    caplog.set_level(logging.INFO, logger="mxnet_amp")
    amp.init(emulate=True)
    _mlp()(nd.ones((2, 4)))
    assert _records(caplog, logging.WARNING) == []
    info = _records(caplog, logging.INFO)
    assert any(m.startswith("FullyConnected on cpu") and "EMULATED float16" in m for m in info)
    assert any(m.startswith("mxnet_amp: block") and "3 EMULATED float16" in m for m in info)


def test_a_model_without_fallbacks_says_nothing(caplog):
    """No fallback, no line: a model whose ops all have their kernels here is silent."""
    caplog.set_level(logging.INFO, logger="mxnet_amp")
    amp.init(target_dtype="float16")
    net = gluon.nn.HybridLambda(lambda F, x: F.softmax(x))
    net.hybridize()
    net(nd.ones((2, 4)))
    assert _records(caplog, logging.WARNING) == [] and _records(caplog, logging.INFO) == []


def test_the_report_counts_the_casts_of_the_graph_that_runs():
    """cast_report's count is the amp_cast/amp_multicast nodes of the traced graph, emulation's
    round trips included and counted apart."""
    import json
    amp.init(emulate=True)
    net = _mlp()
    net(nd.ones((2, 4)))
    report = amp.cast_report(net)
    sym = net._cached_graph[1]
    nodes = json.loads(sym.tojson(remove_amp_cast=False))["nodes"]
    in_graph = sum(n["op"] in ("amp_cast", "amp_multicast") for n in nodes)
    assert in_graph > 0 and report.num_casts == in_graph
    assert 0 < report.graph_casts.round_trips <= in_graph
    assert str(report).splitlines()[0].startswith(f"mxnet: {len(report.decisions)} ops, "
                                                  f"{in_graph} casts in the forward graph (")
    assert "why" in str(report).splitlines()[1]


@pytest.mark.parametrize("emulate", [False, True])
def test_print_report_is_the_table_with_reasons(emulate):
    amp.init(emulate=emulate)
    net = _mlp()
    net(nd.ones((2, 4)))
    text = str(amp.cast_report(net))
    row = next(line for line in text.splitlines() if line.startswith("FullyConnected"))
    assert ("EMULATED float16" if emulate else "no float16 kernel for FullyConnected") in row


def _native_runs(op, dtype):
    """Whether MXNet itself runs ``op`` in ``dtype`` on this CPU (a fresh process, no probe)."""
    import subprocess
    import sys
    call = {"FullyConnected": "mx.nd.FullyConnected(x(2, 3), x(4, 3), no_bias=True, "
                              "num_hidden=4)",
            "Convolution": "mx.nd.Convolution(x(1, 1, 3, 3), x(1, 1, 1, 1), no_bias=True, "
                           "kernel=(1, 1), num_filter=1)"}[op]
    dt = "np.dtype([('bfloat16', np.uint16)])" if dtype == "bfloat16" else repr(dtype)
    script = (f"import mxnet as mx, numpy as np\nx = lambda *s: mx.nd.amp_cast(mx.nd.ones(s), "
              f"dtype={dt})\n{call}.wait_to_read()\n")
    return subprocess.run([sys.executable, "-c", script], capture_output=True,
                          timeout=600).returncode == 0


def test_kernel_probes_print_nothing():
    """A probe that fails is the answer, not news: MXNet's C++ lines about it (oneDNN's
    "could not create a primitive descriptor iterator" for bf16 GEMMs on a CPU without
    AVX-512, the float16 softmax accumulation hint) do not reach the user (a fresh process:
    probes are cached). The answers are MXNet's own: a GEMM/conv call made without the
    probe succeeds exactly where the probe says a kernel exists (on any CPU)."""
    import subprocess
    import sys
    ops, dtypes = ("FullyConnected", "Convolution", "softmax"), ("float16", "bfloat16")
    script = ("import mxnet as mx\nfrom mxnet_amp.kernels import has_kernel\n"
              f"print([has_kernel(op, mx.cpu(), dt) for op in {ops!r} for dt in {dtypes!r}])\n")
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr
    assert r.stderr == "", r.stderr
    answers = dict(zip([(op, dt) for op in ops for dt in dtypes], eval(r.stdout)))
    assert answers[("softmax", "float16")] and answers[("softmax", "bfloat16")]
    assert not answers[("FullyConnected", "float16")]  # MXNet 1.9.1's CPU build: no fp16 GEMM
    for op in ("FullyConnected", "Convolution"):
        assert answers[(op, "bfloat16")] == _native_runs(op, "bfloat16"), op
