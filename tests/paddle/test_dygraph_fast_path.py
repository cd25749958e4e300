"""The wrappers' fast path (``paddle_amp.dygraph.frames``, "The fast path"): a float32 call a
region hands on as it is is recorded once per region, not per call, and the path closes
whenever handing a call on unrecorded would lose something: a region opened inside (in this
thread or another) that casts, another input dtype recorded, a region closed. And the Tensor's
``@``, parked between regions (not set on the Tensor class at every region's exit), is Paddle's
outside them."""
import threading

import numpy as np
import paddle
from hypothesis import example, given, settings
from hypothesis import strategies as st

from paddle_amp import dygraph as amp

F = paddle.nn.functional
KEEP = dict(dtype="bfloat16", custom_black_list={"matmul_v2", "conv2d"})  # hands float32 on
CASTS = dict(dtype="float16", emulate=True)  # emulates float16 on every CPU class


def _xw():
    rng = np.random.default_rng(0)
    x = paddle.to_tensor(rng.uniform(-1, 1, (4, 8)).astype("float32"))
    w = paddle.to_tensor(rng.uniform(-1, 1, (8, 8)).astype("float32"))
    return x, w


def _float16_exact(a: np.ndarray) -> bool:
    """Every value is a float16 (an emulated op rounds its result through float16)."""
    return bool((a.astype(np.float16).astype(np.float32) == a).all())


class _CountingDict(dict):
    def __init__(self, *args):
        super().__init__(*args)
        self.writes = 0

    def __setitem__(self, key, value):
        self.writes += 1
        super().__setitem__(key, value)


def test_a_float32_call_handed_on_is_recorded_once_per_region_not_per_call():
    """The region's record (``ran``) says what the op ran under, written by the first such
    call; the calls after it (``paddle.matmul``, ``x @ w``, ``F.linear``) write nothing."""
    x, w = _xw()
    plain = paddle.matmul(x, w).numpy()
    with amp.auto_cast(**KEEP) as region:
        paddle.matmul(x, w)
        region.ran = _CountingDict(region.ran)
        outs = [f(x, w) for _ in range(3) for f in (paddle.matmul, paddle.Tensor.__matmul__,
                                                    F.linear)]
    assert region.ran.writes == 0
    assert region.ran["matmul_v2"].input_dtypes == ("float32", "float32")
    assert region.ran["matmul_v2"].run_dtype == "float32"
    for out in outs:
        np.testing.assert_array_equal(out.numpy(), plain)


def test_a_region_opened_in_another_thread_casts_while_this_threads_calls_are_handed_on():
    """This thread's region hands its float32 calls on unrecorded; a region that casts,
    opened meanwhile in another thread, casts there and records it; this one's record is its
    own."""
    x, w = _xw()
    plain = paddle.matmul(x, w).numpy()
    seen = {}

    def other():
        with amp.auto_cast(**CASTS) as theirs:
            seen["out"] = paddle.matmul(x, w).numpy()
            seen["execution"] = theirs.ran["matmul_v2"].execution

    with amp.auto_cast(**KEEP) as mine:
        paddle.matmul(x, w)
        paddle.matmul(x, w)
        t = threading.Thread(target=other)
        t.start()
        t.join()
        out = paddle.matmul(x, w).numpy()
    assert seen["execution"] == "emulated" and _float16_exact(seen["out"])
    assert mine.ran["matmul_v2"].execution is None
    np.testing.assert_array_equal(out, plain)


def test_the_tensor_operator_is_set_once_for_regions_in_a_row_and_is_paddles_outside():
    """Regions entered and left in a row (a training loop's steps) leave the Tensor's ``@``
    as the first one set it: each exit does not set the Tensor class again (which would
    make CPython refill its Tensor attribute caches). Its first use outside a region gives
    Paddle's result and puts Paddle's operator back."""
    x, w = _xw()
    plain = (x @ w).numpy()
    paddles = paddle.Tensor.__matmul__
    with amp.auto_cast(**CASTS):
        ours = paddle.Tensor.__matmul__
        emulated = (x @ w).numpy()
    for _ in range(2):
        assert paddle.Tensor.__matmul__ is ours
        with amp.auto_cast(**KEEP):
            assert paddle.Tensor.__matmul__ is ours
            np.testing.assert_array_equal((x @ w).numpy(), plain)
    with amp.auto_cast(enable=False):  # (decides nothing: Paddle's operator)
        np.testing.assert_array_equal((x @ w).numpy(), plain)
    assert paddle.Tensor.__matmul__ is paddles is not ours
    np.testing.assert_array_equal((x @ w).numpy(), plain)
    assert _float16_exact(emulated) and not np.array_equal(emulated, plain)


def test_a_patch_of_the_parked_operator_is_called_and_does_not_loop_into_ours():
    """A tool's patch of ``Tensor.__matmul__`` made between regions (over our parked
    wrapper, which it calls) stays and is called in the next region and after it; an
    operand that is not a Tensor (a NumPy array) reaches Paddle's operator, not the patch
    again (the two would call each other for good)."""
    x, w = _xw()
    plain = (x @ w).numpy()
    with amp.auto_cast(**KEEP):
        pass
    parked, calls = paddle.Tensor.__matmul__, []

    def theirs(a, b):
        calls.append(1)
        return parked(a, b)
    paddle.Tensor.__matmul__ = theirs
    try:
        with amp.auto_cast(**KEEP):
            assert paddle.Tensor.__matmul__ is theirs
            np.testing.assert_array_equal((x @ w.numpy()).numpy(), plain)
            np.testing.assert_array_equal((x @ w).numpy(), plain)
        np.testing.assert_array_equal((x @ w.numpy()).numpy(), plain)
        assert paddle.Tensor.__matmul__ is theirs and len(calls) == 3
    finally:
        paddle.Tensor.__matmul__ = parked
        x @ w  # (parked: its first use outside puts Paddle's back)


_OPS = {
    "matmul": (lambda x, w: paddle.matmul(x, w), "matmul_v2"),
    "@": (lambda x, w: x @ w, "matmul_v2"),
    "linear": (lambda x, w: F.linear(x, w), "matmul_v2"),
    "conv2d": (lambda x, w: F.conv2d(x.reshape([1, 2, 4, 4]), w.reshape([8, 2, 2, 2])),
               "conv2d"),
}


@settings(max_examples=40, deadline=None)
@given(st.lists(st.one_of(
    st.sampled_from([("open", "keep"), ("open", "casts"), ("close",)]),
    st.tuples(st.just("call"), st.sampled_from(sorted(_OPS)),
              st.sampled_from(["float32", "float64", "bfloat16"]))), max_size=12))
# another dtype recorded between two float32 calls; an inner region closed before the outer
# one has recorded anything
@example([("open", "keep"), ("call", "matmul", "float32"), ("call", "@", "bfloat16"),
          ("call", "linear", "float32")])
@example([("open", "keep"), ("open", "keep"), ("call", "matmul", "float32"), ("close",),
          ("call", "matmul", "float32")])
@example([("open", "keep"), ("call", "conv2d", "float32"), ("open", "casts"),
          ("call", "conv2d", "float32"), ("close",), ("call", "conv2d", "float64"),
          ("call", "conv2d", "float32")])
def test_every_call_is_recorded_and_decided_by_its_regions_policy(steps):
    """Regions that hand float32 on and regions that cast, nested in any order, and calls of
    each wrapped op on float32, float64 and bfloat16 inputs: after each call the innermost
    region's record is that call's (its input dtypes), a float32 call in a region that casts
    is emulated (its result rounded through float16), and one in a region that keeps it
    float32 gives Paddle's own result."""
    x, w = _xw()
    plain = {name: fn(x, w).numpy() for name, (fn, _) in _OPS.items()}  # (no region open)
    opened = []  # (kind, context manager, frame)
    try:
        for step in steps:
            if step[0] == "open":
                cm = amp.auto_cast(**(KEEP if step[1] == "keep" else CASTS))
                opened.append((step[1], cm, cm.__enter__()))
            elif step[0] == "close":
                if opened:
                    opened.pop()[1].__exit__(None, None, None)
            elif opened or step[2] != "bfloat16":  # (Paddle has no bf16 GEMM kernel here)
                fn, op = _OPS[step[1]]
                out = fn(x.astype(step[2]), w.astype(step[2]))
                if not opened:
                    continue
                kind, _, region = opened[-1]
                d = region.ran[op]
                assert d.input_dtypes == (step[2], step[2]), (step, d)
                if step[2] == "float32" and kind == "casts":
                    assert d.execution == "emulated" and _float16_exact(out.numpy())
                elif step[2] == "float32":
                    assert d.execution is None
                    np.testing.assert_array_equal(out.numpy(), plain[step[1]])
    finally:
        for _, cm, _ in reversed(opened):
            cm.__exit__(None, None, None)
