"""decorate(level=, dtype=, policy=): an explicit level or dtype applies over the policy,
as auto_cast's do; left out, the policy's own (or the native's defaults without one)."""
import paddle

from amp_adapters import Policy
from paddle_amp import dygraph as amp
from paddle_amp.dygraph.decorator import param_dtypes


def _model():
    m = paddle.nn.Linear(8, 8)
    return m, paddle.optimizer.SGD(parameters=m.parameters())


def test_an_explicit_o2_level_applies_over_an_o1_policy_as_in_auto_cast():
    pol = Policy.preset("O1", dtype="bfloat16")
    m, opt = _model()
    amp.decorate(m, opt, level="O2", policy=pol)
    assert param_dtypes(m) is not None  # decorated at O2
    with amp.auto_cast(level="O2", policy=pol) as region:
        assert region.policy.level == "O2"


def test_without_level_the_policys_own_level_and_without_either_the_natives_o1():
    m, opt = _model()
    amp.decorate(m, opt, policy=Policy.preset("O1", dtype="bfloat16"))
    assert param_dtypes(m) is None and m.weight.dtype == paddle.float32
    m, opt = _model()
    amp.decorate(m, opt)
    assert param_dtypes(m) is None and m.weight.dtype == paddle.float32


def test_an_explicit_dtype_applies_over_the_policy():
    m, opt = _model()
    amp.decorate(m, opt, level="O2", dtype="float16",
                 policy=Policy.preset("O2", dtype="bfloat16", emulate=True))
    plan = param_dtypes(m)
    assert plan is not None
    assert set(plan.dtypes.values()) <= {"float16", "float32"}
    assert "float16" in set(plan.dtypes.values()) or m.weight.dtype == paddle.float32
