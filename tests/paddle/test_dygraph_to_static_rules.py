"""A ``to_static`` program under a policy's layer rules and under ``policy="auto"`` gets eager
mode's decisions, in both IRs. A legacy program (Paddle 2.6.2, or 3.x with
FLAGS_enable_pir_api=0) has no Layer calls to follow: its ops are named by the Layer owning
the parameters they read, and planned per shape class from its vars' shapes (a batch it
leaves open, -1, as the static runtime takes it). Before, a legacy program's GEMMs had no
path (layer rules missed them) and no shape class (under ``auto``: float32, "not measured
here").

The speed book is seeded as data in the test's own cache (``own_speed_cache``) and
measuring is forbidden, so no assertion depends on this machine's speed."""
import numpy as np
import paddle
import pytest

from amp_adapters import LayerLists, Policy
from amp_adapters.rules.device import Cost
from amp_adapters.rules.isa import bf16_class, machine
from amp_adapters.services import speed_source
from amp_adapters.services.speedbook import ProfileFile, cache_dir, machine_id, write_profile
from paddle_amp import dygraph as amp


class _Block(paddle.nn.Layer):
    def __init__(self, width):
        super().__init__()
        self.ffn, self.out = paddle.nn.Linear(width, width), paddle.nn.Linear(width, width)

    def forward(self, x):
        return self.out(paddle.nn.functional.relu(self.ffn(x)))


def _model(width=8):
    paddle.seed(0)
    return paddle.nn.Sequential(_Block(width), _Block(width))


def _x(width=8):
    return paddle.to_tensor(np.random.default_rng(0).standard_normal((4, width)).astype("f4"))


def _decisions(model, x, policy):
    return [(d.op, d.precision, d.layer, d.reason)
            for d in amp.cast_report(model, x, policy=policy).decisions if d.op == "matmul_v2"]


def test_a_layer_rule_keeps_that_linear_float32_in_a_program_as_in_eager_mode():
    policy = Policy.preset("O1", emulate=True).replace(paddle_layers=LayerLists(fp32={"1.ffn"}))
    x = _x()
    model = _model()
    eager = _decisions(model, x, policy)
    assert [p for _, p, _, _ in eager] == ["float16", "float16", "float32", "float16"]
    with amp.auto_cast(policy=policy):
        want = model(x).numpy()
    static = paddle.jit.to_static(model, full_graph=True)
    assert _decisions(static, x, policy) == eager
    with amp.auto_cast(policy=policy):  # a training region around the program's call
        np.testing.assert_array_equal(static(x).numpy(), want)


FAST, SLOW = Cost(0.5, 0.01, 0.6, 0.01), Cost(2.5, 0.02, 2.4, 0.02)


class _Two(paddle.nn.Layer):
    """Two GEMMs of different shape classes: the first measured faster, the second slower."""

    def __init__(self):
        super().__init__()
        self.a, self.b = paddle.nn.Linear(16, 32), paddle.nn.Linear(32, 8)

    def forward(self, x):
        return self.b(paddle.nn.functional.relu(self.a(x)))


@pytest.mark.usefixtures("own_speed_cache")
@pytest.mark.skipif(bf16_class(machine()) == "none", reason="the device truth (isa.bf16_class)"
                    " says this CPU class has no oneDNN bf16 kernel: auto lowers nothing")
@pytest.mark.parametrize("spec", [False, True], ids=["batch known", "batch left open"])
def test_under_auto_a_programs_gemm_gets_eager_modes_decision_for_its_shape_class(
        monkeypatch, spec):
    """The batch a program leaves open (-1) is the batch the book measures an unknown one
    at, as for the static runtime (``UNKNOWN_DIM``): the eager model is run at that batch."""
    from amp_adapters.rules.device import UNKNOWN_DIM
    batch = UNKNOWN_DIM if spec else 4
    m = machine()
    write_profile(cache_dir() / f"profile-{machine_id(m)}.json", ProfileFile(m, {
        ("paddle-dygraph", paddle.__version__, "bfloat16+train", "matmul_v2", key): cost
        for key, cost in ((f"{batch}x16;16x32>2", FAST), (f"{batch}x32;32x8>2", SLOW))}))
    monkeypatch.setattr(speed_source, "measure", lambda source: lambda *a: pytest.fail(
        f"measured {a} though the book had the answer"))
    paddle.seed(0)
    model = _Two()
    x = paddle.to_tensor(np.random.default_rng(0).standard_normal((batch, 16)).astype("f4"))
    eager = _decisions(model, x, "auto")
    assert [p for _, p, _, _ in eager] == ["bfloat16", "float32"]
    with amp.auto_cast(policy="auto"):
        want = model(x).numpy()
    static = paddle.jit.to_static(model, full_graph=True, input_spec=[
        paddle.static.InputSpec([None, 16], "float32")] if spec else None)
    assert _decisions(static, x, "auto") == eager
    with amp.auto_cast(policy="auto"):
        np.testing.assert_array_equal(static(x).numpy(), want)


def _rule(path):
    return Policy.preset("O1", emulate=True).replace(paddle_layers=LayerLists(fp32={path}))


class _Opens(paddle.nn.Layer):
    """A model whose own forward opens the region with the layer rule."""

    def __init__(self, policy):
        super().__init__()
        self.body, self.policy = _model(), policy

    def forward(self, x):
        with amp.auto_cast(policy=self.policy):
            return self.body(x)


@pytest.mark.parametrize("path", ["1.ffn", "body.1.ffn"])
def test_a_region_with_layer_rules_in_a_traced_forward_names_ops_as_eager_mode(path):
    """Eager mode (which warns: open the region around the model's call) counts the paths
    from the first Layer called in the region (``1.ffn``, not ``body.1.ffn``); a program
    does the same in both IRs."""
    x = _x()
    model = _Opens(_rule(path))
    want = model(x).numpy()
    np.testing.assert_array_equal(paddle.jit.to_static(model, full_graph=True)(x).numpy(), want)
