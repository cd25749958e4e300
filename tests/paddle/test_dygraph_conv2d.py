"""conv2d in bf16 in eager mode: on oneDNN where its route's probe ran forward and backward
(``kernels.conv2d``, the legacy op entry with the static bf16 rewrite's attributes), else
float32 with the reason the route failed named. In Paddle 2.6.2 and 3.3.1 it fails (the
oneDNN kernel reads its inputs' variable names from a program's context); the test reads
the probe's answer, and the device truth for the CPU class."""
import numpy as np
import paddle

from amp_adapters.rules.isa import bf16_class, machine
from paddle_amp import dygraph as amp
from paddle_amp.dygraph import kernels


def test_conv2d_runs_bf16_where_its_route_runs_else_float32_saying_why():
    paddle.seed(0)
    conv = paddle.nn.Conv2D(2, 3, 3, padding=1)
    x = paddle.to_tensor(np.random.default_rng(0).standard_normal((2, 2, 5, 5))
                         .astype(np.float32), stop_gradient=False)
    ref = conv(x)
    with amp.auto_cast(dtype="bfloat16") as region:
        out = conv(x)
    out.sum().backward()
    d = region.ran["conv2d"]
    assert out.dtype == paddle.float32 and x.grad is not None
    routed = "conv2d" in kernels.lowp_kernels("bfloat16")
    if bf16_class(machine()) == "none":
        assert not routed and not kernels.missing_routes("bfloat16")
    elif not routed:  # this Paddle: the route's failure is named
        why = kernels.missing_routes("bfloat16")["conv2d"]
        assert why and "conv2d" in kernels.ROUTES
    if routed:
        assert d.run_dtype == "bfloat16" and not d.fell_back
        assert np.allclose(out.numpy(), ref.numpy(), rtol=0.05, atol=0.05)
    else:
        assert d.run_dtype == "float32" and d.fell_back
        assert np.array_equal(out.numpy(), ref.numpy())
