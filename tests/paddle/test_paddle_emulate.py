"""fp16 emulation on CPU: values and gradients rounded through fp16, and why scaling matters.

These fetch gradients by their legacy names (``w@GRAD``), which PIR does not keep: the PIR
twins are in test_paddle_pir_rewrite.py."""
import numpy as np
import paddle
import pytest

import paddle_amp
from paddle_helpers import batch, forward_ops, mlp


def _fp16_exact(a: np.ndarray) -> bool:
    return np.array_equal(a, a.astype(np.float16).astype(np.float32))


def _build(static, **kw):
    _, _, loss = mlp(loss_factor=kw.pop("loss_factor", 1.0))
    opt = paddle_amp.decorate(paddle.optimizer.SGD(0.1), emulate=True, **kw)
    opt.minimize(loss)
    static.exe.run(static.startup)
    weight = static.main.global_block().all_parameters()[0]
    return opt, weight, f"{weight.name}@GRAD"


@pytest.mark.legacy_ir
def test_emulated_ops_are_labelled_and_gradients_carry_fp16_rounding(static):
    opt, weight, grad = _build(static, use_dynamic_loss_scaling=False, init_loss_scaling=1.0)
    muls = [d for d in opt.cast_report().decisions if d.op == "mul"]
    assert muls and all(d.emulated and d.run_dtype == "float32" for d in muls)
    assert "EMULATED float16" in muls[0].reason and "emulated float16" in \
        opt.cast_report().format()
    # the weight is rounded once per step, for both of its uses (forward mul, backward)
    casts = forward_ops(static.main, "cast")
    assert sum(op.input("X")[0] == weight.name for op in casts) == 1
    g, = static.run(batch(0), [grad])
    assert np.any(g != 0) and _fp16_exact(g)


@pytest.mark.legacy_ir
def test_plain_fp32_gradients_are_not_fp16_exact(static):
    _, _, loss = mlp()
    paddle.optimizer.SGD(0.1).minimize(loss)
    static.exe.run(static.startup)
    name = static.main.global_block().all_parameters()[0].name
    g, = static.run(batch(0), [f"{name}@GRAD"])
    assert not _fp16_exact(g)


@pytest.mark.legacy_ir
def test_tiny_gradients_underflow_without_scaling(static):
    # loss * 1e-7: the output gradients (~1e-8) are below fp16's smallest subnormal (6e-8)
    opt, weight, grad = _build(static, loss_factor=1e-7, use_dynamic_loss_scaling=False,
                               init_loss_scaling=1.0)
    before = static.state()[weight.name]
    g, = static.run(batch(0), [grad])
    assert not np.any(g), "all gradients flushed to zero in fp16"
    assert np.array_equal(before, static.state()[weight.name]), "so nothing learns"


@pytest.mark.legacy_ir
def test_tiny_gradients_survive_with_loss_scaling(static):
    opt, weight, grad = _build(static, loss_factor=1e-7, use_dynamic_loss_scaling=False,
                               init_loss_scaling=2.0**16)
    before = static.state()[weight.name]
    g, = static.run(batch(0), [grad])  # unscaled in place: the true gradient again
    assert np.count_nonzero(g) >= g.size // 4 and np.all(np.abs(g) < 1e-6)  # relu kills some
    assert not np.array_equal(before, static.state()[weight.name])
    assert opt.loss_scale().skipped_steps == 0
