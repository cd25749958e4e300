"""oneDNN's cast in eager mode (``paddle_amp.dygraph.kernels.onednn_cast``): the rounding
cast into bf16 where Paddle's plain cast truncates (Paddle 2.6.2), and the recast of a copy
in the backward there.

Paddle's eager entry to a oneDNN kernel copies each input whole before the kernel runs
(``PreparePhiData``), so one cast of a large activation held a float32 copy of it beside
the result. A large untracked input is cast in slices instead: elementwise, so the same
bits as one cast (checked against one cast, ties and non-finite values included), and the
bytes Paddle's host allocator hands out at once are counted exactly (``Allocated``: live
tensor bytes, not the process's memory; in a fresh process, as Paddle 2.6 cannot reset its
peak).

oneDNN's cast runs on any CPU this project supports (it is a reorder, not a bf16 GEMM)."""
import numpy as np
import paddle
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from paddle import _legacy_C_ops

from paddle_amp.dygraph import kernels

MIB = 1 << 20


def _whole(x, src, dst):
    """One oneDNN cast of all of ``x``: the reference."""
    return _legacy_C_ops.cast(x, "in_dtype", kernels._vartype(src), "out_dtype",
                              kernels._vartype(dst), "use_mkldnn", True)


def _bits(t) -> np.ndarray:
    return t.astype("float32").numpy().view(np.uint32)


# float32 values at and around bf16's rounding ties, signed zeros and non-finite ones
SPECIAL = np.array([1 + 2 ** -8, 1 + 3 * 2 ** -8, -(1 + 2 ** -8), 1 + 2 ** -8 + 2 ** -20,
                    0.0, -0.0, np.inf, -np.inf, np.nan, 3.4e38, 1e-40, -1e-45], np.float32)


@settings(max_examples=25, deadline=None)
@given(shape=st.lists(st.integers(1, 9), min_size=1, max_size=3),
       slice_elems=st.integers(1, 40), seed=st.integers(0, 2 ** 16))
def test_a_cast_in_slices_gives_one_casts_bits(shape, slice_elems, seed):
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(kernels, "CAST_SLICE_BYTES", 4 * slice_elems)
        _same_bits_as_one_cast(shape, seed)


def _same_bits_as_one_cast(shape, seed):
    rng = np.random.default_rng(seed)
    values = rng.standard_normal(shape).astype(np.float32).ravel()
    values[:len(SPECIAL)] = SPECIAL[:values.size]
    x = paddle.to_tensor(values.reshape(shape))
    got = kernels.onednn_cast(x, "float32", "bfloat16")
    assert got.dtype == paddle.bfloat16 and list(got.shape) == list(shape)
    np.testing.assert_array_equal(_bits(got), _bits(_whole(x, "float32", "bfloat16")))
    back = kernels.onednn_cast(got, "bfloat16", "float32")  # and the other way
    np.testing.assert_array_equal(back.numpy().view(np.uint32), _bits(got))


def test_a_tracked_input_is_cast_whole_so_its_gradient_is_one_casts(monkeypatch):
    """Slices and their join in a recorded graph would cost a float32 gradient per slice:
    a tensor autograd records is cast in one op (its gradient node is the cast's); the same
    tensor untracked is sliced (two rows a slice; a join of oneDNN's 2-D results comes back
    in Paddle's plain layout, one oneDNN cast in oneDNN's)."""
    monkeypatch.setattr(kernels, "CAST_SLICE_BYTES", 2 * 40 * 4)
    x = paddle.rand([8, 40])
    x.stop_gradient = False
    y = kernels.onednn_cast(x * 1, "float32", "bfloat16")
    assert "cast" in y.grad_fn.name().lower() and "ONEDNN" in str(y.layout)
    y.astype("float32").sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), np.ones([8, 40], np.float32))
    with paddle.no_grad():
        sliced = kernels.onednn_cast(x, "float32", "bfloat16")
    assert "ONEDNN" not in str(sliced.layout)
    np.testing.assert_array_equal(_bits(sliced), _bits(_whole(x, "float32", "bfloat16")))


@pytest.mark.parametrize("shape", [[], [4, 0], [0, 4], [300], [1, 300]])
def test_an_empty_tensor_a_scalar_and_a_single_row_are_cast(monkeypatch, shape):
    """An empty tensor (oneDNN's cast fails on one: Paddle's plain cast, nothing to round), a
    scalar and one row larger than a slice (cast whole)."""
    monkeypatch.setattr(kernels, "CAST_SLICE_BYTES", 16)
    x = paddle.to_tensor(np.ones(shape, np.float32))
    got = kernels.onednn_cast(x, "float32", "bfloat16")
    assert list(got.shape) == shape and got.dtype == paddle.bfloat16
    if 0 not in shape:
        np.testing.assert_array_equal(_bits(got), _bits(_whole(x, "float32", "bfloat16")))


ONE_CAST = r"""
import sys
import paddle
from paddle import _legacy_C_ops
from paddle.base import core
from paddle_amp.dygraph import kernels
kernels.onednn_cast(paddle.rand([4, 4]), "float32", "bfloat16")  # oneDNN set up
x = paddle.uniform([64, 128, 1024], min=-2.0, max=2.0)  # (one allocation: the peak so far)
base = int(core.host_memory_stat_current_value("Allocated", 0))
if hasattr(core, "host_memory_stat_reset_peak_value"):
    core.host_memory_stat_reset_peak_value("Allocated", 0)
if sys.argv[1] == "whole":
    out = _legacy_C_ops.cast(x, "in_dtype", kernels._vartype("float32"), "out_dtype",
                             kernels._vartype("bfloat16"), "use_mkldnn", True)
else:
    out = kernels.onednn_cast(x, "float32", "bfloat16")
print(int(core.host_memory_stat_peak_value("Allocated", 0)) - base)
"""


@pytest.mark.parametrize("how", ["whole", "sliced"])
def test_a_large_cast_holds_a_slices_copy_not_a_copy_of_its_input(how):
    """A float32 64x128x1024 activation (32 MiB) into bf16 (16 MiB), in a fresh process
    (Paddle 2.6 cannot reset its allocator's peak; the input is the process's largest
    allocation before it): one oneDNN cast holds Paddle's copy of the whole input beside the
    result (the cause, so this test says when a Paddle stops making it); in slices, at most
    the result, its pieces and one slice's copy."""
    import os
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-c", ONE_CAST, how], capture_output=True, text=True,
                       timeout=300, env={**os.environ, "GLOG_minloglevel": "3"})
    assert r.returncode == 0, r.stderr[-2000:]
    transient = int(r.stdout.strip().splitlines()[-1])
    if how == "whole":
        assert transient >= 32 * MIB + 16 * MIB
    else:
        assert transient <= 2 * 16 * MIB + 2 * kernels.CAST_SLICE_BYTES
