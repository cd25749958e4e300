"""Casts per program no more than the native's: ``cast_model_to_fp16`` on conv networks whose
biases reach their add through ``reshape2`` (``paddle.nn.Conv2D`` in static mode), on both
IRs. The native has no PIR branch, so its count comes from the same network built in the
legacy IR. Before the O2 parameter plan looked through pass-through ops, each conv bias was
stored fp16 (its only reader, reshape2, has an fp16 kernel) and cast back to fp32 for the
add: one cast per conv where the native has none.
"""
import contextlib

import numpy as np
import paddle
import pytest
from paddle.base import unique_name

import paddle_amp
from amp_adapters.rules.device import DeviceProfile
from paddle_amp.config import native_policy
from paddle_amp.rewrite import Rewriter
from paddle_helpers import is_pir, op_names, pir_mode

# paddle.nn.BatchNorm2D's own notice when it trains (Paddle's, not ours): not a finding here
pytestmark = pytest.mark.filterwarnings(
    "ignore:When training, we now always track global mean and variance:UserWarning")


def conv_bn_relu(h, cin: int, cout: int, stride: int = 1):
    h = paddle.nn.Conv2D(cin, cout, 3, stride=stride, padding=1)(h)
    return paddle.nn.functional.relu(paddle.nn.BatchNorm2D(cout)(h))


def four_blocks():
    """conv (bias through reshape2) + batch_norm + relu, four times."""
    x = paddle.static.data("x", [None, 3, 8, 8], "float32")
    h, cin = x, 3
    for _ in range(4):
        h, cin = conv_bn_relu(h, cin, 8), 8
    return x, paddle.mean(h)


def resnet_cifar():
    """ResNet-CIFAR's shape (Paddle's image-classification fp16 test): a stem, three stages
    of one basic block each (two conv-bn, a projection shortcut where the shape changes, the
    residual add), global pooling and a classifier."""
    x = paddle.static.data("x", [None, 3, 8, 8], "float32")
    h, cin = conv_bn_relu(x, 3, 8), 8
    for cout, stride in ((8, 1), (16, 2), (32, 2)):
        body = paddle.nn.BatchNorm2D(cout)(
            paddle.nn.Conv2D(cout, cout, 3, padding=1)(conv_bn_relu(h, cin, cout, stride)))
        short = h if (cin, stride) == (cout, 1) else paddle.nn.BatchNorm2D(cout)(
            paddle.nn.Conv2D(cin, cout, 1, stride=stride)(h))
        h, cin = paddle.nn.functional.relu(body + short), cout
    pooled = paddle.flatten(paddle.nn.functional.avg_pool2d(h, 2, stride=1), 1)
    return x, paddle.mean(paddle.nn.Linear(cin, 10)(pooled))


MODELS = {"four_blocks": four_blocks, "resnet_cifar": resnet_cifar}


def casts(program) -> int:
    if is_pir(program):
        return sum(op.name() == "pd_op.cast" for op in program.global_block().ops)
    return sum(op.type == "cast" for op in program.global_block().ops)


def native_casts(model: str) -> int:
    """The native ``cast_model_to_fp16``'s casts on ``model``, built in the legacy IR."""
    legacy = paddle.pir_utils.OldIrGuard() if pir_mode() else contextlib.nullcontext()
    with legacy:
        main, startup = paddle.static.Program(), paddle.static.Program()
        with paddle.static.program_guard(main, startup), unique_name.guard():
            MODELS[model]()
        paddle.static.amp.cast_model_to_fp16(main, use_fp16_guard=False)
        return casts(main)


def gpu_like_cast(program) -> set[str]:
    """Our ``cast_model_to_fp16`` as on a device with every fp16 kernel (the native's own
    assumption: it never asks the device): the same policy, no kernel set."""
    lists = paddle_amp.AutoMixedPrecisionLists()
    rewriter = Rewriter(native_policy(lists, "float16", "O2", False), DeviceProfile(None))
    low = rewriter.low_params(program)
    rewriter.set_low_params(program, low)
    rewriter.rewrite(program)
    return set(low)


@pytest.mark.parametrize("model", sorted(MODELS))
def test_one_cast_with_every_fp16_kernel(static, model):
    """Device-free (a GPU's kernels, what the native assumes): the conv biases reach an fp16
    add, so they are stored fp16 and reshaped in fp16; the one cast left is the fed input's
    (data arrives in fp32), as natively on a GPU. Before: the same, the rule only moves
    parameters whose readers run in fp32."""
    MODELS[model]()
    low = gpu_like_cast(static.main)
    assert casts(static.main) == 1
    assert {n for n in low if n.startswith("conv2d") and n.endswith(".b_0")}


def test_cast_model_to_fp16_on_this_cpu_no_more_casts_than_the_native(static):
    """On this CPU conv2d and the bias add have no fp16 kernel: each conv bias stays fp32
    (its reshape2 only moves it to the fp32 add), where it used to be stored fp16 and cast
    back before each add (4 casts here against the native's 0)."""
    four_blocks()
    ours = paddle_amp.cast_model_to_fp16(static.main, use_fp16_guard=False)
    native = native_casts("four_blocks")
    assert casts(static.main) <= native, (casts(static.main), native)
    assert "reshape2" in op_names(static.main)  # the biases did go through reshape2
    assert not any(name.startswith("conv2d") for name in ours)  # conv weights, biases fp32


def test_the_rewritten_program_runs_and_matches_fp32(static):
    """Nothing here runs in fp16 on a CPU, so the rewrite keeps the fp32 numbers exactly."""
    x, loss = four_blocks()
    static.exe.run(static.startup)
    feed = {"x": np.random.default_rng(0).standard_normal((2, 3, 8, 8)).astype("float32")}
    before, = static.run(feed, [loss])
    names = paddle_amp.cast_model_to_fp16(static.main, use_fp16_guard=False)
    paddle_amp.cast_parameters_to_fp16(paddle.CPUPlace(), static.main, static.scope, names)
    after, = static.run(feed, [loss])
    assert casts(static.main) == 0
    np.testing.assert_array_equal(after, before)
