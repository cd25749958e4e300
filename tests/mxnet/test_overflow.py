"""Overflow steps are skipped for real, on every device, and the scale moves with no lag."""
import numpy as np
import pytest
import mxnet as mx
from mxnet import gluon

import mxnet_amp as amp
from amp_adapters import DynamicLossScale, OverflowGuardError
from mxnet_testutil import backward, batch, mlp

CTXS = [mx.cpu(0), mx.cpu(1)]


def _two_device_step(net, trainer, step, inject=None):
    """Backward on both devices; ``inject(params)`` may then poison gradients."""
    for ctx in CTXS:
        x, y = batch(step, ctx)
        backward(net, trainer, x, y)
    if inject:
        inject(list(net.collect_params().values()))


def _snapshot(trainer):
    """Every parameter copy on every device and the optimizer state, as numpy."""
    params = {p.name: [d.asnumpy() for d in p.list_data()] for p in trainer._params}
    updaters = [trainer._kvstore._updater] if trainer._update_on_kvstore else trainer._updaters

    def arrays(s):
        if s is None:
            return []
        if isinstance(s, (list, tuple)):
            return [a for x in s for a in arrays(x)]
        return [s.asnumpy()]
    states = [{k: arrays(v) for k, v in u.states.items()} for u in updaters]
    opt = trainer._optimizer
    return params, states, (dict(opt._index_update_count), opt.num_update)


def _assert_identical(a, b):
    (pa, sa, ca), (pb, sb, cb) = a, b
    assert pa.keys() == pb.keys() and ca == cb
    for k in pa:
        for x, y in zip(pa[k], pb[k]):
            assert x.tobytes() == y.tobytes(), k
    for ua, ub in zip(sa, sb):
        assert ua.keys() == ub.keys()
        for k in ua:
            for x, y in zip(ua[k], ub[k]):
                assert x.tobytes() == y.tobytes(), k


def _inf_on_second_device(params):
    params[0].list_grad()[1][0, 0] = np.inf


@pytest.mark.parametrize("optimizer,opt_args", [
    ("sgd", {"learning_rate": 0.1, "momentum": 0.9}),
    ("adam", {"learning_rate": 0.01}),
])
@pytest.mark.parametrize("kvstore,update_on_kvstore", [
    ("device", False), (None, None), ("device", True)])
def test_overflow_on_second_device_skips_step(optimizer, opt_args, kvstore, update_on_kvstore):
    net = mlp(ctx=CTXS)
    trainer = gluon.Trainer(net.collect_params(), optimizer, opt_args, kvstore=kvstore,
                            update_on_kvstore=update_on_kvstore)
    amp.init_trainer(trainer, DynamicLossScale(scale=2.0**10))
    _two_device_step(net, trainer, 0)
    trainer.step(8)  # a clean step first, so momentum / Adam moments exist
    assert not amp.last_step_skipped(trainer)
    assert bool(trainer._update_on_kvstore) == bool(update_on_kvstore)

    _two_device_step(net, trainer, 1, _inf_on_second_device)
    before = _snapshot(trainer)
    trainer.step(8)
    _assert_identical(before, _snapshot(trainer))
    state = amp.loss_scale(trainer)
    assert amp.last_step_skipped(trainer)
    assert (state.scale, state.skipped_steps, state.total_steps) == (2.0**9, 1, 2)

    # the backed-off scale is used by the very next step
    x, y = batch(2, CTXS[0])
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    with mx.autograd.record():
        loss = loss_fn(net(x), y)
        with amp.scale_loss(loss, trainer) as scaled:
            assert np.array_equal(scaled.asnumpy(), loss.asnumpy() * 2.0**9)
            mx.autograd.backward(scaled)
    x, y = batch(2, CTXS[1])
    backward(net, trainer, x, y)
    trainer.step(8)
    assert trainer._optimizer.rescale_grad == 1.0 / (2.0**9 * 8)
    assert not amp.last_step_skipped(trainer)
    for p in net.collect_params().values():
        for d in p.list_data():
            assert np.isfinite(d.asnumpy()).all()
    assert not np.array_equal(_snapshot(trainer)[0][trainer._params[0].name][0],
                              before[0][trainer._params[0].name][0])


def test_nan_in_any_parameter_on_any_device_is_found():
    net = mlp(ctx=CTXS)
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1}, kvstore=None)
    amp.init_trainer(trainer)
    for i, p in enumerate(trainer._params):
        for dev in range(len(CTXS)):
            _two_device_step(net, trainer, i)
            p.list_grad()[dev][:] = np.nan
            trainer.step(8)
            assert amp.last_step_skipped(trainer), (p.name, dev)
    assert amp.loss_scale(trainer).skipped_steps == 2 * len(trainer._params)


def test_guard_names_the_parameters_after_consecutive_skips():
    net = mlp()
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1})
    amp.init_trainer(trainer, DynamicLossScale(max_consecutive_skips=3))
    bias = trainer._params[1]
    for step in range(3):
        x, y = batch(step)
        backward(net, trainer, x, y)
        bias.grad()[0] = np.inf
        if step < 2:
            trainer.step(4)
        else:
            with pytest.raises(OverflowGuardError, match=bias.name) as err:
                trainer.step(4)
    assert err.value.param_names == [bias.name]


def test_unscale_once_per_step_for_clipping():
    net = mlp()
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1})
    amp.init_trainer(trainer, DynamicLossScale(scale=2.0**8))
    x, y = batch(0)
    backward(net, trainer, x, y, scaled=False)
    reference = [p.grad().asnumpy() for p in trainer._params]
    for p in trainer._params:
        p.zero_grad()
    backward(net, trainer, x, y)
    amp.unscale(trainer)
    for ref, p in zip(reference, trainer._params):
        np.testing.assert_allclose(p.grad().asnumpy(), ref, rtol=1e-5, atol=1e-7)
    with pytest.raises(RuntimeError, match="at most once per step"):
        amp.unscale(trainer)
    gluon.utils.clip_global_norm([p.grad() for p in trainer._params], 1.0)
    trainer.step(4)
    assert trainer._optimizer.rescale_grad == 1.0 / 4  # already unscaled: not divided again
    backward(net, trainer, x, y)
    amp.unscale(trainer)  # allowed again in the next step


def test_check_has_no_false_positive_on_huge_finite_gradients():
    from mxnet_amp.overflow import FiniteCheck
    net = mlp(ctx=CTXS)
    params = list(net.collect_params().values())
    for p in params:
        for g in p.list_grad():
            g[:] = 3e38  # finite, and their sum would overflow float32
    check = FiniteCheck()
    assert check.nonfinite(params) == []
    params[-1].list_grad()[1][0] = -np.inf
    assert check.nonfinite(params) == [params[-1].name]


def test_allreduce_then_update_path_also_skips():
    net = mlp(ctx=CTXS)
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1, "momentum": 0.9},
                            update_on_kvstore=False)
    amp.init_trainer(trainer)
    _two_device_step(net, trainer, 0)
    trainer.step(8)
    _two_device_step(net, trainer, 1, _inf_on_second_device)
    before = _snapshot(trainer)
    trainer.allreduce_grads()
    trainer.update(8)
    _assert_identical(before, _snapshot(trainer))
    assert amp.last_step_skipped(trainer) and amp.loss_scale(trainer).scale == 2.0**15


# ----------------------------------------------------------------------------- step protocol

def test_stage_errors_name_the_stage():
    net = mlp()
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1})
    amp.init_trainer(trainer, DynamicLossScale(scale=2.0**8))
    from mxnet_amp.scaling import Stage
    state = trainer._amp_loss_scaler
    assert state.stage is Stage.READY
    with pytest.raises(RuntimeError, match="stage READY"):
        amp.unscale(trainer)
    x, y = batch(0)
    backward(net, trainer, x, y)
    assert state.stage is Stage.SCALED
    amp.unscale(trainer)
    with pytest.raises(RuntimeError, match="stage UNSCALED.*at most once per step"):
        amp.unscale(trainer)
    trainer.step(4)
    assert state.stage is Stage.STEPPED
    with pytest.raises(RuntimeError, match="stage STEPPED.*between backward"):
        amp.unscale(trainer)


def test_cached_found_inf_of_a_dropped_batch_does_not_leak():
    """allreduce_grads() caches this step's overflow answer; if the user drops the batch
    (no update()), the next step must check its own gradients."""
    net = mlp()
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1},
                            update_on_kvstore=False)
    amp.init_trainer(trainer, DynamicLossScale(scale=2.0**8))
    x, y = batch(0)
    backward(net, trainer, x, y)
    trainer.step(4)  # kvstore initialised
    backward(net, trainer, *batch(1))
    trainer._params[0].grad()[0] = np.inf
    trainer.allreduce_grads()  # caches found_inf = True ... and the batch is dropped
    backward(net, trainer, *batch(2))  # a clean batch
    before = _snapshot(trainer)
    trainer.allreduce_grads()
    trainer.update(4)
    assert not amp.last_step_skipped(trainer)
    assert amp.loss_scale(trainer).skipped_steps == 0
    name = trainer._params[0].name
    assert not np.array_equal(_snapshot(trainer)[0][name][0], before[0][name][0])


@pytest.mark.parametrize("make", [
    lambda: DynamicLossScale.from_mxnet(scale=2.0**-100),
    lambda: DynamicLossScale.from_torch(2.0**-100),
], ids=["from_mxnet", "from_torch"])
def test_no_floor_collapse_raises_the_guard_not_an_internal_error(make):
    """Interleaved overflows: the consecutive-skip counter resets on each clean step while
    the scale halves on each overflow; the guard stops at the denormal, naming settings."""
    net = mlp()
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1})
    amp.init_trainer(trainer, make())
    with pytest.raises(OverflowGuardError, match="collapsed") as err:
        for step in range(200):
            backward(net, trainer, *batch(step))
            if step % 2 == 0:
                trainer._params[1].grad()[0] = np.inf
            trainer.step(4)
    state = amp.loss_scale(trainer)
    assert state.consecutive_skips == 1 and state.scale < np.finfo(np.float32).tiny
    assert "min_scale=0" in str(err.value) and trainer._params[1].name in err.value.param_names


def test_skip_fraction_guard_and_core_config():
    from amp_adapters import LossScaleConfig
    net = mlp()
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1})
    amp.init_trainer(trainer, LossScaleConfig(max_consecutive_skips=None, max_skip_fraction=0.5,
                                              skip_window=4))
    assert amp.loss_scale(trainer).skip_window == 4
    with pytest.raises(OverflowGuardError, match="max_skip_fraction=0.5"):
        for step, f in enumerate([True, False, True, False, True, True, False, True]):
            backward(net, trainer, *batch(step))
            if f:
                trainer._params[0].grad()[0] = np.inf
            trainer.step(4)
    assert step == 7


@pytest.mark.parametrize("update_on_kvstore", [False, True])
def test_huge_scales_unscale_in_two_exact_parts(update_on_kvstore):
    """MXNet parses rescale_grad = 1/(scale * batch) as a normal float32 and fails below
    that range: a scale of 2**125 is unscaled as 2**-64 on the gradients and the rest
    through rescale_grad, and the update is the unscaled one, exactly."""
    w = gluon.Parameter("w", shape=(2,), init=mx.init.One())
    w.initialize(ctx=CTXS)
    trainer = gluon.Trainer([w], "sgd", {"learning_rate": 0.5},
                            update_on_kvstore=update_on_kvstore)
    amp.init_trainer(trainer, DynamicLossScale.from_torch(2.0**125, growth_interval=100))
    for step in range(2):
        for ctx in CTXS:
            with mx.autograd.record():
                loss = (w.data(ctx) * mx.nd.array([2.0**-3, 2.0**-4], ctx=ctx)).sum()
                with amp.scale_loss(loss, trainer) as scaled:
                    scaled.backward()
        trainer.step(8)  # rescale_grad would be 2**-128: subnormal
        assert not amp.last_step_skipped(trainer)
    expected = 1.0 - 2 * 0.5 * 2 * np.array([2.0**-3, 2.0**-4]) / 8  # two steps, two devices
    for d in w.list_data():
        assert d.asnumpy().tolist() == expected.tolist()
    assert amp.loss_scale(trainer).scale == 2.0**125
