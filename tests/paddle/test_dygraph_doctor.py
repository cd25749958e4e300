"""The doctor on an eager model (``paddle_amp.dygraph.doctor``): the planted overflow in the
third of four Linear layers (``doctor_planted``, as the other runtimes' doctors are tested) is
named first, by its path in the model (``2``); the fix keeps that one layer in float32, is
verified on held-out steps by training under it, loads back from its file, and training
under it skips no step."""
import importlib.util
from pathlib import Path

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
        for s in range(steps):
            x, y, _ = P.layered_arrays(KIND, s)
            with amp.auto_cast(policy=policy):
                loss = loss_fn(model(paddle.to_tensor(x)), paddle.to_tensor(y))
            scaled = scaler.scale(loss)
            scaled.backward()
            scaler.minimize(opt, scaled)
            opt.clear_grad()
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
