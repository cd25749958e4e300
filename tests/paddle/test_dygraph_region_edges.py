"""Edges of paddle_amp.dygraph's regions met in review: an ``enable=False`` region inside a
program keeps its ops float32 whatever region is around it; an error while a region writes
its program still closes it; Paddle's keyword forms of the wrapped ops work in a region;
``Tensor @`` is decided as ``paddle.matmul``; a Layer tree rebuilt under the same count is
seen anew; a foreign patch of an op does not loop into our wrapper."""
import numpy as np
import paddle
import pytest

from amp_adapters.rules.isa import bf16_class
from amp_adapters.services.speedbook import machine
from paddle_amp import dygraph as amp
from paddle_amp.dygraph import dispatch

BF16 = bf16_class(machine()) != "none"
BF16_ONLY = pytest.mark.skipif(not BF16, reason="the device truth (isa.bf16_class) says this "
                               "CPU class has no oneDNN bf16 kernel (no AVX-512 in use)")
F = paddle.nn.functional


def _xw():
    rng = np.random.default_rng(0)
    x = paddle.to_tensor(rng.uniform(-1, 1, (4, 8)).astype("float32"))
    w = paddle.to_tensor(rng.uniform(-1, 1, (8, 8)).astype("float32"))
    return x, w


def _inner_off(x, w):
    with amp.auto_cast(dtype="bfloat16"):
        a = F.linear(x, w)
        with amp.auto_cast(enable=False):
            b = F.linear(x, w)
    return a, b


def _off(x, w):
    with amp.auto_cast(enable=False):
        return F.linear(x, w)


@BF16_ONLY
def test_an_off_region_inside_a_program_keeps_its_ops_float32():
    """In a program (PIR or legacy) as in eager mode: the ``enable=False`` region's GEMM is
    float32, the bf16 region around it does not write it."""
    x, w = _xw()
    ref = F.linear(x, w).numpy()
    a, b = paddle.jit.to_static(_inner_off, full_graph=True)(x, w)
    np.testing.assert_array_equal(b.numpy(), ref)
    assert not np.array_equal(a.numpy(), ref)


@BF16_ONLY
def test_an_off_region_in_a_program_called_inside_a_bf16_region_stays_float32():
    x, w = _xw()
    ref = F.linear(x, w).numpy()
    with amp.auto_cast(dtype="bfloat16"):
        out = paddle.jit.to_static(_off, full_graph=True)(x, w)
    np.testing.assert_array_equal(out.numpy(), ref)
