"""O2 in Gluon: low-precision parameters (core-planned), float32 masters, true skips, resume.

On this CPU the GEMMs have no float16/bfloat16 kernel, so they compute in float32
on the low parameters cast up (EMULATED), and the master-weight update is the
EMULATED multi_precision path (float32 optimizer update, one cast back).
"""
import numpy as np
import mxnet as mx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mxnet import gluon, nd

import mxnet_amp as amp
from amp_adapters import AmpConfigError, DynamicLossScale, Policy
from mxnet_amp import masters as mx_masters
from mxnet_testutil import backward, batch, mlp

OPTIMIZERS = {"sgd": ("sgd", {"learning_rate": 0.1, "momentum": 0.9}),
              "adam": ("adam", {"learning_rate": 0.01})}


def _setup(preset, opt="sgd", loss_scale=None):
    if preset is not None:
        amp.init(policy=Policy.preset(preset, emulate=True))
    net = mlp()
    plan = amp.cast_params(net) if preset is not None else None
    trainer = gluon.Trainer(net.collect_params(), *OPTIMIZERS[opt])
    if preset is not None:
        amp.init_trainer(trainer, loss_scale)
    return net, trainer, plan


def _steps(net, trainer, steps, amp_on=True, start=0):
    losses = []
    for i in range(start, start + steps):
        x, y = batch(i % 3)
        loss = backward(net, trainer, x, y, scaled=amp_on)
        trainer.step(4)
        losses.append(float(loss.mean().asscalar()))
    return np.array(losses)


def _snapshot(net, trainer):
    """Every parameter, every master and every optimizer state array, as numpy copies."""
    out = {f"param/{i}": p.data().asnumpy().copy()
           for i, p in enumerate(net.collect_params().values())}
    for i, state in trainer._updaters[0].states.items():
        flat = state if isinstance(state, (list, tuple)) else [state]
        for j, s in enumerate(_flatten(flat)):
            out[f"state/{i}/{j}"] = s.asnumpy().copy()
    return out


def _flatten(xs):
    for x in xs:
        if isinstance(x, (list, tuple)):
            yield from _flatten(x)
        elif x is not None:
            yield x


@pytest.mark.parametrize("preset", ["O2", "O2-bf16"])
@pytest.mark.parametrize("opt", sorted(OPTIMIZERS))
def test_o2_trains_like_fp32(preset, opt):
    """O2 tracks fp32 on a tiny MLP for 30 steps.

    Tolerance: each Dense reads weights, inputs and outputs rounded once through
    the low dtype (relative error u = 2**-11 fp16, 2**-8 bf16), two layers deep,
    so a step's loss moves by a few u relative; the float32 masters keep the
    updates from compounding the rounding. We allow 40u relative (0.02 fp16,
    0.16 bf16) per step-loss, plus 1e-4 absolute. The scale starts at 2**8 so no
    step overflows (a skipped step is a different trajectory, not an error).
    """
    u = 2.0 ** -11 if preset == "O2" else 2.0 ** -8
    net, trainer, _ = _setup(None, opt)
    fp32 = _steps(net, trainer, 30, amp_on=False)
    net, trainer, plan = _setup(preset, opt, DynamicLossScale(scale=2.0 ** 8))
    low = _steps(net, trainer, 30)
    assert amp.loss_scale(trainer).skipped_steps == 0  # a skip would change the trajectory
    dtype = "float16" if preset == "O2" else "bfloat16"
    assert plan.low == set(net.collect_params()) and set(plan.dtypes.values()) == {dtype}
    assert all(str(p.data().dtype) != "float32" for p in net.collect_params().values())
    # the label says what runs: a float32 master update, and whether MXNet fuses it for this
    # dtype (its mp_*_update kernels take float16, not bfloat16, in 1.9.1)
    label = trainer._amp_master_update
    assert label.startswith("float32 master update") and dtype in label
    assert ("no fused mp_*_update kernel for bfloat16" in label) == (dtype == "bfloat16")
    np.testing.assert_allclose(low, fp32, rtol=40 * u, atol=1e-4)
    assert low[-3:].mean() < 0.8 * low[:3].mean()


def test_parameter_is_its_master_rounded_to_nearest():
    net, trainer, _ = _setup("O2")
    _steps(net, trainer, 4)
    masters = mx_masters.masters(trainer)
    assert set(masters) == set(net.collect_params())
    for name, master in masters.items():
        assert master.dtype == np.float32
        np.testing.assert_array_equal(net.collect_params()[name].data().asnumpy(),
                                      master.asnumpy().astype(np.float16))


@pytest.mark.parametrize("preset", ["O2", "O2-bf16"])
@pytest.mark.parametrize("opt", sorted(OPTIMIZERS))
def test_overflow_step_leaves_params_masters_and_state_bit_identical(opt, preset):
    """bf16 needs no loss scale, but a user may still check for overflow (bf16 grads too)."""
    net, trainer, _ = _setup(preset, opt, DynamicLossScale(scale=2.0 ** 8))
    _steps(net, trainer, 3)
    before = _snapshot(net, trainer)
    assert sum(k.startswith("state/") for k in before) >= 8  # masters + optimizer state
    x, y = batch(3)
    x[0, 0] = np.inf
    backward(net, trainer, x, y)
    trainer.step(4)
    assert amp.last_step_skipped(trainer)
    after = _snapshot(net, trainer)
    assert before.keys() == after.keys()
    for k in before:
        np.testing.assert_array_equal(after[k], before[k], err_msg=k)


def test_checkpoint_resume_is_exact(tmp_path):
    """Parameters + trainer.save_states (masters inside) + amp.state_dict after 4 steps,
    loaded into a fresh net and trainer: 4 more steps give what 8 straight steps give."""
    scale = DynamicLossScale(scale=2.0 ** 10, growth_interval=3)
    net, trainer, _ = _setup("O2", "adam", scale)
    straight = _steps(net, trainer, 8)
    final = _snapshot(net, trainer)
    amp.reset()
    net, trainer, _ = _setup("O2", "adam", scale)
    first = _steps(net, trainer, 4)
    net.save_parameters(str(tmp_path / "p.params"))
    trainer.save_states(str(tmp_path / "t.states"))
    amp_state = amp.state_dict(trainer)
    amp.reset()
    net, trainer, _ = _setup("O2", "adam", scale)
    net.load_parameters(str(tmp_path / "p.params"))
    trainer.load_states(str(tmp_path / "t.states"))
    amp.load_state_dict(trainer, amp_state)
    assert set(mx_masters.masters(trainer)) == set(net.collect_params())
    rest = _steps(net, trainer, 4, start=4)
    np.testing.assert_array_equal(np.concatenate([first, rest]), straight)
    resumed = _snapshot(net, trainer)
    for k in final:
        np.testing.assert_array_equal(resumed[k], final[k], err_msg=k)


def test_layer_norm_and_batch_norm_parameters_stay_fp32():
    amp.init(policy=Policy.preset("O2", emulate=True))
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Conv2D(2, 3, in_channels=1), gluon.nn.BatchNorm(in_channels=2),
            gluon.nn.Flatten(), gluon.nn.Dense(4, in_units=8), gluon.nn.LayerNorm(in_channels=4))
    net.initialize()
    plan = amp.cast_params(net)
    params = net.collect_params()
    norms = {n for n in params if "batchnorm" in n or "layernorm" in n}
    assert len(norms) == 6 and norms == plan.fp32
    assert {n for n in params if "conv" in n or "dense" in n} == plan.low
    for name, p in params.items():
        assert str(np.dtype(p.dtype)) == ("float32" if name in norms else "float16"), name
    net.hybridize()
    out = net(nd.ones((2, 1, 4, 4)))
    assert np.all(np.isfinite(out.asnumpy()))


def test_o2_is_accepted_and_cast_params_needs_o2():
    assert amp.init(policy="O2").level == "O2"
    amp.reset()
    amp.init(policy="O1")
    with pytest.raises(AmpConfigError, match="level O1"):
        amp.cast_params(mlp())
    amp.reset()
    with pytest.raises(RuntimeError, match="no AMP policy"):
        amp.cast_params(mlp())


def test_update_on_kvstore_is_refused_with_a_way_out():
    amp.init(policy=Policy.preset("O2", emulate=True))
    net = mlp()
    amp.cast_params(net)
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1},
                            update_on_kvstore=True)
    with pytest.raises(AmpConfigError, match="update_on_kvstore=False"):
        amp.init_trainer(trainer)


@pytest.mark.parametrize("name, kwargs", [("sgd", {"momentum": 0.9, "wd": 1e-3}),
                                          ("adam", {"wd": 1e-3})])
def test_master_update_equals_the_native_multi_precision_update(name, kwargs):
    """For float16 weights, the master-weight updater moves weights and masters exactly as
    MXNet's own multi_precision update (fused mp_* kernels for SGD, the generic path for
    Adam) does: the same optimizer arithmetic in float32, one rounding into float16."""
    rs = np.random.RandomState(0)
    w0 = rs.randn(16, 8).astype(np.float16)
    native = mx.optimizer.Updater(mx.optimizer.create(name, learning_rate=0.1,
                                                      multi_precision=True, **kwargs))
    ours = mx_masters.MasterWeightUpdater(mx.optimizer.create(name, learning_rate=0.1, **kwargs))
    w_native, w_ours = nd.array(w0, dtype="float16"), nd.array(w0, dtype="float16")
    for _ in range(5):
        g = nd.array(rs.randn(16, 8).astype(np.float16), dtype="float16")
        native(0, g, w_native)
        ours(0, g, w_ours)
    np.testing.assert_array_equal(w_ours.asnumpy(), w_native.asnumpy())
    native_master = native.states[0][1 if name == "sgd" else 0]  # (mom, master) for mp_sgd
    np.testing.assert_array_equal(ours.states[0][0].asnumpy(), native_master.asnumpy())


@settings(max_examples=8, deadline=None, derandomize=True)
@given(st.lists(st.booleans(), min_size=1, max_size=5))
def test_any_sequence_of_overflow_and_clean_steps(overflows):
    """Whatever the order of overflow and clean steps: an overflow step changes no parameter,
    master or optimizer state; a clean step moves them, and every parameter stays its
    master rounded to float16."""
    amp.reset()
    net, trainer, _ = _setup("O2", "sgd", DynamicLossScale(scale=2.0 ** 8))
    _steps(net, trainer, 1)
    for i, overflow in enumerate(overflows):
        before = _snapshot(net, trainer)
        x, y = batch(i)
        if overflow:
            x[0, 0] = np.inf
        backward(net, trainer, x, y)
        trainer.step(4)
        after = _snapshot(net, trainer)
        assert amp.last_step_skipped(trainer) == overflow
        same = all(np.array_equal(before[k], after[k]) for k in before)
        assert same == overflow
        for name, master in mx_masters.masters(trainer).items():
            np.testing.assert_array_equal(net.collect_params()[name].data().asnumpy(),
                                          master.asnumpy().astype(np.float16))
    amp.reset()


def test_casting_after_the_first_step_is_a_clear_error():
    amp.init(policy=Policy.preset("O2", emulate=True))
    net = mlp()
    trainer = gluon.Trainer(net.collect_params(), *OPTIMIZERS["sgd"])
    amp.init_trainer(trainer)
    _steps(net, trainer, 1)  # fp32 states exist now
    amp.cast_params(net)
    x, y = batch(0)
    backward(net, trainer, x, y)
    with pytest.raises(AmpConfigError, match="cast_params before training"):
        trainer.step(4)
