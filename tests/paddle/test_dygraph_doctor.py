"""The doctor on an eager model (``paddle_amp.dygraph.doctor``): the planted overflow in the
third of four Linear layers (``doctor_planted``, as the other runtimes' doctors are tested) is
named first, by its path in the model (``2``); the fix keeps that one layer in float32, is
verified on held-out steps by training under it, loads back from its file, and training
under it skips no step."""
import importlib.util
from pathlib import Path

import numpy as np
import paddle
import pytest

from amp_adapters import Policy
from paddle_amp import dygraph as amp

_spec = importlib.util.spec_from_file_location(
    "doctor_planted", Path(__file__).resolve().parents[1] / "doctor_planted.py")
P = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(P)

KIND = "layer_overflow"


def _train(policy, steps, watch=False):
    """``steps`` of a user's loop (Adam, GradScaler) under ``policy``; with ``watch`` inside
    the doctor. Returns (the doctor or None, the scaler's state after)."""
    model, loss_fn = P.paddle_dygraph_layered(KIND)
    opt = paddle.optimizer.Adam(0.01, parameters=model.parameters())
    scaler = amp.GradScaler(policy=policy)
    dr = amp.doctor(model, loss_fn, opt, policy=policy, scaler=scaler) if watch else None
    if dr is not None:
        dr.__enter__()
    try:
        P.paddle_dygraph_steps(KIND, model, loss_fn, opt, scaler, policy, steps)
        state = scaler.loss_scale()[1]
    finally:
        if dr is not None:
            dr.__exit__(None, None, None)
    return dr, state


def test_the_doctor_names_the_planted_layer_by_its_path_and_the_fix_holds(tmp_path):
    policy = P.policy(KIND)
    dr, state = _train(policy, 4, watch=True)
    assert state.skipped_steps == 4  # the planted overflow: every step skipped
    rep = dr.report()
    assert rep.steps[0].first_forward == "2"
    first = [f for f in rep.findings() if f.action][0]
    assert first.name == "2" and rep.op_named("2").layer_name == "2"
    rec = dr.recommendation()
    assert rec.policy.paddle_layers.fp32 == {"2"} and rec.policy.ops == policy.ops
    assert rec.verified and rec.held_out == 2 and rec.updates >= 2
    path = tmp_path / "fix.toml"
    rec.write(path)
    fixed = Policy.from_file(path)
    assert fixed.paddle_layers.fp32 == {"2"}
    _, after = _train(str(path), 8)
    assert after.skipped_steps == 0
    report = amp.cast_report(P.paddle_dygraph_layered(KIND)[0],
                             paddle.to_tensor(P.layered_arrays(KIND, 0)[0]), policy=fixed)
    assert [d.precision for d in report.decisions] == ["float16", "float16", "float32",
                                                       "float16"]


def test_the_doctor_puts_the_model_and_optimizer_back():
    model, loss_fn = P.paddle_dygraph_layered(KIND)
    before = [p.numpy().copy() for p in model.parameters()]
    opt = paddle.optimizer.Adam(0.01, parameters=model.parameters())
    with amp.doctor(model, loss_fn, opt, policy=P.policy(KIND)) as dr:
        for s in range(2):
            x, y, _ = P.layered_arrays(KIND, s)
            loss = loss_fn(model(paddle.to_tensor(x * 0.01)), paddle.to_tensor(y))
            loss.backward()
            opt.step()
            opt.clear_grad()
        dr.recommendation()
    assert dr.steps == 2
    assert all((p.numpy() == b).all() for p, b in zip(model.parameters(), before))


def test_the_doctor_refuses_what_it_cannot_watch():
    model, _ = P.paddle_dygraph_layered(KIND)
    with pytest.raises(TypeError, match="loss_fn must be a paddle.nn.Layer"):
        amp.doctor(model, paddle.nn.functional.mse_loss)
    with pytest.raises(RuntimeError, match="O0"):
        amp.doctor(model, paddle.nn.MSELoss(), policy="O0")


def test_a_backward_only_overflow_is_fixed_by_the_loss_scale_alone():
    """As in MXNet and a static program (``check_scale_only_fix``): a finite forward whose
    backward overflows at 2**16 gets a lower initial scale, no layer moves. A call's backward
    values include its layer's weight gradient, as a program's backward op outputs it (a
    low GEMM's weight gradient is a low value too). (Before: only the gradients into the
    calls' inputs were counted, the scale candidate came out too high and failed on the
    weight gradients, and the fix moved layer '4' to float32.)"""
    model, loss_fn = P.paddle_dygraph_layered("layer_backward")
    opt = paddle.optimizer.SGD(1e-3, parameters=model.parameters())
    with amp.doctor(model, loss_fn, opt, policy=P.policy("layer_backward")) as dr:
        for s in range(2):
            x, y, _ = P.layered_arrays("layer_backward", s)
            dr.examine((paddle.to_tensor(x),), (paddle.to_tensor(y),))
    P.check_scale_only_fix(dr.report(), dr.recommendation())


def test_the_planted_overflow_gets_bf16_exactly_where_this_cpu_runs_it_natively():
    """The planted overflow (``relu(x @ w1) @ w2`` as two Linear layers, ``0`` and ``2``):
    keeping ``0`` in float32 leaves its 1e5 to ``2``, so that fix fails. Next the doctor
    tries the model in bfloat16 (float32's range), the core's candidate, where the device's
    truth (``isa.bf16_class``) says bf16 runs natively: verified by training under it. On an
    emulated class (oneDNN slower than float32) or one without bf16 it is not tried, and
    the fix is the op type. (Before: the dygraph doctor named no bf16 kernel, and a trial
    in bf16 crashed the process in ``paddle.grad``: oneDNN's bf16 matmul grad.)"""
    from amp_adapters.rules.isa import bf16_class, machine
    from amp_demo.paddle_dygraph_trainer import run_doctor
    native = bf16_class(machine()) == "native"
    rep, rec = run_doctor("overflow", P.policy("overflow"), 2)
    assert rep.steps[0].first_forward == "0"
    tried = [what for what, _, _ in rec.tried]
    assert tried[0] == "keep '0' in float32" and not rec.tried[0][1]
    assert any("bfloat16" in what for what in tried) == native
    assert rec.verified
    if native:
        assert rec.policy.dtype == "bfloat16" and rec.policy.loss_scale.scale == 1.0
        assert rec.keeps == ("every op that ran fp16 runs bf16 (float32's range)",)
    else:
        assert rec.policy.dtype == "float16" and "matmul" in rec.policy.ops.fp32


def test_a_trial_in_bf16_trains_on_onednn_where_this_cpu_has_bf16_kernels():
    """The bf16 candidate of the planted layer overflow: its trial (``replay``, through
    ``paddle.grad``) runs every GEMM on oneDNN's bf16 kernel, and nothing overflows. (Before:
    ``paddle.grad`` pruned the gradient of an operand the low route had made want one, and
    oneDNN's bf16 ``matmul_v2_grad`` crashed the process.)"""
    from amp_adapters.rules.isa import bf16_class, machine
    from amp_adapters.services.doctor.candidates import candidates, passes
    if bf16_class(machine()) == "none":
        pytest.skip("the device truth (isa.bf16_class) says this CPU class has no bf16 "
                    "kernel: oneDNN needs AVX-512 (avx512f), not in use here")
    model, loss_fn = P.paddle_dygraph_layered(KIND)
    opt = paddle.optimizer.SGD(1e-3, parameters=model.parameters())
    with amp.doctor(model, loss_fn, opt, policy=P.policy(KIND)) as dr:
        for s in range(2):
            x, y, _ = P.layered_arrays(KIND, s)
            dr.examine((paddle.to_tensor(x),), (paddle.to_tensor(y),))
    assert dr.bf16_kernels() == {"matmul_v2"}
    (bf16,) = [c for c in candidates(dr.report(), dr.policy, dr.bf16_kernels())
               if c.kind == "bf16"]
    trial = dr.replay(bf16.policy)
    assert passes(trial)[0] and not trial.overflow_steps
    assert [(r.name, r.precision, r.emulated) for r in trial.ops] == \
        [(n, "bfloat16", False) for n in ("0", "1", "2", "4")]


def test_bad_input_to_the_doctor_is_refused_before_it_watches_anything():
    """A layer rule naming no layer of the model (``7``: it has ``0`` to ``4``) is an
    ``AmpConfigError`` naming the closest paths, as the static and MXNet doctors raise; a
    ``max_steps`` that is not a positive int, an optimizer that is not one or a scaler that
    is not ours too (each raised inside your loss's call, or at the recommendation). Nothing
    is hooked: the model and the loss run as before. (Before: the rule applied to nothing
    and the doctor examined another policy than the one written.)"""
    from amp_adapters import AmpConfigError, LayerLists
    model, loss_fn = P.paddle_dygraph_layered(KIND)
    bad = P.policy(KIND).replace(paddle_layers=LayerLists(fp32={"7"}))
    with pytest.raises(AmpConfigError, match="layer '7' matches no layer of the model the "
                                             "doctor examines; the closest layers it has: "
                                             "'0', '1', '2'"):
        amp.doctor(model, loss_fn, policy=bad)
    for steps in (0, "8", 2.0, True):
        with pytest.raises(AmpConfigError, match="max_steps must be a positive int"):
            amp.doctor(model, loss_fn, policy=P.policy(KIND), max_steps=steps)
    with pytest.raises(AmpConfigError, match="optimizer must be the paddle.optimizer"):
        amp.doctor(model, loss_fn, amp.GradScaler(), policy=P.policy(KIND))
    with pytest.raises(AmpConfigError, match="scaler must be the paddle_amp.dygraph GradScaler"
                                             ".* got paddle.amp.grad_scaler.GradScaler"):
        amp.doctor(model, loss_fn, policy=P.policy(KIND),
                   scaler=paddle.amp.GradScaler(enable=False))
    assert not model._forward_pre_hooks and not loss_fn._forward_pre_hooks
    ok = P.policy(KIND).replace(paddle_layers=LayerLists(fp32={"2"}))
    assert amp.doctor(model, loss_fn, policy=ok).policy.paddle_layers.fp32 == {"2"}


class _Scores(paddle.nn.Layer):
    """An attention-like block: ``q(x) @ k(x).T`` in its own forward, the GEMM no leaf layer
    runs; with weights of 30 its output (~1e5) overflows float16, its inputs do not."""

    def __init__(self):
        super().__init__()
        self.q, self.k = paddle.nn.Linear(8, 8), paddle.nn.Linear(8, 8)
        for linear in (self.q, self.k):
            linear.weight.set_value(np.full((8, 8), 30.0, np.float32))
            linear.bias.set_value(np.zeros(8, np.float32))

    def forward(self, x):
        return paddle.matmul(self.q(x), self.k(x), transpose_y=True)


def test_a_gemm_a_block_runs_in_its_own_forward_is_named_by_the_blocks_path():
    """Every wrapped op call is recorded, not only a leaf layer's: the block's own
    ``q @ k.T`` is the first bad op, named by the block's path (``0``), and the verified fix
    keeps that block in float32. (Before: only leaf layers' calls were recorded; the
    overflow was seen in no op, and the fix named ``0.k``, which failed.)"""
    model, loss_fn = paddle.nn.Sequential(_Scores()), paddle.nn.MSELoss()
    opt = paddle.optimizer.SGD(1e-3, parameters=model.parameters())
    policy = Policy.preset("O1", emulate=True)
    with amp.doctor(model, loss_fn, opt, policy=policy) as dr:
        for _ in range(2):
            dr.examine((paddle.ones([4, 8]),), (paddle.zeros([4, 4]),))
    rep = dr.report()
    assert [r.name for r in rep.ops] == ["0.q", "0.k", "0"]
    assert rep.steps[0].first_forward == "0"
    rec = dr.recommendation()
    assert rec.verified and rec.policy.paddle_layers.fp32 == {"0"}


class _OpensItsRegion(paddle.nn.Layer):
    """The planted layered model inside a block whose ``forward`` opens the region itself
    (under the planted policy), as a model that runs its body in mixed precision does."""

    def __init__(self, net, policy):
        super().__init__()
        self.net, self.policy = net, policy

    def forward(self, x):
        with amp.auto_cast(policy=self.policy):
            return self.net(x)


def test_a_model_that_opens_its_own_region_is_examined_under_the_doctors_policy():
    """The model's own region runs under the doctor's policy (the one examined; float32 for
    the reference run): the planted layer is named first by its path from the model
    (``net.2``), and the fix keeping it float32 is verified by trials whose candidate
    policy the model's region takes. (Before: the doctor's regions logged nothing of the
    model's own, and the report held no op.)"""
    policy = P.policy(KIND)
    net, loss_fn = P.paddle_dygraph_layered(KIND)
    model = _OpensItsRegion(net, policy)
    opt = paddle.optimizer.SGD(1e-3, parameters=model.parameters())
    with amp.doctor(model, loss_fn, opt, policy=policy) as dr:
        for s in range(2):
            x, y, _ = P.layered_arrays(KIND, s)
            dr.examine((paddle.to_tensor(x),), (paddle.to_tensor(y),))
    rep = dr.report()
    assert [r.name for r in rep.ops] == ["net.0", "net.1", "net.2", "net.4"]
    assert rep.steps[0].first_forward == "net.2"
    rec = dr.recommendation()
    assert rec.verified and rec.policy.paddle_layers.fp32 == {"net.2"}
