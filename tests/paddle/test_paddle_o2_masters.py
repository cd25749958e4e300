"""O2 on a CPU: low-precision parameters, EMULATED float32 master weights, true skips, resume.

No CPU optimizer kernel takes float16 parameters, so the masters are emulated
(``paddle_amp.masters``): the optimizer's float32 kernel updates float32
masters and a cast writes the parameters. Forward GEMMs are EMULATED fp16 too.
"""
import contextlib

import numpy as np
import paddle
import pytest
from paddle.base import unique_name

import paddle_amp
from amp_adapters import DynamicLossScale, OverflowGuardError, Policy
from paddle_helpers import Static, batch, mlp

STEPS = 30


@contextlib.contextmanager
def fresh_static():
    """A second, independent program + scope (the same parameter names) in one test."""
    env = Static.new()
    with paddle.static.program_guard(env.main, env.startup), \
            paddle.static.scope_guard(env.scope), unique_name.guard():
        yield env


def _build(policy, optimizer, loss_factor=1.0):
    x, y, loss = mlp(loss_factor=loss_factor, names="o2")  # PIR: names fixed per process
    opt = paddle_amp.decorate(optimizer, policy=policy) if policy is not None else optimizer
    opt.minimize(loss)
    return opt, loss


def _train(static, policy, make_opt, steps=STEPS):
    opt, loss = _build(policy, make_opt())
    static.exe.run(static.startup)
    if policy is not None:
        opt.amp_init(paddle.CPUPlace())
    losses = [float(static.run(batch(i % 3), [loss])[0]) for i in range(steps)]
    return opt, np.array(losses)


OPTIMIZERS = {
    "momentum": lambda: paddle.optimizer.Momentum(0.05, momentum=0.9),
    "adam": lambda: paddle.optimizer.Adam(0.01),
}


@pytest.mark.parametrize("preset", ["O2", "O2-bf16"])
@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_o2_trains_like_fp32(static, preset, name):
    """O2 (EMULATED low-precision forward, float32 masters) tracks fp32 on a tiny MLP.

    Tolerance: every fc output and weight is rounded once through the low dtype
    (relative error u = 2**-11 for fp16, 2**-8 for bf16) per op, a handful of
    ops deep, so each step's loss differs by a few u relative; the masters
    keep the updates exact in float32, so the error does not accumulate over
    30 steps beyond the same order. We allow 40u relative per step-loss (0.02
    for fp16, 0.16 for bf16) and require both runs to learn (the last loss
    a quarter below the first, three batches in turn).
    """
    u = 2.0 ** -11 if preset == "O2" else 2.0 ** -8
    with fresh_static() as s32:
        _, fp32 = _train(s32, None, OPTIMIZERS[name])
    with fresh_static() as s16:
        opt, low = _train(s16, Policy.preset(preset, emulate=True), OPTIMIZERS[name])
    assert opt._low_params and "EMULATED" in opt.master_update
    dtype = "float16" if preset == "O2" else "bfloat16"
    for p in opt._low_params:
        assert str(s16.scope.find_var(p).get_tensor()._dtype()).endswith(dtype)
    np.testing.assert_allclose(low, fp32, rtol=40 * u, atol=1e-4)
    assert fp32[-5:].mean() < 0.75 * fp32[:5].mean() and low[-5:].mean() < 0.75 * low[:5].mean()


def test_parameter_is_its_master_rounded(static):
    opt, _ = _train(static, Policy.preset("O2", emulate=True), OPTIMIZERS["momentum"], 5)
    for p, m in opt._masters.master_of.items():
        param = np.array(static.scope.find_var(p).get_tensor())
        master = np.array(static.scope.find_var(m).get_tensor())
        assert param.dtype == np.float16 and master.dtype == np.float32
        # the cast back is Paddle's: on CPU, 2.6.2 rounds toward zero, 3.3.1 to nearest (measured)
        toward_zero = (master.view(np.uint32) & 0xFFFFE000).view(np.float32).astype(np.float16)
        nearest = master.astype(np.float16)
        assert np.array_equal(param, nearest) or np.array_equal(param, toward_zero)
        assert np.array_equal(param, toward_zero if paddle.__version__.startswith("2.")
                              else nearest), paddle.__version__


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_overflow_step_leaves_params_masters_and_state_bit_identical(static, name):
    opt, loss = _build(Policy.preset("O2", emulate=True), OPTIMIZERS[name]())
    static.exe.run(static.startup)
    opt.amp_init(paddle.CPUPlace())
    for i in range(3):
        static.run(batch(i), [loss])
    before = static.state()
    assert any("_fp32_master" in k for k in before)
    assert any("moment" in k or "velocity" in k for k in before)
    static.run(batch(3, overflow=True), [loss])
    after = static.state()
    assert opt.loss_scale().skipped_steps == 1
    assert before.keys() == after.keys()
    for k in before:
        np.testing.assert_array_equal(after[k], before[k], err_msg=k)


def test_checkpoint_resume_is_exact(static, tmp_path):
    """static.save after 4 steps, load into a fresh program and scope, 4 more steps: the
    same losses, parameters and masters as 8 uninterrupted steps."""
    policy = Policy.preset("O2", emulate=True,
                           loss_scale=DynamicLossScale(scale=2.0 ** 10, growth_interval=3))
    with fresh_static() as s:
        opt, straight = _train(s, policy, OPTIMIZERS["adam"], 8)
        final = s.state()
    with fresh_static() as s:
        opt, first = _train(s, policy, OPTIMIZERS["adam"], 4)
        paddle.static.save(s.main, str(tmp_path / "ckpt"))
        amp_state = opt.state_dict()
    with fresh_static() as s:
        opt, loss = _build(policy, OPTIMIZERS["adam"]())
        s.exe.run(s.startup)
        opt.amp_init(paddle.CPUPlace())
        paddle.static.load(s.main, str(tmp_path / "ckpt"), s.exe)
        opt.load_state_dict(amp_state)
        rest = [float(s.run(batch(i % 3), [loss])[0]) for i in range(4, 8)]
        resumed = s.state()
    np.testing.assert_array_equal(np.concatenate([first, rest]), straight)
    assert resumed.keys() == final.keys()
    for k in final:
        np.testing.assert_array_equal(resumed[k], final[k], err_msg=k)


def test_layer_norm_parameters_stay_fp32_with_no_master(static):
    x = paddle.static.data("x", [None, 8], "float32")
    # (the layer: Paddle 3's paddle.static.nn.layer_norm builds no PIR op)
    h = paddle.nn.LayerNorm(8)(paddle.static.nn.fc(x, 8))
    opt = paddle_amp.decorate(paddle.optimizer.SGD(0.1), policy=Policy.preset("O2", emulate=True))
    opt.minimize(paddle.mean(h))
    plan = opt.param_plan()
    ln = {n for n in plan.dtypes if n.startswith("layer_norm")}
    assert ln and ln <= plan.fp32 and not ln & set(opt._masters.master_of)
    assert {n for n in plan.dtypes if n.startswith("fc")} == plan.low == opt._low_params


def test_master_weight_false_without_a_kernel_keeps_params_fp32(static):
    _, _, loss = mlp()
    opt = paddle_amp.decorate(paddle.optimizer.SGD(0.1), level="O2", master_weight=False,
                              emulate=True)
    opt.minimize(loss)
    assert opt._low_params == frozenset() and opt.master_update is None


def test_guard_names_the_parameters_not_their_masters(static):
    policy = Policy.preset("O2", emulate=True,
                           loss_scale=DynamicLossScale(max_consecutive_skips=2))
    opt, loss = _build(policy, OPTIMIZERS["momentum"]())
    static.exe.run(static.startup)
    opt.amp_init(paddle.CPUPlace())
    for i in range(2):
        static.run(batch(i, overflow=True), [loss])
    with pytest.raises(OverflowGuardError) as e:
        opt.check_guard()
    assert e.value.param_names and set(e.value.param_names) <= opt._low_params


@pytest.mark.parametrize("rewrite", [False, True])
def test_rewrite_master_weight_starts_each_master_from_its_low_parameter(static, rewrite):
    """amp_init(..., rewrite_master_weight=True), the native's fifth parameter: a master holds
    its parameter's float16 value; without it, the float32 value the startup program made."""
    opt, _ = _build(Policy.preset("O2", emulate=True), OPTIMIZERS["momentum"]())
    static.exe.run(static.startup)
    start = {p: np.array(static.scope.find_var(p).get_tensor()) for p in opt._masters.master_of}
    opt.amp_init(paddle.CPUPlace(), None, None, False, rewrite)
    rounded = []
    for p, m in opt._masters.master_of.items():
        master = np.array(static.scope.find_var(m).get_tensor())
        low = np.array(static.scope.find_var(p).get_tensor())
        assert low.dtype == np.float16
        want = low.astype(np.float32) if rewrite else start[p]
        np.testing.assert_array_equal(master, want)
        rounded.append(np.array_equal(master, low.astype(np.float32)))
    assert all(rounded) == rewrite  # the weights' float32 values are not float16 values
    with pytest.raises(TypeError, match="rewrite_master_weight"):
        opt.amp_init(paddle.CPUPlace(), rewrite_master_weight="yes")
