"""Training loops in the style of the three Paddle training engines, one import changed
(``from paddle_amp import dygraph as amp`` instead of ``from paddle import amp``), really in
low precision on a CPU (bf16 where the device truth says oneDNN runs it, fp16 emulated),
each reaching fp32's final loss within 5%:

- PaddleSeg (``paddleseg/core/train.py``): ``auto_cast(custom_black_list=..., level=...)``,
  ``scaler.scale(loss).backward(); scaler.minimize(optimizer, scaled)``;
- PaddleClas (``ppcls/engine/engine.py``): ``decorate(models=, optimizers=, level=,
  save_dtype="float32")``, ``GradScaler(init_loss_scaling=, use_dynamic_loss_scaling=)``,
  ``scaler.scale(loss).backward(); scaler.step(optimizer); scaler.update()``;
- PaddleDetection (``ppdet/engine/trainer.py``): ``decorate(..., master_grad=)``,
  ``auto_cast(custom_white_list=, custom_black_list=, level=)``, ``scaler.minimize``.
"""
import numpy as np
import paddle
import pytest

from amp_adapters.rules.isa import bf16_class, machine
from paddle_amp import dygraph as amp

STEPS = 40
ENGINES = ("paddleseg", "paddleclas", "paddledetection")


def _data():
    rng = np.random.default_rng(7)
    x = paddle.to_tensor(rng.standard_normal((512, 16)).astype(np.float32))
    y = paddle.to_tensor((rng.standard_normal((512, 1)) * 0.5).astype(np.float32)) + \
        x[:, :1] * 0.5 - x[:, 1:2]
    return x, y


def _model():
    paddle.seed(7)
    model = paddle.nn.Sequential(paddle.nn.Linear(16, 64), paddle.nn.ReLU(),
                                 paddle.nn.Linear(64, 64), paddle.nn.ReLU(),
                                 paddle.nn.Linear(64, 1))
    return model, paddle.optimizer.Adam(1e-2, parameters=model.parameters())


def _fp32(steps=STEPS):
    model, optimizer = _model()
    x, y = _data()
    for _ in range(steps):
        loss = paddle.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.clear_grad()
    return float(loss)


def _amp(engine, dtype, emulate):
    model, optimizer = _model()
    x, y = _data()
    ran = set()
    if engine == "paddleclas":
        model, optimizer = amp.decorate(models=model, optimizers=optimizer, level="O1",
                                        save_dtype="float32")
        scaler = amp.GradScaler(init_loss_scaling=1024, use_dynamic_loss_scaling=True)
        region = dict(custom_black_list={"reduce_mean"}, level="O1")
    elif engine == "paddledetection":
        model, optimizer = amp.decorate(models=model, optimizers=optimizer, level="O1",
                                        master_grad=False)
        scaler = amp.GradScaler(enable=True, init_loss_scaling=1024)
        region = dict(custom_white_list={"elementwise_add"},
                      custom_black_list={"reduce_mean", "elementwise_div"}, level="O1")
    else:
        scaler = amp.GradScaler(init_loss_scaling=1024)
        region = dict(custom_black_list={"reduce_mean", "elementwise_div"}, level="O1")
    for _ in range(STEPS):
        with amp.auto_cast(dtype=dtype, emulate=emulate, **region) as frame:
            loss = paddle.nn.functional.mse_loss(model(x), y)
        ran |= {d.execution for d in frame.ran.values()}
        scaled = scaler.scale(loss)
        scaled.backward()
        if engine == "paddleclas":
            scaler.step(optimizer)
            scaler.update()
        else:
            scaler.minimize(optimizer, scaled)
        optimizer.clear_grad()
    return float(loss), ran


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("dtype, emulate, expect", [
    ("bfloat16", False, "kernel" if bf16_class(machine()) != "none" else "fell back"),
    ("float16", True, "emulated"),
])
def test_an_engine_style_loop_reaches_fp32_loss(engine, dtype, emulate, expect):
    fp32 = _fp32()
    low, ran = _amp(engine, dtype, emulate)
    assert ran == {expect}
    assert fp32 < 0.5 * _fp32(steps=1)  # it learned
    assert abs(low - fp32) <= 0.05 * fp32, (low, fp32)
