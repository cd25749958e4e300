"""Edges of paddle_amp.dygraph's regions met in review: an ``enable=False`` region inside a
program keeps its ops float32 whatever region is around it; an error while a region writes
its program still closes it; Paddle's keyword forms of the wrapped ops work in a region;
``Tensor @`` is decided as ``paddle.matmul``; a Layer tree rebuilt under the same count is
seen anew; a foreign patch of an op does not loop into our wrapper."""
import numpy as np
import paddle
import pytest

from amp_adapters.rules.isa import bf16_class, machine
from paddle_amp import dygraph as amp
from paddle_amp.dygraph import frames, wrappers

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


PADDLE3 = int(paddle.__version__.split(".")[0]) >= 3


def _keyword_forms(x, w, wt):
    """form -> (the call with keywords, its positional twin)."""
    plain = lambda: paddle.matmul(x, w)  # noqa: E731
    forms = {"name": (lambda: paddle.matmul(x, w, name="mm"), plain),
             "x=, y=": (lambda: paddle.matmul(x=x, y=w), plain),
             "transpose_y=": (lambda: paddle.matmul(x, wt, transpose_y=True),
                              lambda: paddle.matmul(x, wt, False, True)),
             "method name=": (lambda: x.matmul(w, name="mm"), plain)}
    if PADDLE3:  # Paddle 3's torch-style aliases
        forms["input=, other="] = (lambda: paddle.matmul(input=x, other=w), plain)
    return forms


@pytest.mark.parametrize("region", [dict(dtype="bfloat16"),
                                    dict(dtype="bfloat16", custom_black_list={"matmul_v2"})])
def test_paddles_keyword_forms_of_matmul_work_in_a_region_and_are_decided(region):
    """Paddle 3.3.1 hands ``paddle.matmul``'s keywords to ``_C_ops.matmul``: each form gives
    in a region what the positional call gives there (lowered, or float32 where kept)."""
    x, w = _xw()
    wt = paddle.to_tensor(w.numpy().T.copy())
    with amp.auto_cast(**region):
        for form, (call, twin) in _keyword_forms(x, w, wt).items():
            np.testing.assert_array_equal(call().numpy(), twin().numpy(), err_msg=form)


@pytest.mark.skipif(not PADDLE3, reason="Paddle 2.6.2's matmul has no out=")
def test_matmul_out_keyword_receives_the_regions_result():
    x, w = _xw()
    out = paddle.zeros([4, 8])
    with amp.auto_cast(dtype="bfloat16"):
        want = paddle.matmul(x, w).numpy()
        paddle.matmul(x, w, out=out)
    np.testing.assert_array_equal(out.numpy(), want)


def test_a_matmul_keyword_paddle_does_not_know_is_a_clear_type_error():
    x, w = _xw()
    with amp.auto_cast(dtype="bfloat16"):
        with pytest.raises((TypeError, ValueError)):
            wrappers._matmul(x, w, bogus=1)


@pytest.mark.legacy_ir
def test_an_error_while_a_region_writes_its_program_still_closes_it(monkeypatch):
    """Whatever fails in the write at a region's exit, the region is closed and Paddle's
    ops are unwrapped (eager mode after it is not decided by a dead region)."""
    from paddle_amp.dygraph import legacy

    def fails(*args, **kwargs):
        raise RuntimeError("injected: the rewrite failed")

    def f(x, w):
        with amp.auto_cast(dtype="bfloat16"):
            return paddle.matmul(x, w)

    monkeypatch.setattr(legacy, "rewrite", fails)
    x, w = _xw()
    with pytest.raises(Exception, match="injected"):
        paddle.jit.to_static(f, full_graph=True)(x, w)
    assert frames.current() is None and frames._open[0] == 0
    assert paddle._C_ops.matmul is not wrappers._matmul


@BF16_ONLY
def test_the_matmul_operator_is_decided_as_paddle_matmul_and_restored_after():
    """``x @ w`` in a region is what ``paddle.matmul`` is there (bf16 here), as Paddle's
    native AMP and a program lower it; after the region the operator is Paddle's again, put
    back by its first use outside (``wrappers._SITES``: parked till then)."""
    x, w = _xw()
    ref = (x @ w).numpy()  # (a use outside: an operator parked by an earlier test goes back)
    before = paddle.Tensor.__matmul__
    with amp.auto_cast(dtype="bfloat16"):
        want = paddle.matmul(x, w).numpy()
        got = (x @ w).numpy()
    np.testing.assert_array_equal(got, want)
    assert not np.array_equal(got, ref)
    np.testing.assert_array_equal((x @ w).numpy(), ref)
    assert paddle.Tensor.__matmul__ is before


def test_a_layer_rule_by_path_follows_a_replaced_sublayer():
    """A sublayer replaced by another (the same count of sublayers: a new head) gets its
    path, so the policy's layer rule still reaches it."""
    from amp_adapters import LayerLists, Policy
    policy = Policy.preset("O1", emulate=True).replace(paddle_layers=LayerLists(fp32={"1"}))
    paddle.seed(0)
    m = paddle.nn.Sequential(paddle.nn.Linear(8, 8), paddle.nn.Linear(8, 8))
    x = paddle.ones([4, 8])
    with amp.auto_cast(policy=policy):
        m(x)
    keep = m[1]  # (alive: a new layer cannot take its id)
    m[1] = paddle.nn.Linear(8, 8)
    layers = [(d.precision, d.layer) for d in amp.cast_report(m, x, policy=policy).decisions]
    assert ("float32", "1") in layers, layers
    assert keep is not m[1]


def _net():
    return paddle.nn.Sequential(paddle.nn.Linear(8, 8), paddle.nn.ReLU(),
                                paddle.nn.Linear(8, 4))


def test_cast_report_of_a_to_static_model_reports_its_ops_each_time():
    """A ``to_static`` model, fresh or traced before under the same policy, reports what the
    eager model reports, and again on a second report (its program cached)."""
    paddle.seed(0)

    x = paddle.ones([4, 8])
    want = [d.precision for d in amp.cast_report(_net(), x, dtype="bfloat16").decisions]
    assert len(want) == 2
    fresh = paddle.jit.to_static(_net(), full_graph=True)
    got = [d.precision for d in amp.cast_report(fresh, x, dtype="bfloat16").decisions]
    assert got == want
    traced = paddle.jit.to_static(_net(), full_graph=True)
    with paddle.no_grad(), amp.auto_cast(dtype="bfloat16"):
        traced(x)
    for _ in range(2):
        got = [d.precision for d in amp.cast_report(traced, x, dtype="bfloat16",
                                                     training=False).decisions]
        assert got == want


def test_ran_follows_each_call_and_an_integer_op_is_recorded_as_it_runs():
    """``ran`` holds the latest call's decision, its plan cached or not; an op on integer
    inputs is recorded as running as it is (no low dtype, no cast)."""
    x, w = _xw()
    x64, w64 = x.astype("float64"), w.astype("float64")
    with amp.auto_cast(dtype="bfloat16", custom_black_list={"conv2d"}) as region:
        seen = []
        for a, b in ((x, w), (x64, w64), (x, w)):
            paddle.matmul(a, b)
            seen.append(region.ran["matmul_v2"].input_dtypes)
    assert seen == [("float32",) * 2, ("float64",) * 2, ("float32",) * 2]

    class M(paddle.nn.Layer):
        def forward(self, i, j):
            return paddle.matmul(i, j)

    i = paddle.ones([2, 3], dtype="int64")
    j = paddle.ones([3, 4], dtype="int64")
    (d,) = amp.cast_report(M(), i, j, dtype="bfloat16").decisions
    assert d.precision is None and d.run_dtype is None and d.low_dtype is None
    assert not d.needs_action


def test_a_tools_patch_made_inside_a_region_never_becomes_our_original():
    """Another tool wraps ``_C_ops.matmul`` while a region is open (its inner op is our
    wrapper): later regions still reach Paddle's op through it, with no recursion, and
    the tool's patch sees the calls."""
    x, w = _xw()
    paddle_op = paddle._C_ops.matmul  # (outside a region: Paddle's own)
    seen = []
    try:
        with amp.auto_cast(dtype="bfloat16"):
            inner = paddle._C_ops.matmul

            def tool_patch(*args, **kwargs):
                seen.append(1)
                return inner(*args, **kwargs)

            paddle._C_ops.matmul = tool_patch
        want = paddle_op(x, w, False, False).numpy()  # (2.6.2 needs all four)
        for region in (dict(dtype="bfloat16"),
                       dict(dtype="bfloat16", custom_black_list={"matmul_v2"})):
            with amp.auto_cast(**region):
                got = paddle._C_ops.matmul(x, w, False, False).numpy()
            assert got.shape == want.shape
        assert len(seen) == 2
    finally:
        paddle._C_ops.matmul = paddle_op


def _pir() -> bool:
    return bool(paddle.framework.use_pir_api()) if hasattr(paddle.framework, "use_pir_api") \
        else False


def test_cast_report_of_a_sot_model_reports_its_ops_once_each_time():
    """A ``to_static(full_graph=False)`` model (SOT) reports what eager mode decides, each
    op once, on every report (SOT's own cache is not keyed by the region)."""
    if PADDLE3 and not _pir():
        pytest.skip("Paddle 3's SOT translator runs only in PIR (FLAGS_enable_pir_api=1)")
    paddle.seed(0)

    x = paddle.ones([4, 8])
    want = [d.precision for d in amp.cast_report(_net(), x, dtype="bfloat16").decisions]
    sot = paddle.jit.to_static(_net(), full_graph=False)
    for _ in range(2):
        assert [d.precision for d in amp.cast_report(sot, x, dtype="bfloat16").decisions] \
            == want


def test_a_region_whose_layer_tracking_fails_is_closed_before_the_error_goes_on(monkeypatch):
    """A region with layer rules opened inside a forward follows the Layer calls running
    (``layer_paths.adopt``); if that raises, the error reaches the caller and the region is
    closed again: no region open, Paddle's own ops and ``Layer.__call__`` back."""
    from amp_adapters.rules.layers import LayerLists
    from amp_adapters.rules.policy import Policy
    from paddle_amp.dygraph import layer_paths

    policy = Policy.preset("O1-bf16").replace(paddle_layers=LayerLists(fp32={"0"}))
    native_matmul, native_call = paddle._C_ops.matmul, paddle.nn.Layer.__call__

    def broken():
        raise RuntimeError("a Layer tree that cannot be walked")
    monkeypatch.setattr(layer_paths, "adopt", broken)

    class Net(paddle.nn.Layer):
        def __init__(self):
            super().__init__()
            self.fc = paddle.nn.Linear(8, 8)

        def forward(self, x):
            with amp.auto_cast(policy=policy):
                return self.fc(x)

    with pytest.raises(RuntimeError, match="cannot be walked"):
        Net()(_xw()[0])
    assert frames.current() is None and frames._open[0] == 0
    assert paddle._C_ops.matmul is native_matmul and paddle.nn.Layer.__call__ is native_call
