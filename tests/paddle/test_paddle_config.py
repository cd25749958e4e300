"""paddle_amp.config: decorate's native arguments -> Policy, without a program or optimizer."""
import pytest

from amp_adapters import AmpConfigError, DynamicLossScale, Policy, StaticLossScale
from paddle_amp import AutoMixedPrecisionLists
from paddle_amp.config import NEW_DEFAULTS, OLD_DEFAULTS, resolve_decorate


def test_each_overload_has_its_native_loss_scale_defaults():
    new, old = resolve_decorate(), resolve_decorate(use_pure_fp16=False)
    assert new.policy.loss_scale == DynamicLossScale.from_paddle(**NEW_DEFAULTS)
    assert old.policy.loss_scale == DynamicLossScale.from_paddle(**OLD_DEFAULTS)
    assert new.policy.loss_scale.scale == 2.0**16 and old.policy.loss_scale.scale == 2.0**15


@pytest.mark.parametrize("kwargs, level, dtype, guard", [
    (dict(use_pure_fp16=True), "O2", "float16", True),
    (dict(use_bf16=True), "O1", "bfloat16", False),
    (dict(level="o2", dtype="bf16", use_amp_guard=True), "O2", "bfloat16", True),
    (dict(level="OD"), "OD", "float16", False),
])
def test_level_dtype_and_guard_from_either_overload(kwargs, level, dtype, guard):
    config = resolve_decorate(**kwargs)
    assert (config.policy.level, config.policy.dtype, config.use_guard) == (level, dtype, guard)


def test_static_scaling_and_master_grad_only_at_o2():
    config = resolve_decorate(use_dynamic_loss_scaling=False, init_loss_scaling=8.0,
                              master_grad=True)
    assert config.policy.loss_scale == StaticLossScale(scale=8.0)
    assert config.master_grad is False
    assert resolve_decorate(level="O2", master_grad=True).master_grad is True


def test_an_explicit_policy_wins_and_takes_custom_lists_on_top():
    assert resolve_decorate(policy="O1", level="O2").policy == Policy.preset("O1")
    lists = AutoMixedPrecisionLists(custom_white_list={"softmax"})
    assert resolve_decorate(lists, policy="O1").policy.paddle_ops.lower == {"softmax"}
    blacks = AutoMixedPrecisionLists(custom_black_varnames={"x"})
    assert resolve_decorate(blacks, policy="O1").black_varnames == frozenset({"x"})


@pytest.mark.parametrize("kwargs, match", [
    (dict(level=1024.0), "looks like the old positional init_loss_scaling"),
    (dict(master_grad=1), "master_grad must be true or false"),
    (dict(use_dynamic_loss_scaling="false"), "use_dynamic_loss_scaling must be true or false"),
    (dict(use_amp_guard=0), "use_amp_guard must be true or false"),
    (dict(use_pure_fp16="yes"), "use_pure_fp16 must be true or false"),
    (dict(use_fp16_guard=1), "use_fp16_guard must be true or false"),
    (dict(use_bf16="true"), "use_bf16 must be true or false"),
    (dict(emulate="false"), "emulate must be true or false"),
    (dict(incr_ratio=float("inf")), "incr_ratio must be a finite number"),
])
def test_bad_arguments_name_themselves(kwargs, match):
    with pytest.raises(TypeError, match=match):
        resolve_decorate(**kwargs)


@pytest.mark.parametrize("kwargs, name", [(dict(use_pure_bf16="false"), "use_pure_bf16"),
                                          (dict(use_bf16_guard=1), "use_bf16_guard")])
def test_decorate_bf16_flags_are_bools(static, kwargs, name):
    import paddle
    from paddle_amp.bf16 import decorate_bf16
    with pytest.raises(TypeError, match=f"{name} must be true or false"):
        decorate_bf16(paddle.optimizer.SGD(0.1), **kwargs)
