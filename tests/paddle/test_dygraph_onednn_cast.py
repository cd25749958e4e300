"""oneDNN's cast in eager mode (``paddle_amp.dygraph.kernels.onednn_cast``): the rounding
cast into bf16 where Paddle's plain cast truncates (Paddle 2.6.2), and the recast of a copy
in the backward there.

Paddle's eager entry to a oneDNN kernel copies each input whole before the kernel runs
(``PreparePhiData``), so one cast of a large activation held a float32 copy of it beside
the result. A large untracked input is cast in slices instead: elementwise, so the same
bits as one cast (checked against one cast, ties and non-finite values included), and the
bytes Paddle's host allocator hands out at once are counted exactly (``Allocated``: live
tensor bytes, not the process's memory; Paddle 3 resets its peak, 2.6 cannot).

oneDNN's cast runs on any CPU this project supports (it is a reorder, not a bf16 GEMM)."""
import numpy as np
import paddle
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from paddle import _legacy_C_ops
from paddle.base import core

from paddle_amp.dygraph import kernels

RESETS = hasattr(core, "host_memory_stat_reset_peak_value")
NO_RESET = pytest.mark.skipif(not RESETS, reason=(
    "Paddle 2.6's host allocator cannot reset its peak (host_memory_stat_reset_peak_value), "
    "so one call's transient cannot be read"))
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
    a tensor autograd records is cast in one op (its gradient node is the cast's)."""
    monkeypatch.setattr(kernels, "CAST_SLICE_BYTES", 64)
    x = paddle.rand([8, 40])
    x.stop_gradient = False
    y = kernels.onednn_cast(x * 1, "float32", "bfloat16")
    assert "cast" in y.grad_fn.name().lower()
    y.astype("float32").sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), np.ones([8, 40], np.float32))
    with paddle.no_grad():  # untracked, the same tensor is sliced (its result is a join)
        assert kernels.onednn_cast(x, "float32", "bfloat16").stop_gradient


@NO_RESET
def test_a_large_cast_holds_a_slices_copy_not_a_copy_of_its_input():
    """A float32 64x128x1024 activation (32 MiB) into bf16 (16 MiB): one oneDNN cast holds
    Paddle's copy of the whole input beside the result (the cause, so this test says when
    a Paddle stops making it); in slices, at most the result, its pieces and one slice's
    copy."""
    x = paddle.uniform([64, 128, 1024], min=-2.0, max=2.0)
    kernels.onednn_cast(paddle.rand([4, 4]), "float32", "bfloat16")  # oneDNN set up

    def transient(cast) -> int:
        base = int(core.host_memory_stat_current_value("Allocated", 0))
        core.host_memory_stat_reset_peak_value("Allocated", 0)
        out = cast()
        peak = int(core.host_memory_stat_peak_value("Allocated", 0))
        del out
        return peak - base
    whole = transient(lambda: _whole(x, "float32", "bfloat16"))
    sliced = transient(lambda: kernels.onednn_cast(x, "float32", "bfloat16"))
    assert whole >= 32 * MIB + 16 * MIB
    assert sliced <= 2 * 16 * MIB + 2 * kernels.CAST_SLICE_BYTES
