"""paddle_amp.dygraph.auto_cast on a CPU: bf16 for real where the device truth says oneDNN
runs it, float32 where it does not, fp16 emulated and labelled when asked; custom lists in
eager and program spelling; bad input refused before anything is switched on."""
import numpy as np
import paddle
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from amp_adapters import OpLists, Policy
from amp_adapters.rules.errors import AmpConfigError, ConflictingOpError, UnknownOpError
from amp_adapters.rules.isa import bf16_class, machine
from paddle_amp import dygraph as amp
from paddle_amp.dygraph import dispatch, frames, wrappers

BF16_CLASS = bf16_class(machine())
NO_BF16 = BF16_CLASS == "none"
ORIGINAL_MATMUL = paddle._C_ops.matmul


def _bf16_exact(a: np.ndarray) -> bool:
    """Every value is a bfloat16 (the low 16 bits of its float32 are zero)."""
    return bool((np.ascontiguousarray(a, np.float32).view(np.uint32) & 0xFFFF == 0).all())


def _data(seed=0):
    rng = np.random.default_rng(seed)
    x = paddle.to_tensor(rng.standard_normal((8, 32)).astype(np.float32))
    w = paddle.to_tensor(rng.standard_normal((32, 16)).astype(np.float32), stop_gradient=False)
    return x, w


@pytest.mark.skipif(NO_BF16, reason="the device truth (isa.bf16_class) says this CPU class has "
                                    "no oneDNN bf16 kernel (no AVX-512 in use)")
def test_matmul_runs_bf16_on_onednn_forward_and_backward():
    x, w = _data()
    with amp.auto_cast(dtype="bfloat16") as region:
        out = paddle.matmul(x, w)
    d = region.ran["matmul_v2"]
    assert (d.run_dtype, d.execution) == ("bfloat16", "kernel")
    assert out.dtype == paddle.float32  # handed back float32, exactly widened
    got, ref = out.numpy(), paddle.matmul(x, w).numpy()
    assert _bf16_exact(got) and not np.array_equal(got, ref)
    np.testing.assert_allclose(got, ref, rtol=3e-2, atol=3e-1)
    out.sum().backward()
    assert w.grad.dtype == paddle.float32 and np.isfinite(w.grad.numpy()).all()
    np.testing.assert_allclose(w.grad.numpy(), np.repeat(x.numpy().sum(0)[:, None], 16, 1),
                               rtol=3e-2, atol=3e-1)


@pytest.mark.skipif(NO_BF16, reason="the device truth (isa.bf16_class) says this CPU class has "
                                    "no oneDNN bf16 kernel (no AVX-512 in use)")
def test_linear_mlp_trains_through_bf16_with_data_that_wants_no_gradient():
    # the input wants no gradient: oneDNN's bf16 matmul_v2_grad crashes the process on that
    paddle.seed(0)
    net = paddle.nn.Sequential(paddle.nn.Linear(32, 64), paddle.nn.ReLU(),
                               paddle.nn.Linear(64, 4))
    x, _ = _data()
    with amp.auto_cast(dtype="bfloat16") as region:
        loss = net(x).mean()
    assert region.ran["matmul_v2"].execution == "kernel"
    loss.backward()
    assert all(p.grad is not None and np.isfinite(p.grad.numpy()).all()
               for p in net.parameters())


def test_where_the_device_has_no_bf16_kernel_the_op_runs_float32():
    if not NO_BF16:
        pytest.skip(f"this CPU runs bf16 ({BF16_CLASS}); run with AMP_ADAPTERS_CPU=avx2")
    x, w = _data()
    with amp.auto_cast(dtype="bfloat16") as region:
        out = paddle.matmul(x, w)
    assert region.ran["matmul_v2"].execution == "fell back"
    np.testing.assert_array_equal(out.numpy(), paddle.matmul(x, w).numpy())


def test_is_bfloat16_supported_tells_the_device_truth():
    assert amp.is_bfloat16_supported() is (not NO_BF16)
    assert amp.is_bfloat16_supported("cpu") is (not NO_BF16)
    assert amp.is_float16_supported() is False  # no fp16 GEMM in Paddle's CPU build


def test_fp16_is_emulated_and_labelled_only_when_asked():
    x, w = _data()
    with amp.auto_cast(dtype="float16", emulate=True) as region:
        out = paddle.matmul(x, w)
    d = region.ran["matmul_v2"]
    assert d.execution == "emulated" and "EMULATED" in d.reason
    got = out.numpy()
    assert np.array_equal(got.astype(np.float16).astype(np.float32), got)  # fp16 values
    assert not np.array_equal(got, paddle.matmul(x, w).numpy())
    with amp.auto_cast(dtype="float16") as region:  # no fp16 kernel here: float32
        out = paddle.matmul(x, w)
    assert region.ran["matmul_v2"].execution == "fell back"
    np.testing.assert_array_equal(out.numpy(), paddle.matmul(x, w).numpy())


@pytest.mark.parametrize("spelling", ["matmul", "matmul_v2"])
def test_custom_black_list_in_either_spelling(spelling):
    x, w = _data()
    with amp.auto_cast(dtype="float16", emulate=True, custom_black_list={spelling}) as region:
        out = paddle.matmul(x, w)
    assert region.ran["matmul_v2"].run_dtype == "float32"
    assert region.ran["matmul_v2"].execution is None
    np.testing.assert_array_equal(out.numpy(), paddle.matmul(x, w).numpy())


@pytest.mark.parametrize("spelling", ["matmul", "matmul_v2"])
def test_custom_white_list_in_either_spelling_over_a_policy(spelling):
    x, w = _data()
    keep = Policy.preset("O1", paddle_ops=OpLists(fp32={"matmul_v2"}))
    with amp.auto_cast(policy=keep, emulate=True) as region:
        paddle.matmul(x, w)
    assert region.ran["matmul_v2"].run_dtype == "float32"
    with amp.auto_cast(policy=keep, emulate=True, custom_white_list=[spelling]) as region:
        paddle.matmul(x, w)
    assert region.ran["matmul_v2"].execution == "emulated"


def test_without_policy_the_native_dygraph_lists_decide():
    from paddle.amp import amp_lists
    assert "matmul" in amp_lists.white_list()["bfloat16"]["O1"]
    x, w = _data()
    with amp.auto_cast(dtype="bfloat16", level="OD", emulate=True) as region:
        paddle.matmul(x, w)
    assert region.ran["matmul_v2"].category == "lower"
    with amp.auto_cast(enable=False) as region:
        out = paddle.matmul(x, w)
    assert region.ran == {} and np.array_equal(out.numpy(), paddle.matmul(x, w).numpy())


def test_nothing_is_wrapped_outside_a_region():
    assert paddle._C_ops.matmul is ORIGINAL_MATMUL
    with amp.auto_cast(dtype="bfloat16"):
        with amp.auto_cast(dtype="float16"):
            assert paddle._C_ops.matmul is not ORIGINAL_MATMUL
        assert paddle._C_ops.matmul is not ORIGINAL_MATMUL
    assert paddle._C_ops.matmul is ORIGINAL_MATMUL and frames.current() is None


@pytest.mark.parametrize("kwargs, error, words", [
    (dict(level="O3"), AmpConfigError, "level"),
    (dict(dtype="float8"), AmpConfigError, "dtype"),
    (dict(enable="yes"), TypeError, "enable"),
    (dict(custom_white_list="matmul"), AmpConfigError, "set, list or tuple"),
    (dict(custom_black_list={"matmull"}), UnknownOpError, "matmul"),
    (dict(custom_white_list={"matmul"}, custom_black_list=["matmul_v2"]), ConflictingOpError,
     "matmul"),
    (dict(policy="no-such-preset"), AmpConfigError, "preset"),
])
def test_bad_input_is_refused_before_anything_is_switched_on(kwargs, error, words):
    with pytest.raises(error, match=words):
        with amp.auto_cast(**kwargs):
            pytest.fail("entered the region")
    assert frames.current() is None and paddle._C_ops.matmul is ORIGINAL_MATMUL


@pytest.mark.parametrize("first", ["float32", "int32"])
def test_integer_inputs_run_as_they_are_whatever_came_first(first):
    # a region looks calls up by element size first (int32 and float32 are both 4 bytes)
    xf, wf = _data()
    xi = paddle.to_tensor(np.arange(6, dtype=np.int32).reshape(2, 3))
    wi = paddle.to_tensor(np.arange(12, dtype=np.int32).reshape(3, 4))
    with amp.auto_cast(dtype="float16", emulate=True) as region:
        order = [(xf, wf), (xi, wi)] if first == "float32" else [(xi, wi), (xf, wf)]
        outs = [paddle.matmul(a, b) for a, b in order]
    out_f, out_i = outs if first == "float32" else outs[::-1]
    assert out_i.dtype == paddle.int32
    np.testing.assert_array_equal(out_i.numpy(), xi.numpy() @ wi.numpy())
    assert region.ran["matmul_v2"].input_dtypes in ((None, None), ("float32", "float32"))
    got = out_f.numpy()
    assert np.array_equal(got.astype(np.float16).astype(np.float32), got)  # emulated fp16


@pytest.mark.skipif(NO_BF16, reason="the device truth (isa.bf16_class) says this CPU class has "
                                    "no oneDNN bf16 kernel (no AVX-512 in use)")
def test_a_broadcast_gemm_whose_bf16_gradient_is_slow_here_stays_float32():
    from paddle_amp.dygraph import kernels
    slow = "matmul_v2" in kernels.slow_broadcast_grads("bfloat16")  # oneDNN's log says
    rng = np.random.default_rng(1)
    w = paddle.to_tensor(rng.standard_normal((32, 16)).astype(np.float32), stop_gradient=False)
    seq = paddle.to_tensor(rng.standard_normal((4, 8, 32)).astype(np.float32))
    flat = paddle.to_tensor(rng.standard_normal((8, 32)).astype(np.float32))
    with amp.auto_cast(dtype="bfloat16") as region:
        paddle.matmul(flat, w)
        out = paddle.matmul(seq, w)
        flat_out = paddle.matmul(flat, w)  # after a 3-D call: still its own plan
    if not slow:  # (the route's gradient is oneDNN's mul's here: one plan for every rank)
        assert region.ran["matmul_v2"].execution == "kernel" and _bf16_exact(out.numpy())
        return
    plans = {k[-2:]: d for k, d in region.decisions.items() if k[-2:] in ((2, 2), (3, 2))}
    assert plans[(2, 2)].execution == "kernel" and _bf16_exact(flat_out.numpy())
    d = plans[(3, 2)]
    if slow:
        assert (d.execution, d.refusal) == ("fell back", "rule") and "reference" in d.reason
        np.testing.assert_array_equal(out.numpy(), paddle.matmul(seq, w).numpy())
    else:
        assert d.execution == "kernel"


@pytest.mark.skipif(NO_BF16, reason="the device truth (isa.bf16_class) says this CPU class has "
                                    "no oneDNN bf16 kernel (no AVX-512 in use)")
def test_a_callers_bf16_tensor_is_not_changed_to_want_a_gradient():
    x, w = _data()
    xb = x.astype("bfloat16")  # the caller's own bf16 value, no gradient wanted
    assert xb.stop_gradient
    with amp.auto_cast(dtype="bfloat16") as region:
        out = paddle.matmul(xb, w)
    assert region.ran["matmul_v2"].casts == (None, "bfloat16")
    out.sum().backward()
    assert xb.stop_gradient and w.grad is not None


def test_conv2d_is_decided_emulated_in_fp16_and_falls_back_in_bf16():
    paddle.seed(0)
    conv = paddle.nn.Conv2D(3, 8, 3, padding=1, bias_attr=False)
    x = paddle.to_tensor(np.random.default_rng(2).standard_normal((2, 3, 8, 8)).astype("f4"))
    ref = conv(x).numpy()
    with amp.auto_cast(dtype="float16", emulate=True) as region:
        out = conv(x).numpy()
    assert region.ran["conv2d"].execution == "emulated"
    assert np.array_equal(out.astype(np.float16).astype(np.float32), out)
    assert not np.array_equal(out, ref)
    with amp.auto_cast(dtype="bfloat16") as region:
        out = conv(x).numpy()
    d = region.ran["conv2d"]
    assert d.execution == "fell back" and "no bfloat16 kernel for conv2d" in d.reason
    np.testing.assert_array_equal(out, ref)


def test_regions_closed_out_of_order_close_the_right_one():
    cms = [amp.auto_cast(dtype="bfloat16") for _ in range(3)]
    a, b, c = (cm.__enter__() for cm in cms)
    cms[1].__exit__(None, None, None)  # a generator's region closed first (the middle one)
    stack = frames._regions.frames
    assert len(stack) == 2 and stack[0] is a and stack[1] is c
    cms[2].__exit__(None, None, None)
    assert frames.current() is a
    cms[0].__exit__(None, None, None)
    assert frames.current() is None and paddle._C_ops.matmul is ORIGINAL_MATMUL


def test_a_region_reaches_only_its_own_thread():
    import threading
    x, w = _data()
    seen = {}

    def reader():
        seen["region"] = frames.current()
        seen["out"] = paddle.matmul(x, w).numpy()

    with amp.auto_cast(dtype="float16", emulate=True) as region:
        t = threading.Thread(target=reader)
        t.start()
        t.join()
        paddle.matmul(x, w)
    assert region.ran["matmul_v2"].execution == "emulated"
    assert seen["region"] is None
    np.testing.assert_array_equal(seen["out"], paddle.matmul(x, w).numpy())  # float32 there


def test_a_flag_is_checked_whatever_was_cached_before():
    """``emulate=0`` is refused even after ``emulate=False`` was accepted (1 == True and
    hashes alike: the cache of checked policies keys each flag with its type)."""
    with amp.auto_cast(emulate=False):
        pass
    with pytest.raises(AmpConfigError, match="emulate"):
        with amp.auto_cast(emulate=0):
            pass


def test_a_patch_another_tool_makes_between_regions_stays_and_is_called():
    """Regions put back only their own wrapper: a profiler's patch of ``_C_ops.matmul``
    made after a first region is what ours calls inside the next, and is there after it."""
    from paddle import _C_ops
    with amp.auto_cast(dtype="float16", emulate=True):
        pass
    paddles, calls = _C_ops.matmul, []

    def theirs(*args, **kwargs):
        calls.append(1)
        return paddles(*args, **kwargs)
    _C_ops.matmul = theirs
    try:
        with amp.auto_cast(dtype="float16", emulate=True):
            assert _C_ops.matmul is not theirs
            paddle.matmul(paddle.ones([2, 2]), paddle.ones([2, 2]))
        assert _C_ops.matmul is theirs and calls
    finally:
        _C_ops.matmul = paddles


def test_a_cast_report_in_bf16_does_not_switch_a_float16_scaler_off():
    with amp.auto_cast(dtype="float16", emulate=True):
        pass
    scaler = amp.GradScaler(init_loss_scaling=8.0)
    amp.cast_report(paddle.nn.Linear(4, 4), paddle.ones([2, 4]), policy="O1-bf16")
    assert scaler.scale(paddle.ones([1])).item() == 8.0 and scaler.is_enable()


def test_a_bf16_region_in_another_thread_does_not_switch_this_threads_scaler_off():
    """The dtype a float16 ``GradScaler`` reads is its own thread's last region's: a bf16
    region open (or closed) in another thread is not this thread's training."""
    import threading
    entered, done, seen = threading.Event(), threading.Event(), {}

    def other():
        with amp.auto_cast(dtype="bfloat16"):
            entered.set()
            done.wait(10)

    def trainer():
        with amp.auto_cast(dtype="float16", emulate=True):
            pass
        scaler = amp.GradScaler(init_loss_scaling=8.0)
        entered.wait(10)
        seen["scaled"] = scaler.scale(paddle.ones([1])).item()
        seen["enabled"] = scaler.is_enable()
        seen["dtype"] = frames.last_dtype()

    threads = [threading.Thread(target=other), threading.Thread(target=trainer)]
    threads[0].start()
    threads[1].start()
    threads[1].join()
    done.set()
    threads[0].join()
    assert seen == {"scaled": 8.0, "enabled": True, "dtype": "float16"}


def test_a_region_closed_from_another_thread_is_closed():
    """A region opened here and closed by another thread (a generator finished there, a
    callback) leaves no region open here, and the last one out removes the wrappers."""
    import threading
    x, w = _data()
    plain = paddle.matmul(x, w).numpy()
    cm = amp.auto_cast(dtype="float16", emulate=True)
    frame = cm.__enter__()
    assert frames.current() is frame
    t = threading.Thread(target=cm.__exit__, args=(None, None, None))
    t.start()
    t.join()
    assert frames.current() is None
    assert paddle._C_ops.matmul is ORIGINAL_MATMUL
    np.testing.assert_array_equal(paddle.matmul(x, w).numpy(), plain)  # float32 again


def test_a_region_that_decides_nothing_wraps_nothing():
    """``enable=False`` (O0) decides nothing: no entry point is wrapped for it, so its ops
    cost what they cost without AMP; a region that decides opens the wrappers as before."""
    with amp.auto_cast(enable=False):
        assert paddle._C_ops.matmul is ORIGINAL_MATMUL
        with amp.auto_cast(dtype="float16", emulate=True):
            assert paddle._C_ops.matmul is not ORIGINAL_MATMUL
        assert paddle._C_ops.matmul is ORIGINAL_MATMUL
    assert paddle._C_ops.matmul is ORIGINAL_MATMUL


def test_a_float32_call_the_region_keeps_float32_is_not_planned_per_call(monkeypatch):
    """What the region knows at entry (a float32 ``matmul`` runs as it is under this policy)
    is not planned again per call; a bf16 input still is (cast up, as the policy says)."""
    x, w = _data()
    with amp.auto_cast(dtype="bfloat16", custom_black_list={"matmul_v2"}) as region:
        paddle.matmul(x, w)  # (a first call, before the probe below)
        planned = []
        real = wrappers._planned
        monkeypatch.setattr(wrappers, "_planned", lambda *a: planned.append(a) or real(*a))
        out = paddle.matmul(x, w)
        assert planned == [] and region.ran["matmul_v2"].run_dtype == "float32"
        low = paddle.matmul(x.astype("bfloat16"), w.astype("bfloat16"))
        assert len(planned) == 1 and low.dtype == paddle.float32
    np.testing.assert_array_equal(out.numpy(), paddle.matmul(x, w).numpy())


_KINDS = {"O0": dict(enable=False), "fp16": dict(dtype="float16", emulate=True),
          "keep": dict(dtype="bfloat16", custom_black_list={"matmul_v2"})}


@settings(max_examples=25, deadline=None)
@given(st.lists(st.one_of(st.tuples(st.just("open"), st.sampled_from(sorted(_KINDS))),
                          st.tuples(st.just("close"), st.integers(0, 5), st.booleans())),
                max_size=10))
def test_regions_opened_and_closed_in_any_order_from_any_thread(steps):
    """Regions opened in any order and closed in any order, some from another thread: this
    thread's innermost open region is ``current()``, the last deciding region in it is the
    dtype its scaler reads, and the wrappers are installed exactly while a region that
    decides (not ``O0``) is open; all closed, nothing stays."""
    import threading
    opened = []  # (kind, context manager, frame), in opening order
    last = frames.last_dtype()
    try:
        for step in steps:
            if step[0] == "open":
                cm = amp.auto_cast(**_KINDS[step[1]])
                opened.append((step[1], cm, cm.__enter__()))
                if step[1] != "O0":
                    last = opened[-1][2].policy.dtype
            elif opened:
                _, cm, _ = opened.pop(step[1] % len(opened))
                if step[2]:
                    t = threading.Thread(target=cm.__exit__, args=(None, None, None))
                    t.start()
                    t.join()
                else:
                    cm.__exit__(None, None, None)
            assert frames.current() is (opened[-1][2] if opened else None)
            deciding = any(kind != "O0" for kind, _, _ in opened)
            assert (paddle._C_ops.matmul is not ORIGINAL_MATMUL) == deciding
            assert frames.last_dtype() == last
    finally:
        for _, cm, _ in reversed(opened):
            cm.__exit__(None, None, None)
    assert frames.current() is None and paddle._C_ops.matmul is ORIGINAL_MATMUL


def test_a_missing_kernel_is_warned_once_in_the_cores_words_and_then_kept_quiet(
        monkeypatch, caplog):
    """A GEMM without a float16 kernel here (every CPU class): the core's per-op warning
    (``FallbackNotices``: "matmul_v2 on CPU: ...; pass emulate=True"), once; a region
    opened before the warning plans the op (so the warning is said), one opened after hands
    it on as it is (``quiet``)."""
    import logging

    from amp_adapters.services.fallback import FallbackNotices
    monkeypatch.setattr(frames, "_notices", FallbackNotices("paddle_amp.dygraph"))
    monkeypatch.setattr(dispatch, "_quiet", {})
    x, w = _data()
    with caplog.at_level(logging.WARNING, logger="paddle_amp.dygraph"):
        for _ in range(2):
            with amp.auto_cast(dtype="float16") as region:
                quiet_at_entry = "matmul_v2" in region.quiet
                paddle.matmul(x, w)
            if _ == 0:
                assert not quiet_at_entry  # not yet warned: planned, and said
    assert quiet_at_entry  # warned since: handed on as it is
    lines = [r.getMessage() for r in caplog.records if r.name == "paddle_amp.dygraph"]
    assert len(lines) == 1 and lines[0].startswith("matmul_v2 on CPU: "), lines
    assert lines[0].endswith("; pass emulate=True to emulate float16"), lines


@pytest.mark.skipif(NO_BF16, reason="the eager route that fails is bf16's: this CPU class has "
                                    "no oneDNN bf16 kernel at all")
def test_a_route_that_fails_in_eager_mode_says_why_in_the_cores_warning(monkeypatch, caplog):
    import logging

    from amp_adapters.services.fallback import FallbackNotices
    from paddle_amp.dygraph import kernels
    why = kernels.missing_routes("bfloat16").get("conv2d")
    if why is None:
        pytest.skip("conv2d's eager oneDNN route runs on this Paddle")
    monkeypatch.setattr(frames, "_notices", FallbackNotices("paddle_amp.dygraph"))
    with caplog.at_level(logging.WARNING, logger="paddle_amp.dygraph"):
        with amp.auto_cast(dtype="bfloat16"):
            paddle.nn.functional.conv2d(paddle.rand([2, 3, 8, 8]), paddle.rand([4, 3, 3, 3]))
    lines = [r.getMessage() for r in caplog.records if r.name == "paddle_amp.dygraph"]
    assert lines == [line for line in lines if line.startswith("conv2d on CPU: ")] and \
        len(lines) == 1, lines
    assert f"(its oneDNN route fails in eager mode: {why})" in lines[0]
