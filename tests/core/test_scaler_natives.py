"""DynamicLossScale against the natives' own loss-scale state machines, step by step.

Each native is driven with the same long random overflow sequence (long clean
runs mixed with bursts, short growth intervals so growth really happens) and
its full state is compared with ours after every step:

- Paddle: the real ``update_loss_scaling`` op, run on CPU in a legacy-IR static
  program whose scale / good / bad counters live in a scope (2.6.2 and 3.3.1);
- torch: ``torch._amp_update_scale_`` (the kernel ``GradScaler.update`` calls)
  and a real ``torch.amp.GradScaler`` driving a one-parameter SGD optimizer;
- MXNet: ``mxnet.contrib.amp.loss_scaler.LossScaler.has_overflow`` on CPU
  parameters (its state machine needs no GPU), which applies a new scale one
  step later than our core does.

Every framework is optional: its tests skip (pytest.importorskip) where it is
not installed.
"""
import math
import os

# Paddle 3.x defaults to PIR, under which the static AMP ops are not built; the
# legacy program IR must be chosen before paddle is first imported.
os.environ.setdefault("FLAGS_enable_pir_api", "0")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from amp_adapters import AmpConfigError, DynamicLossScale  # noqa: E402

F32_MAX = float(np.finfo(np.float32).max)
# `make test` installs no torch (from PyPI it is the CUDA build, gigabytes); .ci/run adds the CPU
# wheel. Elsewhere: pip install torch --index-url https://download.pytorch.org/whl/cpu
NO_TORCH = ("torch oracle: no torch installed (make test never installs it; .ci/run installs "
            "the CPU wheel, or pip install torch from PyTorch's CPU index)")


def f32(x):
    return float(np.float32(x))


def overflow_sequence(seed, n, p_burst=0.08, p_calm=0.25, p_inf_burst=0.8, p_inf_calm=0.01):
    """``n`` found_inf flags from a two-state Markov chain: long clean runs, overflow bursts."""
    rng = np.random.default_rng(seed)
    out, burst = [], False
    for _ in range(n):
        burst = rng.random() < (1 - p_calm if burst else p_burst)
        out.append(bool(rng.random() < (p_inf_burst if burst else p_inf_calm)))
    return out


def core_trajectory(state, flags):
    """[state after step 0, after step 1, ...] for our core."""
    states = []
    for f in flags:
        state = state.adjust(f)
        states.append(state)
    return states


def assert_moves_both_ways(scales, start):
    """The sequence must exercise growth and back-off, or the comparison proves little."""
    prev, up, down = start, 0, 0
    for s in scales:
        up += s > prev
        down += s < prev
        prev = s
    assert up >= 3 and down >= 3, (up, down)


def test_overflow_sequences_mix_runs_and_bursts():
    flags = overflow_sequence(1, 400)
    assert 0.1 < sum(flags) / len(flags) < 0.6
    runs = "".join("x" if f else "." for f in flags)
    assert "." * 15 in runs and "xxx" in runs


# --------------------------------------------------------------------------- Paddle

@pytest.fixture
def paddle_static():
    """Paddle in static (legacy IR) mode for one test; dynamic mode is restored after."""
    paddle = pytest.importorskip("paddle")
    was_dynamic = paddle.in_dynamic_mode()
    paddle.enable_static()
    try:
        in_pir = getattr(paddle.framework, "in_pir_mode", lambda: False)
        if in_pir():
            pytest.skip("paddle runs the PIR; the update_loss_scaling program needs the legacy "
                        "IR: set FLAGS_enable_pir_api=0 before paddle is imported")
        yield paddle
    finally:
        if was_dynamic:
            paddle.disable_static()
    assert paddle.in_dynamic_mode() == was_dynamic


class PaddleUpdateLossScaling:
    """One ``update_loss_scaling`` op in a fresh Program; its state is kept in a fresh Scope."""

    def __init__(self, paddle, init_scale, incr_every_n_steps, decr_every_n_nan_or_inf,
                 incr_ratio, decr_ratio, good=0, bad=0):
        from paddle.static.amp import amp_nn

        self.paddle = paddle
        self.main, startup = paddle.static.Program(), paddle.static.Program()
        self.scope = paddle.static.Scope()
        with paddle.utils.unique_name.guard(), paddle.static.program_guard(self.main, startup):
            self.grad = paddle.static.data("grad", [3], "float32")
            self.found_inf = paddle.static.data("found_inf", [1], "bool")
            state = lambda name, dtype: paddle.static.create_global_var(  # noqa: E731
                [1], 0, dtype, persistable=True, name=name)
            self.scale = state("loss_scaling", "float32")
            self.good = state("num_good_steps", "int32")
            self.bad = state("num_bad_steps", "int32")
            amp_nn.update_loss_scaling(
                [self.grad], self.found_inf, self.scale, self.good, self.bad,
                incr_every_n_steps=incr_every_n_steps,
                decr_every_n_nan_or_inf=decr_every_n_nan_or_inf,
                incr_ratio=incr_ratio, decr_ratio=decr_ratio, stop_update=False)
        ops = [op.type for op in self.main.global_block().ops]
        assert ops == ["update_loss_scaling"], ops
        self.exe = paddle.static.Executor(paddle.CPUPlace())
        with paddle.static.scope_guard(self.scope):
            self.exe.run(startup)
        place = paddle.CPUPlace()
        for name, value in (("loss_scaling", np.float32(init_scale)),
                            ("num_good_steps", np.int32(good)), ("num_bad_steps", np.int32(bad))):
            self.scope.find_var(name).get_tensor().set(np.array([value]), place)

    def read_scope(self):
        get = lambda name: np.array(self.scope.find_var(name).get_tensor())  # noqa: E731
        scale, good, bad = get("loss_scaling"), get("num_good_steps"), get("num_bad_steps")
        assert scale.dtype == np.float32 and scale.shape == good.shape == bad.shape == (1,)
        return float(scale[0]), int(good[0]), int(bad[0])

    def step(self, found_inf):
        grad = np.full(3, np.inf if found_inf else 0.5, np.float32)
        with self.paddle.static.scope_guard(self.scope):
            scale, good, bad = self.exe.run(
                self.main, feed={"grad": grad, "found_inf": np.array([found_inf])},
                fetch_list=[self.scale, self.good, self.bad])
        assert scale.dtype == np.float32
        return float(scale[0]), int(good[0]), int(bad[0])


PADDLE_CASES = [
    # init, incr_every_n_steps, decr_every_n_nan_or_inf, incr_ratio, decr_ratio, seeds
    pytest.param(2.0**16, 3, 1, 2.0, 0.5, id="decorate-defaults-n3-h1"),
    pytest.param(2.0**15, 5, 2, 2.0, 0.8, id="old-overload-decr0.8-n5-h2"),
    pytest.param(1000.0, 4, 3, 2.0, 0.8, id="decr0.8-n4-h3"),
    pytest.param(3.0, 6, 2, 1.5, 0.8, id="incr1.5-decr0.8-n6-h2"),
    pytest.param(2.0**10, 7, 3, 3.0, 0.25, id="incr3-decr0.25-n7-h3"),
]


@pytest.mark.parametrize("init,n_incr,n_decr,incr,decr", PADDLE_CASES)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_paddle_update_loss_scaling_op(paddle_static, init, n_incr, n_decr, incr, decr, seed):
    flags = overflow_sequence(seed, 400)
    op = PaddleUpdateLossScaling(paddle_static, init, n_incr, n_decr, incr, decr)
    ours = DynamicLossScale.from_paddle(init, n_incr, n_decr, incr, decr)
    assert op.read_scope() == (f32(init), 0, 0)
    scales = []
    for t, f in enumerate(flags):
        native = op.step(f)
        ours = ours.adjust(f)
        assert native == (ours.scale, ours.good_steps, ours.bad_steps), (t, f)
        scales.append(native[0])
    assert_moves_both_ways(scales, f32(init))
    assert ours.total_steps == len(flags) and ours.skipped_steps == sum(flags)
    # the state the op left in the scope is the one fetched
    assert op.read_scope() == (ours.scale, ours.good_steps, ours.bad_steps)


@pytest.mark.parametrize("n_decr", [1, 2, 3])
def test_paddle_floor_at_one(paddle_static, n_decr):
    """Overflow-heavy run from a small scale: both clamp at 1 (Paddle's floor) and grow again."""
    flags = overflow_sequence(7, 300, p_burst=0.2, p_calm=0.1, p_inf_burst=0.95, p_inf_calm=0.05)
    op = PaddleUpdateLossScaling(paddle_static, 8.0, 5, n_decr, 2.0, 0.8)
    ours = DynamicLossScale.from_paddle(8.0, 5, n_decr, 2.0, 0.8)
    at_floor_overflows, scales = 0, []
    for t, f in enumerate(flags):
        at_floor_overflows += f and ours.scale == 1.0 and ours.bad_steps == n_decr - 1
        native = op.step(f)
        ours = ours.adjust(f)
        assert native == (ours.scale, ours.good_steps, ours.bad_steps), (t, f)
        assert native[0] >= 1.0
        scales.append(native[0])
    assert at_floor_overflows >= 5  # a back-off was due at scale 1, repeatedly
    assert_moves_both_ways(scales, 8.0)
    # clamped from above 1 (e.g. 1.024 * 0.8 < 1 -> 1), not only held at 1
    assert any(a > 1.0 and b == 1.0 for a, b in zip([8.0] + scales, scales))


def test_paddle_counters_start_past_threshold(paddle_static):
    """A counter already past n never triggers in Paddle's op (until it is reset): the scale
    is frozen. Such a state contradicts its config, and the core refuses it (issue 22)."""
    cases = [  # (good, bad), flags, the op's scales: no growth at step 1..3, as if frozen
        ((5, 0), [False] * 6 + [True] + [False] * 3, [64.0] * 9 + [128.0, 128.0]),
        ((0, 4), [True] * 4 + [False] + [True] * 2, [64.0] * 5 + [64.0, 32.0]),
    ]
    for (good, bad), flags, expected in cases:
        op = PaddleUpdateLossScaling(paddle_static, 64.0, 3, 2, 2.0, 0.5, good=good, bad=bad)
        trace = [op.step(f)[0] for f in flags + [False]]
        assert trace[:len(expected)] == expected, (good, bad, trace)
        field = "good_steps" if good else "bad_steps"
        with pytest.raises(AmpConfigError, match=f"{field} = {good or bad}: must be <"):
            DynamicLossScale.from_paddle(64.0, 3, 2, 2.0, 0.5, good_steps=good, bad_steps=bad)


def test_paddle_growth_stops_below_float32_overflow(paddle_static):
    """Growing past float32 max keeps the old scale (finite) and resets the counter."""
    for init, ratio in ((2.0**126, 2.0), (2.5e38, 1.5), (F32_MAX, 2.0)):
        op = PaddleUpdateLossScaling(paddle_static, init, 3, 1, ratio, 0.5)
        ours = DynamicLossScale.from_paddle(init, 3, 1, ratio, 0.5)
        for t in range(12):
            native = op.step(False)
            ours = ours.adjust(False)
            assert native == (ours.scale, ours.good_steps, ours.bad_steps), (init, t)
            assert math.isfinite(native[0])
        assert ours.scale == (2.0**127 if init == 2.0**126 else f32(init))


# --------------------------------------------------------------------------- torch

def torch_update_scale(torch, scale, tracker, found_inf, growth_factor, backoff_factor, interval):
    torch._amp_update_scale_(scale, tracker, torch.full((1,), float(found_inf)),
                             growth_factor, backoff_factor, interval)
    return scale.item(), int(tracker.item())


def run_torch_kernel(torch, init, growth, backoff, interval, flags):
    """Drive ``torch._amp_update_scale_`` and the core side by side; return the scales."""
    scale = torch.full((1,), init, dtype=torch.float32)
    tracker = torch.zeros((1,), dtype=torch.int32)
    ours = DynamicLossScale.from_torch(init, growth, backoff, interval)
    scales = []
    for t, f in enumerate(flags):
        native = torch_update_scale(torch, scale, tracker, f, growth, backoff, interval)
        ours = ours.adjust(f)
        assert native == (ours.scale, ours.good_steps), (t, f)
        assert ours.bad_steps == 0  # hysteresis 1
        scales.append(native[0])
    return scales


TORCH_CASES = [
    pytest.param(2.0**16, 2.0, 0.5, 3, id="defaults-interval3"),
    pytest.param(8.0, 2.0, 0.5, 5, id="start8-interval5"),
    pytest.param(1000.0, 4.0, 0.25, 7, id="x4-quarter-interval7"),
    pytest.param(1.0, 2.0, 0.5, 4, id="below-one-no-floor"),
]


@pytest.mark.parametrize("init,growth,backoff,interval", TORCH_CASES)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_torch_amp_update_scale_kernel(init, growth, backoff, interval, seed):
    torch = pytest.importorskip("torch", reason=NO_TORCH)
    flags = overflow_sequence(seed, 500)
    scales = run_torch_kernel(torch, init, growth, backoff, interval, flags)
    assert_moves_both_ways(scales, init)
    if init == 1.0:
        assert min(scales) < 1.0  # torch has no floor, nor has from_torch


@pytest.mark.parametrize("growth,backoff", [(1.5, 0.8), (1.1, 0.9), (3.0, 0.7)])
def test_torch_kernel_non_dyadic_factors(growth, backoff):
    torch = pytest.importorskip("torch", reason=NO_TORCH)
    run_torch_kernel(torch, 1000.0, growth, backoff, 3, overflow_sequence(3, 500))


def test_torch_non_dyadic_factor_single_step():
    """torch rounds the double product scale * factor once; so must from_torch."""
    torch = pytest.importorskip("torch", reason=NO_TORCH)
    scale, tracker = torch.full((1,), 9.0), torch.zeros((1,), dtype=torch.int32)
    native, _ = torch_update_scale(torch, scale, tracker, True, 2.0, 0.8, 2000)
    assert native == f32(9.0 * 0.8) == 7.199999809265137
    assert DynamicLossScale.from_torch(9.0, backoff_factor=0.8).adjust(True).scale == native


GOLDEN = [(0, 8.0, 1), (0, 8.0, 2), (0, 16.0, 0), (1, 8.0, 0),
          (0, 8.0, 1), (0, 8.0, 2), (0, 16.0, 0), (0, 16.0, 1)]


def test_golden_trace_core():
    """ANCHORS.md: interval 3, start 8.0, found_inf -> (scale, tracker)."""
    ours = DynamicLossScale.from_torch(8.0, 2.0, 0.5, 3)
    for f, scale, tracker in GOLDEN:
        ours = ours.adjust(bool(f))
        assert (ours.scale, ours.good_steps) == (scale, tracker)


def test_golden_trace_torch():
    torch = pytest.importorskip("torch", reason=NO_TORCH)
    scale, tracker = torch.full((1,), 8.0), torch.zeros((1,), dtype=torch.int32)
    got = [torch_update_scale(torch, scale, tracker, f, 2.0, 0.5, 3) for f, _, _ in GOLDEN]
    assert got == [(s, t) for _, s, t in GOLDEN]


def test_torch_growth_stops_below_float32_overflow():
    torch = pytest.importorskip("torch", reason=NO_TORCH)
    for init in (2.0**126, 2.0**127, F32_MAX):
        flags = [False] * 10 + [True] + [False] * 9
        scales = run_torch_kernel(torch, init, 2.0, 0.5, 3, flags)
        assert all(math.isfinite(s) for s in scales)
        assert max(scales) == (2.0**127 if init != F32_MAX else F32_MAX)


@pytest.mark.parametrize("init,growth,backoff,interval,seed", [
    (2.0**16, 2.0, 0.5, 3, 0), (32.0, 2.0, 0.5, 5, 1), (512.0, 4.0, 0.25, 4, 2)])
def test_torch_gradscaler_with_sgd(init, growth, backoff, interval, seed):
    """A real GradScaler on CPU: scale(loss).backward(), step(opt), update()."""
    torch = pytest.importorskip("torch", reason=NO_TORCH)
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.tensor([1.0]))
    opt = torch.optim.SGD([w], lr=1e-6)
    scaler = torch.amp.GradScaler("cpu", init_scale=init, growth_factor=growth,
                                  backoff_factor=backoff, growth_interval=interval)
    ours = DynamicLossScale.from_torch(init, growth, backoff, interval)
    flags = overflow_sequence(seed, 300)
    skipped = 0
    for t, f in enumerate(flags):
        opt.zero_grad(set_to_none=True)
        x = torch.tensor([math.inf if f else 0.5])
        used = scaler.get_scale()
        assert used == ours.scale, t  # the scale this step's loss is multiplied by
        before = w.detach().clone()
        scaler.scale((w * x).sum()).backward()
        assert torch.isfinite(w.grad).all().item() is (not f)
        scaler.step(opt)
        scaler.update()
        ours = ours.adjust(f)
        skipped += f
        assert bool(torch.equal(w.detach(), before)) is f  # overflow steps skip the update
        sd = scaler.state_dict()
        assert (sd["scale"], sd["_growth_tracker"]) == (ours.scale, ours.good_steps), (t, f)
        assert int(scaler._growth_tracker.item()) == ours.good_steps
        assert scaler.get_scale() == ours.scale
    assert ours.skipped_steps == skipped
    assert torch.isfinite(w).all()


# --------------------------------------------------------------------------- MXNet

@pytest.fixture
def mxnet_loss_scaler():
    mx = pytest.importorskip("mxnet")
    from mxnet.contrib.amp.loss_scaler import LossScaler

    param = mx.gluon.Parameter("w", shape=(4,))
    param.initialize(ctx=mx.cpu())

    def overflow(scaler, found_inf):
        param.grad()[:] = np.inf if found_inf else 0.25
        return scaler.has_overflow([param])
    return LossScaler, overflow


def test_mxnet_constants(mxnet_loss_scaler):
    LossScaler, _ = mxnet_loss_scaler
    native, ours = LossScaler(), DynamicLossScale.from_mxnet()
    assert native.loss_scale == native._next_loss_scale == ours.scale == 2.0**16
    assert native._scale_seq_len == ours.growth_interval == 2000
    assert native._max_loss_scale == ours.max_scale == 2.0**24
    assert (ours.growth_factor, ours.backoff_factor, ours.hysteresis) == (2.0, 0.5, 1)
    assert ours.min_scale == 0.0  # MXNet has no floor


@pytest.mark.parametrize("interval,seed,init", [(3, 0, None), (5, 1, None), (4, 2, 2.0**22)])
def test_mxnet_loss_scaler_one_step_lag(mxnet_loss_scaler, interval, seed, init):
    """LossScaler.has_overflow at step t makes the scale decided at step t-1 current.

    With s[t] = our scale used at step t (s[0] = the initial scale, s[t+1] =
    s[t].adjust(found_inf[t])), after the native's has_overflow at step t:
    ``loss_scale == s[t]``, ``_next_loss_scale == s[t+1]``, ``_unskipped`` is
    our good_steps; the scale the native multiplies step t's loss by (its
    ``loss_scale`` before that call) is s[t-1]: one step late. The growth
    interval is shortened on the native instance (its only knob) so growth and
    the 2**24 cap are reached in a few hundred steps.
    """
    LossScaler, overflow = mxnet_loss_scaler
    native = LossScaler()
    native._scale_seq_len = interval
    kw = {"growth_interval": interval}
    if init is not None:
        native._loss_scale = native._next_loss_scale = init
        kw["scale"] = init
    ours = DynamicLossScale.from_mxnet(**kw)
    flags = overflow_sequence(seed, 400)
    used_by_ours, used_by_native, capped = [], [], 0
    for t, f in enumerate(flags):
        used_by_ours.append(ours.scale)
        used_by_native.append(native.loss_scale)
        assert overflow(native, f) is f
        assert native.loss_scale == ours.scale, t
        ours = ours.adjust(f)
        assert native._next_loss_scale == ours.scale, t
        assert native._unskipped == ours.good_steps, t
        capped += ours.scale == 2.0**24
    assert used_by_native[0] == used_by_ours[0]
    assert used_by_native[1:] == used_by_ours[:-1]  # the one-step lag, exactly
    assert_moves_both_ways(used_by_ours, used_by_ours[0])
    if init is not None:
        assert capped >= 3  # the 2**24 ceiling was hit
