"""A Paddle static program with mixed precision: `paddle_amp.decorate` instead of
`paddle.static.amp.decorate`, at O1 (the shared policy file) and O2 (the native arguments:
fp16 parameters, converted by `amp_init`, with fp32 master weights; the layer norm's
scale and bias stay fp32. On a CPU the fp16 ops and the master update are EMULATED).

    python examples/paddle_static.py [--policy examples/policy.toml]
"""
import argparse
import os

os.environ.setdefault("FLAGS_enable_pir_api", "0")  # Paddle 3.x: the legacy program IR

from amp_adapters.services.quiet import quiet_frameworks

quiet_frameworks()  # framework log noise off: glog INFO lines, "Cannot decide type", ...

import numpy as np  # noqa: E402
import paddle  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402

import paddle_amp  # noqa: E402
from amp_adapters import Policy  # noqa: E402


def train(level: str, policy: Policy, steps: int = 300) -> float:
    digits = load_digits()
    x_all, y_all = (digits.data / 16.0).astype("float32"), digits.target.astype("int64")
    main, startup = paddle.static.Program(), paddle.static.Program()
    with paddle.static.program_guard(main, startup):
        x = paddle.static.data("x", [None, 64], "float32")
        y = paddle.static.data("y", [None, 1], "int64")
        hidden = paddle.static.nn.fc(x, 64, activation="relu")
        hidden = paddle.static.nn.layer_norm(hidden)          # stays fp32: a norm
        logits = paddle.static.nn.fc(hidden, 10)
        loss = paddle.mean(paddle.nn.functional.cross_entropy(logits, y))
        test_program = main.clone(for_test=True)
        optimizer = paddle.optimizer.Momentum(learning_rate=0.1, momentum=0.9)
        if level == "O1":
            optimizer = paddle_amp.decorate(optimizer, policy=policy)
        else:  # the native arguments work too
            optimizer = paddle_amp.decorate(optimizer, level="O2", dtype="float16",
                                            emulate=True)
        optimizer.minimize(loss)
    print("  " + paddle_amp.cast_report(main).format().splitlines()[0])  # ops and casts
    place = paddle.CPUPlace()
    exe = paddle.static.Executor(place)
    exe.run(startup)
    optimizer.amp_init(place, test_program=test_program)     # O2: params to fp16, masters
    if level == "O2":
        print(f"  {len(optimizer.param_plan().low)} parameters stored fp16; "
              f"{optimizer.master_update.split(':')[0]}")
    rng = np.random.default_rng(0)
    for step in range(steps):
        idx = rng.integers(0, 1400, 64)
        (value,) = exe.run(main, feed={"x": x_all[idx], "y": y_all[idx, None]}, fetch_list=[loss])
        optimizer.check_guard()  # raises OverflowGuardError after too many skips in a row
        if step % 100 == 0:
            state = optimizer.loss_scale()
            print(f"  step {step:3d}  loss {float(np.asarray(value).reshape(())):.3f}  "
                  f"scale {state.scale:g}  skipped {state.skipped_steps}")
    (logits_test,) = exe.run(test_program, feed={"x": x_all[1400:], "y": y_all[1400:, None]},
                             fetch_list=[logits])
    return float((np.asarray(logits_test).argmax(1) == y_all[1400:]).mean())


if __name__ == "__main__":
    here = os.path.dirname(os.path.abspath(__file__))
    parser = argparse.ArgumentParser()
    parser.add_argument("--policy", default=os.path.join(here, "policy.toml"))
    args = parser.parse_args()
    paddle.enable_static()
    policy = Policy.from_file(args.policy)
    for level in ("O1", "O2"):
        print(f"{level}:")
        print(f"  final accuracy {train(level, policy):.3f}")
