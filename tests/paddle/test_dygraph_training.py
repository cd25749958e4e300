"""A training loop in PaddleSeg's style (``paddleseg/core/train.py``), one import changed:
``scaler.scale(loss).backward(); scaler.minimize(optimizer, scaled)``, under
``auto_cast(custom_black_list=..., level="O1")``, reaching fp32's final loss within 5%."""
import numpy as np
import paddle
import pytest

from amp_adapters.isa import bf16_class
from amp_adapters.speedbook import machine
from paddle_amp import dygraph as amp

STEPS = 40


def _train_steps(steps):
    global STEPS
    saved, STEPS = STEPS, steps
    try:
        return _train()
    finally:
        STEPS = saved


def _train(amp_kwargs=None):
    paddle.seed(7)
    rng = np.random.default_rng(7)
    x = paddle.to_tensor(rng.standard_normal((512, 16)).astype(np.float32))
    y = paddle.to_tensor((rng.standard_normal((512, 1)) * 0.5).astype(np.float32)) + \
        x[:, :1] * 0.5 - x[:, 1:2]
    model = paddle.nn.Sequential(paddle.nn.Linear(16, 64), paddle.nn.ReLU(),
                                 paddle.nn.Linear(64, 64), paddle.nn.ReLU(),
                                 paddle.nn.Linear(64, 1))
    optimizer = paddle.optimizer.Adam(1e-2, parameters=model.parameters())
    ran = set()
    if amp_kwargs is not None:
        model, optimizer = amp.decorate(models=model, optimizers=optimizer, level="O1",
                                        save_dtype="float32")
        scaler = amp.GradScaler(init_loss_scaling=1024)
    for _ in range(STEPS):
        if amp_kwargs is None:
            loss = paddle.nn.functional.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
        else:
            with amp.auto_cast(custom_black_list={"reduce_mean", "elementwise_div"},
                               level="O1", **amp_kwargs) as region:
                loss = paddle.nn.functional.mse_loss(model(x), y)
            ran |= {d.execution for d in region.ran.values()}
            scaled = scaler.scale(loss)
            scaled.backward()
            scaler.minimize(optimizer, scaled)
        model.clear_gradients()
    return float(loss), ran


@pytest.mark.parametrize("amp_kwargs, expect", [
    (dict(dtype="bfloat16"), "kernel" if bf16_class(machine()) != "none" else "fell back"),
    (dict(dtype="float16", emulate=True), "emulated"),
])
def test_paddleseg_style_loop_reaches_fp32_loss(amp_kwargs, expect):
    fp32, _ = _train()
    low, ran = _train(amp_kwargs)
    assert ran == {expect}
    first, _ = _train_steps(1)
    assert fp32 < 0.5 * first  # it learned
    assert abs(low - fp32) <= 0.05 * fp32, (low, fp32)
