"""Issue 22 in Paddle (both IRs, public API only): loss-scale counters that contradict the
program's config, and an edited kind, are refused by ``load_state_dict`` naming the field,
with the scope's state unchanged (the rule is the core's ``check_state``)."""
import copy

import paddle
import pytest

import paddle_amp
from amp_adapters import AmpConfigError, DynamicLossScale, Policy
from paddle_helpers import batch, mlp


@pytest.mark.parametrize("field, value, needle", [
    ("bad_steps", 2, "must be < hysteresis"),
    ("good_steps", 3, "must be < growth_interval"),
    ("consecutive_skips", 2, "more skips in a row"),
    ("skipped_steps", 9, "more skipped steps than steps"),
])
def test_contradicting_counters_are_refused(static, field, value, needle):
    _, _, loss = mlp()
    running = DynamicLossScale(scale=8.0, hysteresis=2, growth_interval=3)
    opt = paddle_amp.decorate(paddle.optimizer.SGD(0.1), policy=Policy(loss_scale=running))
    opt.minimize(loss)
    static.exe.run(static.startup)
    static.run(batch(0, overflow=True))
    before = opt.state_dict()
    d = copy.deepcopy(before)
    d["state"].update(total_steps=5, skipped_steps=1, consecutive_skips=1)
    d["state"][field] = value
    with pytest.raises(AmpConfigError, match=rf"\['{field}'\] = {value}: {needle}"):
        opt.load_state_dict(d)
    assert opt.state_dict() == before
    edited = {**copy.deepcopy(before), "kind": "static"}
    with pytest.raises(AmpConfigError, match="kind"):
        opt.load_state_dict(edited)
    assert opt.state_dict() == before


@pytest.mark.parametrize("value", ["false", 1, None])
def test_decorate_emulate_must_be_a_bool(static, value):
    with pytest.raises(TypeError, match="emulate must be true or false"):
        paddle_amp.decorate(paddle.optimizer.SGD(0.1), emulate=value)
