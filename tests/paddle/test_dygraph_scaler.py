"""paddle_amp.dygraph.GradScaler: the core state machine's moves, a true skip, the guard, and
state dicts a native paddle.amp.GradScaler reads and writes."""
import math

import numpy as np
import paddle
import pytest
from hypothesis import given, settings, strategies as st

from amp_adapters import DynamicLossScale, Policy
from amp_adapters.rules.errors import AmpConfigError, OverflowGuardError
from amp_adapters.rules.loss_scale import LossScaleState, step
from paddle_amp import dygraph as amp


def _model(seed=0):
    paddle.seed(seed)
    return paddle.nn.Sequential(paddle.nn.Linear(4, 8), paddle.nn.ReLU(), paddle.nn.Linear(8, 1))


def _one_step(net, opt, scaler, overflow: bool):
    x = paddle.ones([2, 4])
    with amp.auto_cast(dtype="float16", emulate=True):
        loss = net(x).mean()
    if overflow:
        loss = loss * float("inf")
    scaled = scaler.scale(loss)
    scaled.backward()
    scaler.minimize(opt, scaled)
    opt.clear_grad()


@settings(max_examples=20, deadline=None)
@given(found=st.lists(st.booleans(), min_size=1, max_size=12),
       incr=st.integers(1, 3), decr=st.integers(1, 3))
def test_moves_equal_the_core_state_machine(found, incr, decr):
    net = _model()
    opt = paddle.optimizer.SGD(0.01, parameters=net.parameters())
    # scale 1: 12 growths stay within float16 for these gradients (emulated fp16 overflows
    # for real, and the test drives overflow only through ``found``)
    scaler = amp.GradScaler(init_loss_scaling=1.0, incr_every_n_steps=incr,
                            decr_every_n_nan_or_inf=decr)
    config, state = scaler.loss_scale()
    assert (config.min_scale, config.max_scale) == (0.0, math.inf)  # the native's: no bounds
    for f in found:
        _one_step(net, opt, scaler, f)
        state = step(config, state, f)
        assert scaler.loss_scale()[1] == state
    sd = scaler.state_dict()
    assert (float(sd["scale"][0]), sd["incr_count"], sd["decr_count"]) == (
        state.scale, state.good_steps, state.bad_steps)


@pytest.mark.parametrize("make_opt", [
    lambda ps: paddle.optimizer.SGD(0.1, parameters=ps),  # the native does not skip SGD
    lambda ps: paddle.optimizer.Momentum(0.1, parameters=ps),
    lambda ps: paddle.optimizer.Adam(0.1, parameters=ps),
    lambda ps: paddle.optimizer.AdamW(0.1, parameters=ps, weight_decay=0.1),
])
def test_an_overflow_step_is_skipped_for_real(make_opt):
    net = _model()
    opt = make_opt(net.parameters())
    scaler = amp.GradScaler(init_loss_scaling=256.0)
    _one_step(net, opt, scaler, False)  # optimizer state exists
    params = [p.numpy().copy() for p in net.parameters()]
    state = {k: v.numpy().copy() for k, v in opt.state_dict().items() if hasattr(v, "numpy")}
    _one_step(net, opt, scaler, True)
    assert all(np.array_equal(a, p.numpy()) for a, p in zip(params, net.parameters()))
    after = {k: v.numpy() for k, v in opt.state_dict().items() if hasattr(v, "numpy")}
    assert after.keys() == state.keys()
    assert all(np.array_equal(state[k], after[k]) for k in state)
    assert scaler.loss_scale()[1].skipped_steps == 1 and scaler.state_dict()["scale"][0] == 128


@pytest.mark.parametrize("unscale_first", [False, True], ids=["step", "unscale_-then-step"])
def test_two_optimizers_each_skip_on_their_own_gradients_and_the_scale_backs_off(
        unscale_first):
    """Only ``a``'s gradients overflow: ``a`` is not stepped, ``b`` is, and the overflow
    reaches ``update()`` whichever optimizer was stepped last."""
    paddle.seed(0)
    a, b = paddle.nn.Linear(4, 4), paddle.nn.Linear(4, 4)
    oa = paddle.optimizer.SGD(0.1, parameters=a.parameters())
    ob = paddle.optimizer.SGD(0.1, parameters=b.parameters())
    scaler = amp.GradScaler(init_loss_scaling=8.0)
    before_a = [p.numpy().copy() for p in a.parameters()]
    before_b = [p.numpy().copy() for p in b.parameters()]
    x = paddle.ones([2, 4])
    loss = a(x).mean() * float("inf") + b(x).mean()
    scaler.scale(loss).backward()
    if unscale_first:
        scaler.unscale_(oa)
        scaler.unscale_(ob)
    scaler.step(oa)
    scaler.step(ob)
    scaler.update()
    assert all(np.array_equal(p.numpy(), q) for p, q in zip(a.parameters(), before_a))
    assert not all(np.array_equal(p.numpy(), q) for p, q in zip(b.parameters(), before_b))
    state = scaler.loss_scale()[1]
    assert (state.scale, state.skipped_steps) == (4.0, 1)


def test_endless_overflows_raise_the_guard_naming_the_parameters():
    net = _model()
    opt = paddle.optimizer.SGD(0.1, parameters=net.parameters())
    policy = Policy.preset("O1", loss_scale=DynamicLossScale(max_consecutive_skips=3))
    scaler = amp.GradScaler(policy=policy)
    _one_step(net, opt, scaler, True)
    _one_step(net, opt, scaler, True)
    with pytest.raises(OverflowGuardError, match=net[0].weight.name):
        _one_step(net, opt, scaler, True)


def test_step_update_and_unscale_stages_as_the_native():
    net = _model()
    opt = paddle.optimizer.SGD(0.1, parameters=net.parameters())
    scaler = amp.GradScaler(init_loss_scaling=8.0, incr_every_n_steps=1)
    with amp.auto_cast():  # float16 (a bfloat16 region turns a dynamic scaler off)
        loss = net(paddle.ones([2, 4])).mean()
    scaler.scale(loss).backward()
    scaler.unscale_(opt)
    with pytest.raises(RuntimeError, match="already been called"):
        scaler.unscale_(opt)
    scaler.step(opt)
    with pytest.raises(RuntimeError, match="already been called"):
        scaler.step(opt)
    scaler.update()
    assert scaler.state_dict()["scale"][0] == 16.0


def _native_scaler():
    """A real paddle.amp.GradScaler as it is where the native enables itself (a GPU): on a
    CPU it turns itself off in __init__, and its state_dict() is then empty. Only that flag
    is set back; its own load_state_dict fills every field."""
    native = paddle.amp.GradScaler(init_loss_scaling=2.0**10)
    native._enable = True
    return native


def test_a_native_scaler_loads_ours_and_we_load_its():
    net = _model()
    opt = paddle.optimizer.SGD(0.1, parameters=net.parameters())
    ours = amp.GradScaler(init_loss_scaling=512.0, incr_every_n_steps=5,
                          decr_every_n_nan_or_inf=2, incr_ratio=4.0, decr_ratio=0.25)
    for f in (False, True, False, False):
        _one_step(net, opt, ours, f)
    saved = ours.state_dict()
    native = _native_scaler()
    native.load_state_dict(saved)
    theirs = native.state_dict()
    for key in theirs:
        assert np.array_equal(theirs[key], saved[key]), key
    back = amp.GradScaler()
    back.load_state_dict(theirs)
    config, state = back.loss_scale()
    assert state == LossScaleState(scale=float(saved["scale"][0]),
                                   good_steps=saved["incr_count"],
                                   bad_steps=saved["decr_count"])
    assert (config.growth_factor, config.backoff_factor, config.growth_interval,
            config.hysteresis) == (4.0, 0.25, 5, 2)
    again = amp.GradScaler()
    again.load_state_dict(saved)  # ours, with the counters a native scaler has no key for
    assert again.loss_scale() == ours.loss_scale()


@pytest.mark.parametrize("change, words", [
    (lambda d: d.pop("incr_count"), "missing key 'incr_count'"),
    (lambda d: d.update(decr_count=-1), "decr_count"),
    (lambda d: d.update(scale=np.array([np.inf], np.float32)), "finite"),
    (lambda d: d.update(incr_ratio=0.5), "incr_ratio"),
    (lambda d: d.update(incr_count=True), "incr_count"),
])
def test_a_bad_state_dict_names_the_key_and_changes_nothing(change, words):
    scaler = amp.GradScaler(init_loss_scaling=64.0)
    before = scaler.loss_scale()
    d = scaler.state_dict()
    change(d)
    with pytest.raises(AmpConfigError, match=words):
        scaler.load_state_dict(d)
    assert scaler.loss_scale() == before


def test_setters_check_like_the_native_and_keep_the_state():
    scaler = amp.AmpScaler()
    assert scaler.get_init_loss_scaling() == 2.0**15 and scaler.get_incr_every_n_steps() == 1000
    with pytest.raises(AmpConfigError, match="incr_ratio"):
        scaler.set_incr_ratio(1.0)
    scaler.set_incr_every_n_steps(10)
    scaler.set_init_loss_scaling(4.0)
    assert scaler.get_incr_every_n_steps() == 10 and scaler.state_dict()["scale"][0] == 4.0
    assert amp.GradScaler(enable=False).state_dict() == {}
