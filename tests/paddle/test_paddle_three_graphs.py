"""One policy, three graphs: MXNet, Paddle's legacy IR and PIR give the same cast reports
(the canonical columns) on the consistency models, in one test run.

Each graph's reports come from a worker process of this run (three_graphs_worker.py):
Paddle in each IR (``FLAGS_enable_pir_api``; PIR only on Paddle 3), MXNet from the Python
``AMP_MXNET_PYTHON`` names (``make test-paddle3`` passes the MXNet venv's: MXNet and
Paddle 3 share no environment), or this one if it has MXNet. Paddle 3.3.1's
``OldIrGuard`` cannot host the transformer in-process (``paddle.matmul`` then takes the
PIR builder: "must be Value, but got Variable"), hence a process per IR. Where MXNet and
Paddle run an op on different kernels on this CPU (``kernel_differences``), the ops that
follow their inputs downstream differ too, and ``policy_disagreements`` compares the rest.
"""
import importlib.util
import json
import os
import subprocess
import sys

import paddle
import pytest

from amp_adapters import CastReport, OpDecision, kernel_differences, policy_disagreements

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
WORKER = os.path.join(HERE, "three_graphs_worker.py")
PADDLE3 = int(paddle.__version__.split(".")[0]) >= 3

# Each run covers both IRs itself: on Paddle 3 it runs in the suite's PIR pass only.
pytestmark = pytest.mark.skipif(
    PADDLE3 and os.environ.get("AMP_TEST_IR") != "pir",
    reason="covers both IRs in one run: make test-paddle3 runs it in its AMP_TEST_IR=pir pass")

# Canonical ops each model must have in all three reports, so agreement is not vacuous
# (MXNet's Dense is one `linear` op, Paddle's Linear a matmul and an add: not shared).
SHARED = {
    "mlp": {"relu"},
    "cnn": {"conv", "batch_norm", "relu", "pool"},
    "transformer": {"matmul", "softmax", "add", "layer_norm", "gelu"},
    "lstm": {"embedding", "rnn"},
}


def _mxnet_python():
    given = os.environ.get("AMP_MXNET_PYTHON")
    if given:
        return given
    if importlib.util.find_spec("mxnet") is not None:
        return sys.executable
    pytest.skip("MXNet is not in this environment and AMP_MXNET_PYTHON names no Python that "
                "has it (make test-paddle3 sets it)")


def _reports(python, graph, pir=False):
    env = dict(os.environ, FLAGS_enable_pir_api="1" if pir else "0", GLOG_minloglevel="2",
               PYTHONPATH=os.pathsep.join([ROOT, os.path.join(ROOT, "tests", "consistency"),
                                           os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run([python, WORKER, graph], capture_output=True, text=True, timeout=600,
                       env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    (line,) = [x for x in r.stdout.splitlines() if x.startswith("JSON ")]
    return {model: {policy: _report(graph, decisions) for policy, decisions in by.items()}
            for model, by in json.loads(line[5:]).items()}


def _report(graph, decisions):
    """The worker's decisions as the CastReport they came from (JSON lists back to tuples)."""
    return CastReport(graph, tuple(
        OpDecision(**{k: tuple(v) if isinstance(v, list) else v for k, v in d.items()})
        for d in decisions))


@pytest.fixture(scope="module")
def graphs():
    out = {"mxnet": _reports(_mxnet_python(), "mxnet"),
           "legacy": _reports(sys.executable, "paddle")}
    if PADDLE3:
        out["pir"] = _reports(sys.executable, "paddle", pir=True)
    return out


def test_one_policy_three_graphs(graphs):
    if not PADDLE3:
        pytest.skip("PIR is Paddle 3's: on Paddle 2.6 this compares MXNet and the legacy IR "
                    "only (tests/consistency does that too)")
    checked = 0
    for model, shared in SHARED.items():
        for policy, mx in graphs["mxnet"][model].items():
            legacy, pir = graphs["legacy"][model][policy], graphs["pir"][model][policy]
            where = f"{model} under {policy}"
            if kernel_differences(legacy, pir):  # PIR's oneDNN conv2d is unusable in 3.3.1
                assert policy_disagreements(legacy, pir) == [], where
            else:  # one Paddle model, two IRs
                assert pir.precisions() == legacy.precisions(), where
            both = set(mx.precisions()) & set(pir.precisions())
            assert shared <= both, where
            assert policy_disagreements(mx, pir) == [], where
            checked += len(both)
    assert checked >= 3 * sum(map(len, SHARED.values()))


def test_mxnet_and_the_legacy_ir_agree(graphs):
    for model, shared in SHARED.items():
        for policy, mx in graphs["mxnet"][model].items():
            legacy = graphs["legacy"][model][policy]
            assert shared <= set(mx.precisions()) & set(legacy.precisions()), (model, policy)
            assert policy_disagreements(mx, legacy) == [], (model, policy)
