"""A bf16 kernel counts only where it runs as a rewritten program runs it: behind the cast
the rewrite puts in front of it, at a model's sizes (a batch, 16 channels, a 3x3 window).

Paddle 3.3.1's legacy-IR oneDNN conv2d runs on bf16 data, and on one image behind a cast,
but on a batch of 16 channels behind either cast fails ("could not construct a memory
descriptor using strides") where oneDNN emulates bf16 (``ONEDNN_MAX_CPU_ISA=AVX512_CORE``,
a Skylake-class CPU): a bf16 CNN crashed there. Each oneDNN setting runs in a child process
(the limit is read when oneDNN loads).
"""
import os
import subprocess
import sys
import textwrap

import pytest

from paddle_amp import ir, kernels
from paddle_helpers import pir_mode

BF16 = "bfloat16"


def test_every_probed_onednn_kernel_trains_behind_the_cast_a_rewrite_puts_in_front():
    """In this process's IR and oneDNN setting: each probed op that counts as a oneDNN bf16
    kernel trains behind the route of cast it gets (plain in front of the ops that refuse
    oneDNN's casts, and everywhere where casts do not go to oneDNN)."""
    probe = (ir.PirProgram if pir_mode() else ir.LegacyProgram).probe
    onednn = kernels.onednn_kernels("CPU", BF16, probe)
    probed = sorted(onednn & set(kernels._RECIPES))
    if not probed:
        pytest.skip("oneDNN runs no bf16 kernel here (no AVX-512, or a limit below it)")
    plain = kernels.plain_cast_readers("CPU", BF16, probe)
    for op in probed:
        route = "onednn" if "cast" in onednn and op not in plain else "plain"
        assert probe.runs(op, kernels._RECIPES[op], True, cast_in=route), (op, route)


def test_the_conv_recipe_has_a_models_batch_channels_and_window():
    """The probe's conv2d is no 1x1 filter on one image: those ran where a model's failed."""
    inputs = kernels._RECIPES["conv2d"][0]
    (n, c, _, _), _ = inputs["Input"]
    (_, _, kh, kw), _ = inputs["Filter"]
    assert n >= 2 and c >= 16 and (kh, kw) == (3, 3)


_CNN = textwrap.dedent("""
    import numpy as np, paddle
    paddle.enable_static()
    import paddle_amp
    from paddle_amp import cast_report
    main, start = paddle.static.Program(), paddle.static.Program()
    with paddle.static.program_guard(main, start):
        x = paddle.static.data("x", [None, 16, 8, 8], "float32")
        h = paddle.nn.functional.relu(paddle.nn.Conv2D(16, 16, 3, padding=1)(x))
        loss = paddle.mean(paddle.nn.Conv2D(16, 16, 3, padding=1)(h))
        opt = paddle_amp.bf16.decorate_bf16(paddle.optimizer.SGD(1e-3), use_bf16_guard=False)
        opt.minimize(loss)
    exe = paddle.static.Executor(paddle.CPUPlace())
    exe.run(start)
    feed = {"x": np.random.default_rng(0).random((4, 16, 8, 8), np.float32)}
    got = [float(np.asarray(exe.run(main, feed=feed, fetch_list=[loss])[0])) for _ in range(2)]
    assert all(np.isfinite(got)), got
    convs = [d.run_dtype for d in cast_report(main).decisions if d.op == "conv2d"]
    print("conv2d", *convs)
""")


@pytest.mark.parametrize("isa", [None, "AVX512_CORE", "AVX2"])
def test_a_bf16_cnn_trains_in_every_onednn_setting(isa):
    """The bf16 rewrite of a CNN trains (its conv2d in bf16 where it runs behind casts here,
    else float32), as the CPU is and with oneDNN limited; it never crashes."""
    env = dict(os.environ)
    for name in ("DNNL_MAX_CPU_ISA", "ONEDNN_MAX_CPU_ISA"):
        env.pop(name, None)
        if isa:
            env[name] = isa
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    done = subprocess.run([sys.executable, "-c", _CNN], capture_output=True, text=True,
                          env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    line = [ln for ln in done.stdout.splitlines() if ln.startswith("conv2d")][-1].split()
    assert len(line) == 3 and set(line[1:]) <= {"float32", BF16}
