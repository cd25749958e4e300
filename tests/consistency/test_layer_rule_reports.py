"""A layer rule by path in the cast reports of the three runtimes: the same policy, naming the
third of four Linear/Dense layers by its path (``2``, as the doctor writes it), keeps that
layer's GEMM float32 in Gluon, a Paddle program built from Layers and Paddle's eager mode,
each report naming the rule that decided it (``OpDecision.layer``), and lowers the others to
bfloat16 (a real kernel where the device's truth has one, emulated elsewhere)."""
import importlib.util
from pathlib import Path

import mxnet as mx
import paddle
import pytest

import mxnet_amp
import paddle_amp
from amp_adapters import LayerLists, Policy
from paddle_amp import dygraph

_spec = importlib.util.spec_from_file_location(
    "doctor_planted", Path(__file__).resolve().parents[1] / "doctor_planted.py")
P = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(P)

KIND = "layer_precision"  # four layers D -> D -> D -> D -> 1, a norm after the third
GEMMS = {"mxnet": "linear", "paddle": "matmul"}  # Dense is one op; Linear's GEMM a matmul


def _gemms(report, framework):
    return [(d.precision, d.layer) for d in report.decisions
            if d.canonical == GEMMS[framework]]


def _three(policy):
    """{runtime: [(precision, deciding layer rule)] of its four GEMMs, in order}."""
    net, _ = P.mxnet_layered(KIND, named=False)
    x = P.layered_arrays(KIND)[0]
    net(mx.nd.array(x))  # traced
    gluon = mxnet_amp.cast_report(net, policy=policy)
    paddle.enable_static()
    try:
        with paddle.static.scope_guard(paddle.static.Scope()):
            main, _, _, _ = P.paddle_layered(KIND, policy, layers=True)
            static = paddle_amp.cast_report(main)
    finally:
        paddle.disable_static()
    model, _ = P.paddle_dygraph_layered(KIND)
    eager = dygraph.cast_report(model, paddle.to_tensor(x), policy=policy)
    return {"gluon": _gemms(gluon, "mxnet"), "static": _gemms(static, "paddle"),
            "dygraph": _gemms(eager, "paddle")}


@pytest.mark.parametrize("preset", ["O1-bf16"])
def test_a_layer_rule_by_path_decides_the_same_gemm_in_the_three_runtimes(preset):
    policy = Policy.preset(preset, emulate=True).replace(layers=LayerLists(fp32={"2"}))
    low = policy.dtype
    want = [(low, None), (low, None), ("float32", "2"), (low, None)]
    got = _three(policy)
    assert got == {"gluon": want, "static": want, "dygraph": want}, got
