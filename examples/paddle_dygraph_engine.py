"""A Paddle dynamic-graph training engine, in the style of PaddleClas's engine and
PaddleSeg's train loop, with one import changed: `from paddle_amp import dygraph as amp`
instead of `from paddle import amp`. Everything else is the native API as those engines
call it: `amp.decorate(models, optimizers, level, dtype, save_dtype)`,
`amp.auto_cast(custom_white_list, custom_black_list, level, dtype)`,
`amp.GradScaler(init_loss_scaling)`, `scaler.scale(loss).backward()`,
`scaler.minimize(optimizer, scaled)`, and `scaler.state_dict()` saved in the checkpoint.

On a CPU the native does nothing here; ours runs the GEMMs in bf16 on oneDNN where this CPU
has the kernel (`amp.is_bfloat16_supported()`), and says so where it has none (they then run
float32). O1 and O2 (bf16 weights, float32 masters in the optimizer's state_dict).

    python examples/paddle_dygraph_engine.py [--steps 300] [--save DIR]
"""
import argparse
import os
import tempfile

from amp_adapters.services.quiet import quiet_frameworks

quiet_frameworks()  # framework log noise off

import numpy as np  # noqa: E402
import paddle  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402

from paddle_amp import dygraph as amp  # noqa: E402  (was: from paddle import amp)


class Classifier(paddle.nn.Layer):
    def __init__(self):
        super().__init__()
        self.fc1 = paddle.nn.Linear(64, 128)
        self.norm = paddle.nn.LayerNorm(128)           # stays float32 (a norm), at O2 too
        self.fc2 = paddle.nn.Linear(128, 10)

    def forward(self, x):
        return self.fc2(self.norm(paddle.nn.functional.relu(self.fc1(x))))


def train(level: str, steps: int, save_dir: str) -> float:
    paddle.seed(0)
    digits = load_digits()
    x_all = paddle.to_tensor((digits.data / 16.0).astype("float32"))
    y_all = paddle.to_tensor(digits.target.astype("int64"))
    model = Classifier()
    optimizer = paddle.optimizer.Momentum(0.05, momentum=0.9, parameters=model.parameters())
    dtype = "bfloat16" if amp.is_bfloat16_supported() else "float16"
    model, optimizer = amp.decorate(models=model, optimizers=optimizer, level=level,
                                    dtype=dtype, save_dtype="float32")
    scaler = amp.GradScaler(init_loss_scaling=1024)
    rng = np.random.default_rng(0)
    for step in range(steps):
        idx = paddle.to_tensor(rng.integers(0, len(digits.target), 64))
        x, y = paddle.gather(x_all, idx), paddle.gather(y_all, idx)
        with amp.auto_cast(custom_black_list={"reduce_mean"}, level=level, dtype=dtype):
            loss = paddle.nn.functional.cross_entropy(model(x), y).mean()
        scaled = scaler.scale(loss)
        scaled.backward()
        scaler.minimize(optimizer, scaled)
        optimizer.clear_grad()
    # the engine's checkpoint: the model, the optimizer (O2: its float32 masters) and scaler
    paddle.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                 "scaler": scaler.state_dict()}, os.path.join(save_dir, f"{level}.pdparams"))
    with paddle.no_grad(), amp.auto_cast(level=level, dtype=dtype):
        predicted = model(x_all).astype("float32").argmax(axis=1)
    return float((predicted == y_all).astype("float32").mean())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300, help="training steps per level")
    parser.add_argument("--save", metavar="DIR", help="checkpoint folder (default: a temp one)")
    args = parser.parse_args()
    save_dir = args.save or tempfile.mkdtemp(prefix="paddle-dygraph-engine-")
    os.makedirs(save_dir, exist_ok=True)
    for level in ("O1", "O2"):
        print(f"{level}: final accuracy {train(level, args.steps, save_dir):.3f}")
    print(f"checkpoints in {save_dir}")


if __name__ == "__main__":
    main()
