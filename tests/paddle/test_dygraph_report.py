"""paddle_amp.dygraph.cast_report: the CastReport of the ops a layer's forward runs under a
policy, in call order, with how each ran on this CPU."""
import numpy as np
import paddle
import pytest

from amp_adapters import CastReport
from amp_adapters.rules.isa import bf16_class, machine
from paddle_amp import dygraph as amp


def _mlp():
    paddle.seed(0)
    return paddle.nn.Sequential(paddle.nn.Linear(16, 32), paddle.nn.ReLU(),
                                paddle.nn.Linear(32, 4))


def test_a_report_lists_each_call_with_how_it_ran_here():
    x = paddle.to_tensor(np.ones((8, 16), np.float32))
    report = amp.cast_report(_mlp(), x, policy="O1-bf16")
    assert isinstance(report, CastReport) and report.framework == "paddle"
    assert [d.op for d in report.decisions] == ["matmul_v2", "matmul_v2"]
    want = "kernel" if bf16_class(machine()) != "none" else "fell back"
    assert report.executions() == {"matmul": frozenset({want})}
    assert "matmul_v2" in str(report)


def test_a_report_takes_auto_cast_arguments_and_checks_them():
    x = paddle.to_tensor(np.ones((8, 16), np.float32))
    report = amp.cast_report(_mlp(), x, dtype="float16", emulate=True,
                             custom_black_list=["matmul"])
    assert {d.precision for d in report.decisions} == {"float32"}
    report = amp.cast_report(_mlp(), x, dtype="float16", emulate=True)
    assert report.precisions() == {"matmul": frozenset({"float16"})}
    with pytest.raises(ValueError, match="level"):
        amp.cast_report(_mlp(), x, level="O9")


@pytest.mark.skipif(bf16_class(machine()) == "none",
                    reason="the device truth (isa.bf16_class) says this CPU class has no "
                           "oneDNN bf16 kernel (no AVX-512 in use)")
def test_a_broadcast_gemm_is_refused_for_training_only():
    from paddle_amp.dygraph import kernels
    seq = paddle.to_tensor(np.ones((4, 8, 16), np.float32))
    train = amp.cast_report(_mlp(), seq, dtype="bfloat16")
    infer = amp.cast_report(_mlp(), seq, dtype="bfloat16", training=False)
    assert infer.executions() == {"matmul": frozenset({"kernel"})}
    slow = "matmul_v2" in kernels.slow_broadcast_grads("bfloat16")
    assert train.executions() == {"matmul": frozenset({"fell back" if slow else "kernel"})}
    with paddle.no_grad(), amp.auto_cast(dtype="bfloat16") as region:  # an eval forward
        _mlp()(seq)
    assert region.ran["matmul_v2"].execution == "kernel"


def test_a_report_holds_the_ops_of_a_region_the_model_opens_itself():
    """A model whose ``forward`` opens its own region (part of it in mixed precision): the
    report holds those ops, as that region decides them (a layer rule by its path from the
    model: ``body.1``), under any report policy. (Before: the report logged only its own
    region's decisions, and held no op.)"""
    from amp_adapters import LayerLists, Policy
    inner = Policy.preset("O1", emulate=True).replace(paddle_layers=LayerLists(fp32={"body.1"}))

    class Model(paddle.nn.Layer):
        def __init__(self):
            super().__init__()
            self.body = paddle.nn.LayerList([paddle.nn.Linear(8, 8), paddle.nn.Linear(8, 8)])

        def forward(self, x):
            with amp.auto_cast(policy=inner):
                for layer in self.body:
                    x = layer(x)
            return x

    x = paddle.to_tensor(np.ones((4, 8), np.float32))
    for policy in (None, "O1-bf16"):
        report = amp.cast_report(Model(), x, policy=policy)
        assert [(d.precision, d.layer) for d in report.decisions] == \
            [("float16", None), ("float32", "body.1")]
