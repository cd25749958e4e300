"""paddle_amp.dygraph.decorate(level="O2"): the core's parameter plan (what only a routed
low op reads is stored low; norms, biases, excluded layers stay float32), float32 master
weights in the optimizer in the native's format, save_dtype, master_grad, master_weight;
O2 trains to fp32's loss on an MLP and a small CNN; an overflow step changes nothing; a
checkpoint resumes O2 bit-identically.

The low dtype is the device truth's: bf16 where this CPU runs oneDNN's bf16 kernels
(``is_bfloat16_supported``), else float16 emulated."""
import numpy as np
import paddle
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from paddle_amp import dygraph as amp
from paddle_amp.dygraph.decorator import param_dtypes

LOSS_TOLERANCE = 0.05  # O2's final loss within 5% of fp32's (the bar)


def _low():
    dtype = "bfloat16" if amp.is_bfloat16_supported() else "float16"
    return dtype, dtype == "float16"


def _mlp():
    return paddle.nn.Sequential(paddle.nn.Linear(8, 32), paddle.nn.ReLU(),
                                paddle.nn.LayerNorm(32), paddle.nn.Linear(32, 1))


class _CNN(paddle.nn.Layer):
    def __init__(self):
        super().__init__()
        self.conv = paddle.nn.Conv2D(1, 4, 3, padding=1)
        self.bn = paddle.nn.BatchNorm2D(4)
        self.fc = paddle.nn.Linear(4 * 6 * 6, 1)

    def forward(self, x):
        return self.fc(paddle.nn.functional.relu(self.bn(self.conv(x))).flatten(1))


def _data(kind):
    rng = np.random.default_rng(0)
    if kind == "mlp":
        x = rng.standard_normal((32, 8)).astype(np.float32)
        return paddle.to_tensor(x), paddle.to_tensor(np.sin(x).sum(1, keepdims=True))
    x = rng.standard_normal((16, 1, 6, 6)).astype(np.float32)
    return paddle.to_tensor(x), paddle.to_tensor(x.mean((1, 2, 3))[:, None].astype(np.float32))


def _train(kind, level, steps=25, scaler=None, **decorate):
    paddle.seed(0)
    model = _mlp() if kind == "mlp" else _CNN()
    opt = paddle.optimizer.Adam(1e-2, parameters=model.parameters())
    dtype, emulate = _low()
    if level == "O2":
        model, opt = amp.decorate(model, opt, level="O2", dtype=dtype, emulate=emulate,
                                  **decorate)
    x, y = _data(kind)
    for _ in range(steps):
        with amp.auto_cast(enable=level == "O2", level="O2", dtype=dtype, emulate=emulate):
            loss = paddle.nn.functional.mse_loss(model(x), y)
        if scaler is None:
            loss.backward()
            opt.step()
        else:
            scaled = scaler.scale(loss)
            scaled.backward()
            scaler.minimize(opt, scaled)
        opt.clear_grad()
    return model, opt, float(loss)


@pytest.mark.parametrize("kind", ["mlp", "cnn"])
def test_o2_trains_to_fp32s_loss_with_the_planned_parameters_low(kind):
    _, _, fp32 = _train(kind, "O1")
    model, opt, o2 = _train(kind, "O2")
    assert abs(o2 - fp32) <= LOSS_TOLERANCE * fp32, (o2, fp32)
    plan = param_dtypes(model)
    dtype = _low()[0]
    for layer in model.sublayers():
        for attr, p in layer.named_parameters(include_sublayers=False):
            assert p.dtype == getattr(paddle, plan.dtypes[p.name]), (p.name, p.dtype)
            if isinstance(layer, (paddle.nn.LayerNorm, paddle.nn.BatchNorm2D)) or \
                    attr == "bias":
                assert plan.dtypes[p.name] == "float32", plan.format()
            if isinstance(layer, paddle.nn.Linear) and attr == "weight":
                assert plan.dtypes[p.name] == dtype, plan.format()
    assert set(opt.state_dict()["master_weights"]) == set(plan.low)


def test_master_weights_are_in_the_optimizer_state_by_parameter_name_and_load_back():
    model, opt, _ = _train("mlp", "O2", steps=3)
    plan = param_dtypes(model)
    state = opt.state_dict()
    masters = state["master_weights"]
    assert set(masters) == set(plan.low) and plan.low
    assert all(m.dtype == paddle.float32 for m in masters.values())
    # the native's moment names: keyed by the master's name
    assert any(k.endswith("_fp32_master_0_moment1_0") for k in state)
    saved = {k: v.numpy().copy() for k, v in masters.items()}
    zeroed = {k: v.clone() for k, v in state.items() if k != "master_weights"}
    opt.set_state_dict({**zeroed, "master_weights": {k: paddle.zeros_like(v)
                                                     for k, v in masters.items()}})
    assert all(not opt.state_dict()["master_weights"][k].numpy().any() for k in saved)
    opt.set_state_dict({**zeroed, "master_weights": {k: paddle.to_tensor(v)
                                                     for k, v in saved.items()}})
    assert all(np.array_equal(opt.state_dict()["master_weights"][k].numpy(), v)
               for k, v in saved.items())


def test_save_dtype_saves_the_state_dict_in_that_dtype_and_keeps_the_parameters(tmp_path):
    model, opt, _ = _train("mlp", "O2", steps=1, save_dtype="float32")
    live = {p.name: p.dtype for p in model.parameters()}
    assert any(d != paddle.float32 for d in live.values())
    assert all(v.dtype == paddle.float32 for v in model.state_dict().values())
    assert {p.name: p.dtype for p in model.parameters()} == live
    # a checkpoint keeps the live dtypes (a resume is exact) and loads back
    amp.save_checkpoint(tmp_path / "ckpt", model, opt)
    assert amp.load_checkpoint(tmp_path / "ckpt", model, opt) == 0


def test_excluded_layers_by_type_and_by_instance_stay_float32():
    paddle.seed(0)
    model = _mlp()
    first = model[0]
    amp.decorate(model, level="O2", dtype=_low()[0], emulate=_low()[1],
                 excluded_layers=[first])
    plan = param_dtypes(model)
    assert plan.dtypes[first.weight.name] == "float32"
    assert "excluded_layers" in plan.reasons[first.weight.name]
    assert first.weight.dtype == paddle.float32
    assert model[3].weight.dtype != paddle.float32
    model2 = _mlp()
    amp.decorate(model2, level="O2", dtype=_low()[0], emulate=_low()[1],
                 excluded_layers=paddle.nn.Linear)
    assert not param_dtypes(model2).low
    assert all(p.dtype == paddle.float32 for p in model2.parameters())


def _o2_state(model, opt):
    """Parameters (as float32), masters and moments, by place in the model."""
    names = {p.name: i for i, p in enumerate(model.parameters())}
    state = opt.state_dict()
    moments = {}
    for k, v in state.items():
        if hasattr(v, "numpy"):
            owner = max((n for n in names if k.startswith(n + "_")), key=len)
            moments[(names[owner], k[len(owner):])] = v.numpy().copy()
    masters = {names[k]: v.numpy().copy() for k, v in state.get("master_weights", {}).items()}
    params = [p.astype("float32").numpy().copy() for p in model.parameters()]
    return params, masters, moments


def _same(a, b):
    assert all(np.array_equal(x, y) for x, y in zip(a[0], b[0]))
    assert a[1].keys() == b[1].keys() and all(np.array_equal(a[1][k], b[1][k]) for k in a[1])
    assert a[2].keys() == b[2].keys() and all(np.array_equal(a[2][k], b[2][k]) for k in a[2])


def test_an_overflow_step_under_o2_leaves_parameters_masters_and_moments_bit_identical():
    paddle.seed(0)
    model = _mlp()
    opt = paddle.optimizer.Adam(1e-2, parameters=model.parameters())
    model, opt = amp.decorate(model, opt, level="O2", dtype="float16", emulate=True)
    scaler = amp.GradScaler(init_loss_scaling=1024.0)
    x, y = _data("mlp")

    def step(inject):
        with amp.auto_cast(level="O2", dtype="float16", emulate=True):
            loss = paddle.nn.functional.mse_loss(model(x), y)
        scaled = scaler.scale(loss * (float("inf") if inject else 1.0))
        scaled.backward()
        scaler.minimize(opt, scaled)
        opt.clear_grad()

    step(False)
    before = _o2_state(model, opt)
    assert before[1]  # float16 weights have float32 masters
    step(True)
    _same(before, _o2_state(model, opt))
    assert scaler.get_init_loss_scaling() == 1024.0 and scaler.loss_scale()[1].scale == 512.0
    step(False)
    assert not np.array_equal(before[1][0], _o2_state(model, opt)[1][0])


def test_a_checkpoint_resumes_o2_bit_identically(tmp_path):
    def setup():
        paddle.seed(0)
        model = _mlp()
        opt = paddle.optimizer.Adam(1e-2, parameters=model.parameters())
        return amp.decorate(model, opt, level="O2", dtype="float16", emulate=True)
    x, y = _data("mlp")

    def step(model, opt):
        with amp.auto_cast(level="O2", dtype="float16", emulate=True):
            loss = paddle.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.clear_grad()

    model, opt = setup()
    for i in range(5):
        if i == 2:
            amp.save_checkpoint(tmp_path / "ckpt", model, opt)
        step(model, opt)
    straight = _o2_state(model, opt)
    model2, opt2 = setup()
    step(model2, opt2)
    step(model2, opt2)
    step(model2, opt2)  # a different state, overwritten by the load
    assert amp.load_checkpoint(tmp_path / "ckpt", model2, opt2) == 0
    for _ in range(3):
        step(model2, opt2)
    _same(straight, _o2_state(model2, opt2))


def test_master_grad_makes_low_gradients_float32_after_backward():
    dtype, emulate = _low()
    grads = {}
    for master_grad in (False, True):
        paddle.seed(0)
        model = _mlp()
        amp.decorate(model, level="O2", dtype=dtype, emulate=emulate, master_grad=master_grad)
        x, y = _data("mlp")
        with amp.auto_cast(level="O2", dtype=dtype, emulate=emulate):
            loss = paddle.nn.functional.mse_loss(model(x), y)
        loss.backward()
        grads[master_grad] = model[0].weight.grad.dtype
    # without master_grad, what the backward gave: low in 2.6.2 (Paddle 3.3.1's oneDNN
    # gradient of a bf16 weight is float32 already)
    assert grads[False] in (getattr(paddle, dtype), paddle.float32)
    assert grads[True] == paddle.float32


def test_master_weight_false_keeps_no_masters_and_still_trains():
    _, _, fp32 = _train("mlp", "O1")
    _, opt, o2 = _train("mlp", "O2", master_weight=False)
    assert "master_weights" not in opt.state_dict()
    assert abs(o2 - fp32) <= 2 * LOSS_TOLERANCE * fp32 + 1e-3, (o2, fp32)


def test_a_second_o2_decorate_is_refused():
    paddle.seed(0)
    model = _mlp()
    amp.decorate(model, level="O2", dtype=_low()[0], emulate=_low()[1])
    with pytest.raises(Exception, match="decorated at O2 already"):
        amp.decorate(model, level="O2", dtype=_low()[0], emulate=_low()[1])


def test_decorate_draws_nothing_from_the_users_random_stream():
    draws = []
    for o2 in (False, True):
        paddle.seed(0)
        model = _mlp()
        opt = paddle.optimizer.Adam(parameters=model.parameters())
        if o2:
            amp.decorate(model, opt, level="O2", dtype="float16", emulate=True)
        draws.append(paddle.rand([4]).numpy())
    assert np.array_equal(*draws)


class _LossStep(paddle.nn.Layer):
    """The model's forward and loss in an O2 region (Paddle 2.6's AST translator loses a
    closure's free variables: a Layer holds them)."""

    def __init__(self, model, dtype, emulate):
        super().__init__()
        self.model, self.dtype, self.emulate = model, dtype, emulate

    def forward(self, x, y):
        with amp.auto_cast(level="O2", dtype=self.dtype, emulate=self.emulate):
            return paddle.nn.functional.mse_loss(self.model(x), y)


@pytest.mark.parametrize("kind", ["mlp", "cnn"])
def test_an_o2_model_trains_under_to_static_as_in_eager_mode(kind):
    """In both IRs: a PIR program gets the decisions through the wrapped entry points; a
    legacy one (Paddle 2.6.2, or 3.x with FLAGS_enable_pir_api=0) is rewritten when the
    region closes, its GEMMs reading the bf16 weights as they are (every operand then wants
    a gradient: oneDNN's bf16 matmul_v2_grad crashed on the input's missing one), an
    emulated GEMM widening an fp16 weight (it was fed to a float32 kernel)."""
    dtype, emulate = _low()
    x, y = _data(kind)
    losses = []
    for static in (False, True):
        paddle.seed(0)
        model = _mlp() if kind == "mlp" else _CNN()
        opt = paddle.optimizer.Adam(1e-2, parameters=model.parameters())
        amp.decorate(model, opt, level="O2", dtype=dtype, emulate=emulate)

        step = _LossStep(model, dtype, emulate)
        step = paddle.jit.to_static(step, full_graph=True) if static else step
        for _ in range(3):
            loss = step(x, y)
            loss.backward()
            opt.step()
            opt.clear_grad()
        losses.append(float(loss))
    assert np.isclose(losses[0], losses[1], rtol=1e-5), losses


def _clone_state(state):
    """A deep copy of an optimizer state dict (tensors cloned, master_weights too)."""
    out = {}
    for k, v in state.items():
        if isinstance(v, dict):
            out[k] = {n: t.clone() for n, t in v.items()}
        else:
            out[k] = v.clone() if hasattr(v, "clone") else v
    return out


@settings(max_examples=12, deadline=None)
@given(events=st.lists(st.sampled_from(["step", "overflow", "reload"]), min_size=1,
                       max_size=6))
def test_any_sequence_of_steps_overflows_and_state_reloads_keeps_o2_on_one_trajectory(events):
    """Two O2 runs of the same steps and overflows, one of them reloading its optimizer and
    model state from its own state dicts between steps, end bit-identical: the masters load
    back into the live ones, an overflow changes nothing."""
    x, y = _data("mlp")
    runs = []
    for reloads in (False, True):
        paddle.seed(0)
        model = _mlp()
        opt = paddle.optimizer.Adam(1e-2, parameters=model.parameters())
        model, opt = amp.decorate(model, opt, level="O2", dtype="float16", emulate=True)
        scaler = amp.GradScaler(init_loss_scaling=64.0)
        for event in events:
            if event == "reload":
                if reloads:
                    state, params = _clone_state(opt.state_dict()), model.state_dict()
                    params = {k: v.clone() for k, v in params.items()}
                    model.set_state_dict(params)
                    opt.set_state_dict(state)
                continue
            with amp.auto_cast(level="O2", dtype="float16", emulate=True):
                loss = paddle.nn.functional.mse_loss(model(x), y)
            scaled = scaler.scale(loss * (float("inf") if event == "overflow" else 1.0))
            scaled.backward()
            scaler.minimize(opt, scaled)
            opt.clear_grad()
        runs.append(_o2_state(model, opt))
    _same(*runs)


class _LowInput(paddle.nn.Layer):
    """A GEMM of an O2 weight (bf16, wants a gradient) on an input the caller made bf16
    (wants none): no cast of ours to make want one."""

    def __init__(self):
        super().__init__()
        self.fc = paddle.nn.Linear(8, 4, bias_attr=False)

    def forward(self, x):
        with amp.auto_cast(level="O2", dtype="bfloat16"):
            low = paddle.nn.functional.linear(x.astype("bfloat16"), self.fc.weight)
            return low.astype("float32").mean()


@pytest.mark.skipif(not amp.is_bfloat16_supported(), reason="the device truth says this CPU "
                    "class has no oneDNN bf16 kernel: an O2 weight is float16, emulated")
def test_a_program_gemm_on_a_low_input_and_an_o2_weight_gives_eager_modes_gradient():
    """Both operands then want a gradient (a copy of the input, as eager mode makes one):
    oneDNN's bf16 matmul_v2_grad crashed the legacy program's backward."""
    x = paddle.to_tensor(np.random.default_rng(0).standard_normal((16, 8)).astype("f4"))
    got = []
    for static in (False, True):
        paddle.seed(0)
        model = amp.decorate(_LowInput(), level="O2", dtype="bfloat16")
        loss = (paddle.jit.to_static(model, full_graph=True) if static else model)(x)
        loss.backward()
        got.append((float(loss), model.fc.weight.grad.astype("float32").numpy()))
    assert got[0][0] == got[1][0]
    np.testing.assert_array_equal(got[0][1], got[1][1])
