"""mxnet_amp.doctor on models with a planted problem: it names the op, its policy fixes the run,
and the model, the trainer and the loss scale are bit-identical after it."""
import importlib.util
from pathlib import Path

import numpy as np
import pytest
import mxnet as mx
from mxnet import autograd, gluon

import mxnet_amp as amp
from amp_adapters import OpLists, Policy
from mxnet_amp.doctor import doctor

_spec = importlib.util.spec_from_file_location(
    "doctor_planted", Path(__file__).resolve().parents[1] / "doctor_planted.py")
P = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(P)


def _setup(kind, policy=None, hybridize=True, optimizer="sgd"):
    amp.init(policy=policy or P.policy(kind))
    net, loss_fn = P.mxnet_model(kind, hybridize)
    trainer = gluon.Trainer(net.collect_params(), optimizer, {"learning_rate": 1e-3})
    amp.init_trainer(trainer)
    return net, loss_fn, trainer


def _step(kind, net, loss_fn, trainer, step):
    x, y, _ = P.arrays(kind, step)
    x, y = mx.nd.array(x), mx.nd.array(y)
    with autograd.record():
        loss = loss_fn(net(x), y)
        with amp.scale_loss(loss, trainer) as scaled:
            autograd.backward(scaled)
    trainer.step(1)
    return loss


def _doctor(kind, policy=None, hybridize=True, steps=2):
    net, loss_fn, trainer = _setup(kind, policy, hybridize)
    with doctor(net, loss_fn, trainer) as dr:
        for s in range(steps):
            _step(kind, net, loss_fn, trainer, s)
    return dr


@pytest.mark.parametrize("hybridize", [True, False], ids=["hybridized", "imperative"])
def test_the_overflowing_matmul_is_named_first(hybridize):
    dr = _doctor("overflow", hybridize=hybridize)
    rep = dr.report()
    assert rep.emulated and "EMULATED" in rep.format()
    assert rep.overflow_steps == 2
    first = rep.findings()[0]
    assert (first.kind, first.name, first.canonical, first.action) == \
        ("overflow", "planted_dot0", "matmul", "fp32")
    assert all(s.first_forward == "planted_dot0" for s in rep.steps)
    assert all(s.first_backward for s in rep.steps)  # the overflow reaches the backward too
    assert set(rep.steps[0].nonfinite_params) == {"planted_w1", "planted_w2"}
    dot = rep.op_named("planted_dot0")
    assert dot.outputs[0].overflow > 0.5 and dot.outputs[0].max_abs > 65504
    # the relu after it (float32) outputs inf: it shows as inf and counts (was: 0, 0.0%)
    relu = rep.op_named("planted_relu0")
    assert relu.precision == "float32" and relu.worst()[:2] == (np.inf, 1.0)
    row = next(line.split() for line in rep.format().splitlines() if "planted_relu0" in line)
    assert row[5:7] == ["inf", "100.0%"], row


def test_a_policy_that_keeps_no_op_low_is_said_plainly():
    """The fix that moved matmul to fp32 leaves this model (two matmuls) nothing in fp16:
    the report says so in its second line, and does not say 'nothing to change'."""
    policy = Policy.preset("O1", emulate=True, ops=OpLists(fp32=frozenset({"matmul"})))
    rep = _doctor("overflow", policy=policy).report()
    assert rep.overflow_steps == 0 and rep.findings() == []
    lines = rep.format().splitlines()
    assert lines[1].startswith("NOTE: no op of this model runs in fp16 under this policy")
    assert "nothing to change" not in lines[-1] and "no op runs in fp16" in lines[-1]


def test_its_recommended_policy_stops_the_overflow_steps(tmp_path):
    path = tmp_path / "fix.toml"
    _doctor("overflow").recommendation().write(path)
    amp.reset()
    net, loss_fn, trainer = _setup("overflow", policy=str(path))
    skipped = []
    for s in range(3):
        _step("overflow", net, loss_fn, trainer, s)
        skipped.append(amp.last_step_skipped(trainer))
    assert skipped == [False, False, False]
    amp.reset()
    fixed = _doctor("overflow", policy=str(path)).report()
    assert fixed.overflow_steps == 0 and fixed.findings() == []


def _unscaled_grads(kind, policy):
    net, loss_fn, trainer = _setup(kind, policy)
    x, y, _ = P.arrays(kind, 0)
    with autograd.record():
        loss = loss_fn(net(mx.nd.array(x)), mx.nd.array(y))
        with amp.scale_loss(loss, trainer) as scaled:
            autograd.backward(scaled)
    amp.unscale(trainer)
    grads = {n: p.grad().asnumpy() for n, p in net.collect_params().items()}
    amp.reset()
    return grads


def test_underflowing_gradients_get_a_loss_scale_that_keeps_them(tmp_path):
    dr = _doctor("underflow")
    rep = dr.report()
    assert rep.overflow_steps == 0
    (finding,) = rep.findings()
    assert finding.kind == "underflow" and finding.action == "loss_scale"
    assert rep.steps[0].grad_flush["planted_w1"] > 0.2
    path = tmp_path / "fix.toml"
    rec = dr.recommendation()
    rec.write(path)
    # the scale the steps it was derived from need (the first half), verified on the rest
    (derived,) = rep.window(0, rec.derived).findings()
    assert Policy.from_file(path).loss_scale.scale == derived.value > 2 ** 16
    assert rec.verified and rec.held_out == 1
    amp.reset()
    exact = _unscaled_grads("underflow", Policy.preset("O0"))
    before = _unscaled_grads("underflow", P.policy("underflow"))
    after = _unscaled_grads("underflow", str(path))
    w1 = exact["planted_w1"]
    assert (before["planted_w1"][w1 != 0] == 0).mean() > 0.2  # flushed at 2**16
    np.testing.assert_allclose(after["planted_w1"], w1, rtol=0.05, atol=1e-2 * abs(w1).max())


def test_a_precision_sensitive_reduction_is_moved_to_fp32(tmp_path):
    dr = _doctor("reduction")
    rep = dr.report()
    first = rep.findings()[0]
    assert (first.kind, first.name, first.canonical) == ("precision", "planted_dot0", "matmul")
    assert rep.op_named("planted_dot0").errors[0] > 0.1
    path = tmp_path / "fix.toml"
    dr.recommendation().write(path)
    amp.reset()
    fixed = _doctor("reduction", policy=str(path)).report()
    assert fixed.op_named("planted_dot0").errors[0] < 1e-5 and fixed.findings() == []


def _state(net, trainer):
    params = {n: (p.data().asnumpy().copy(), p.grad().asnumpy().copy())
              for n, p in net.collect_params().items()}
    states = {i: tuple(s.asnumpy().copy() for s in (st if isinstance(st, tuple) else (st,)))
              for i, st in trainer._updaters[0].states.items()}
    return params, states, amp.state_dict(trainer), trainer._optimizer.num_update


def test_model_trainer_and_loss_scale_are_bitwise_as_before():
    net, loss_fn, trainer = _setup("underflow", optimizer="adam")
    _step("underflow", net, loss_fn, trainer, 0)  # optimizer state exists
    before = _state(net, trainer)
    assert not net._forward_pre_hooks and not loss_fn._forward_pre_hooks
    with doctor(net, loss_fn, trainer) as dr:
        for s in range(1, 3):
            _step("underflow", net, loss_fn, trainer, s)  # these steps move the weights
        assert net._forward_pre_hooks
    assert dr.steps == 2
    after = _state(net, trainer)
    for (a, ga), (b, gb) in zip(before[0].values(), after[0].values()):
        assert a.tobytes() == b.tobytes() and ga.tobytes() == gb.tobytes()
    for sa, sb in zip(before[1].values(), after[1].values()):
        assert all(x.tobytes() == y.tobytes() for x, y in zip(sa, sb))
    assert before[2] == after[2] and before[3] == after[3]
    assert not net._forward_pre_hooks and not loss_fn._forward_pre_hooks  # off: no hooks


def test_the_doctor_needs_init_and_gluon_blocks():
    net, loss_fn = P.mxnet_model("overflow")
    with pytest.raises(RuntimeError, match="call mxnet_amp.init"):
        doctor(net, loss_fn)
    amp.init(policy=P.policy("overflow"))
    with pytest.raises(TypeError, match="HybridBlock"):
        doctor(lambda x: x, loss_fn)
    with pytest.raises(RuntimeError, match="saw no step"):
        with doctor(net, loss_fn) as dr:
            pass
        dr.report()


def _dense_overflow_model():
    """The planted overflow as Dense layers (FullyConnected, which has a oneDNN bf16 kernel;
    MXNet 1.9.1 has none for the planted model's dot)."""
    _, _, params = P.arrays("overflow")
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Dense(params["w1"].shape[1], activation="relu", use_bias=False),
            gluon.nn.Dense(params["w2"].shape[1], use_bias=False))
    net.initialize()
    net(mx.nd.zeros((1, params["w1"].shape[0])))
    for layer, w in zip(net, (params["w1"], params["w2"])):
        layer.weight.set_data(mx.nd.array(w.T))  # Dense stores (out, in)
    net.hybridize()
    return net


def _dense_doctor(policy):
    """The doctor over two steps of the planted overflow as two Dense layers (``init`` left
    on: the caller resets)."""
    amp.init(policy=policy)
    net, loss_fn = _dense_overflow_model(), P.mxnet_model("overflow")[1]
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 1e-3})
    amp.init_trainer(trainer)
    with doctor(net, loss_fn, trainer) as dr:
        for s in range(2):
            _step("overflow", net, loss_fn, trainer, s)
    return dr


def _dense_report(policy):
    dr = _dense_doctor(policy)
    amp.reset()
    return dr.report()


def test_the_replay_backward_runs_through_a_bf16_value_while_init_patches_the_ops():
    """The replay's gradient buffers are made unpatched: ``attach_grad``'s ``zeros_like`` is
    fp32 in the bfloat16 lists, and a float32 buffer for a bfloat16 value fails MXNet's type
    inference ("Backward shape inconsistent"). Needs no bf16 kernel but ``amp_cast``."""
    import importlib
    run = importlib.import_module("mxnet_amp.doctor")._run
    bf16 = np.dtype([("bfloat16", np.uint16)])
    x = mx.sym.var("x")
    y = mx.sym.sum(mx.sym.amp_cast(mx.sym.amp_cast(x, dtype=bf16), dtype="float32"))
    amp.init(policy=Policy.preset("O1-bf16"))
    _, grads, _, backward = run(y, {"x": mx.nd.array([[1.0, 3.0]])}, 4.0)
    assert grads["x"].tolist() == [[4.0, 4.0]]
    assert len(backward) == 3  # sum, then both casts


def test_bf16_keeps_the_range_that_overflowed_in_fp16():
    """On real bf16 kernels (never emulated here; skips on a CPU without them): the planted
    GEMM that overflows fp16 (emulated) runs in bf16 with fp32's range, no step skipped."""
    from mxnet_amp.kernels import has_kernel
    if not has_kernel("FullyConnected", mx.cpu(), "bfloat16", backward=True):
        pytest.skip("no bfloat16 FullyConnected kernel on this CPU (oneDNN runs bf16 with "
                    "AVX-512, natively with avx512_bf16): the probe says so")
    fp16 = _dense_report(P.policy("overflow"))
    assert fp16.emulated and fp16.overflow_steps == 2
    bf16 = _dense_report(Policy.preset("O1-bf16"))
    assert not bf16.emulated and bf16.overflow_steps == 0
    assert not [f for f in bf16.findings() if f.kind == "overflow"]
    gemms = [r for r in bf16.ops if r.op == "FullyConnected"]
    assert gemms and all(r.precision == "bfloat16" and not r.emulated for r in gemms)
    assert gemms[0].outputs[0].max_abs > 65504  # past fp16's range, within bf16's


# -- the narrowest fix: four Dense layers (tests/doctor_planted.py: LAYERED) --------------------

def _layered(kind, policy=None, hybridize=True, doctor_steps=0, steps=2, named=True,
             losses=None, built=None):
    """(doctor or None, trainer, [skipped per step]) of ``steps`` training steps of a layered
    planted model, the first ``doctor_steps`` inside the doctor (``named``: its blocks have
    fixed names, else Gluon's counter names; each loss is appended to ``losses``, the net
    to ``built``)."""
    amp.init(policy=policy or P.policy(kind))
    net, loss_fn = P.mxnet_layered(kind, hybridize, named)
    if built is not None:
        built.append(net)
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 1e-3})
    amp.init_trainer(trainer)
    dr = doctor(net, loss_fn, trainer) if doctor_steps else None
    skipped = []
    for s in range(steps):
        x, y, _ = P.layered_arrays(kind, s)
        x, y = mx.nd.array(x), mx.nd.array(y)
        if dr is not None and s == 0:
            dr.__enter__()
        with autograd.record():
            loss = loss_fn(net(x), y)
            with amp.scale_loss(loss, trainer) as scaled:
                autograd.backward(scaled)
        trainer.step(1)
        skipped.append(amp.last_step_skipped(trainer))
        if losses is not None:
            losses.append(float(loss.asscalar()))
        if dr is not None and s == doctor_steps - 1:
            dr.__exit__(None, None, None)
    return dr, trainer, skipped


def _trained_under(rec, kind, hybridize, tmp_path):
    """(the file ``rec`` wrote, [skipped] of 4 training steps of ``kind`` under it)."""
    path = tmp_path / "fix.toml"
    rec.write(path)
    amp.reset()
    return path, _layered(kind, policy=str(path), hybridize=hybridize, steps=4)[2]


def _fp32_nans(kind, hybridize, steps):
    """How many of the steps have a non-finite loss or gradient in float32 (the bar)."""
    amp.reset()
    amp.init(policy="O0")
    net, loss_fn = P.mxnet_layered(kind, hybridize)
    bad = 0
    for s in range(steps):
        x, y, _ = P.layered_arrays(kind, s)
        with autograd.record():
            loss = loss_fn(net(mx.nd.array(x)), mx.nd.array(y))
        loss.backward()
        grads = [p.grad().asnumpy() for p in net.collect_params().values()]
        bad += not (np.isfinite(loss.asnumpy()).all() and all(np.isfinite(g).all()
                                                              for g in grads))
    amp.reset()
    return bad


@pytest.mark.parametrize("hybridize", [True, False], ids=["hybridized", "imperative"])
def test_one_overflowing_layer_is_named_and_only_it_moves_to_fp32(hybridize, tmp_path):
    dr, _, skipped = _layered("layer_overflow", hybridize=hybridize, doctor_steps=2)
    assert skipped == [True, True]  # the planted overflow, under plain O1
    rep = dr.report()
    first = rep.findings()[0]
    assert (first.kind, first.name, first.canonical) == ("overflow", "dense2_fwd", "linear")
    assert rep.op_named("dense2_fwd").layer_name == "2"  # its path: the third child
    rec = dr.recommendation()
    assert rec.policy.mxnet_layers.fp32 == {"2"} and rec.policy.layers.fp32 == set()
    assert rec.policy.ops == P.policy("layer_overflow").ops  # no op type moves
    assert rec.verified and rec.keeps == ("3 of 4 linear ops stay fp16",)
    assert rec.tried[0] == ("keep '2' in float32", True, rec.verification)
    assert "# Keeps: 3 of 4 linear ops stay fp16." in rec.toml and "# Verified:" in rec.toml
    assert "keep '2' in float32" in str(rec) and "verified:" in str(rec)
    path, skipped = _trained_under(rec, "layer_overflow", hybridize, tmp_path)
    assert sum(skipped) == 0 == _fp32_nans("layer_overflow", hybridize, 4)
    # and under the file the doctor finds nothing left, with the other three layers low
    amp.reset()
    dr, _, _ = _layered("layer_overflow", policy=str(path), hybridize=hybridize,
                        doctor_steps=2)
    again = dr.report()
    assert again.overflow_steps == 0 and again.findings() == []
    assert [r.name for r in again.ops if r.lowered and r.canonical == "linear"] == \
        ["dense0_fwd", "dense1_fwd", "dense3_fwd"]


@pytest.mark.parametrize("hybridize", [True, False], ids=["hybridized", "imperative"])
def test_the_fix_applies_to_the_model_built_again_in_the_same_process(hybridize, tmp_path):
    """A notebook's flow: the doctor on a model whose blocks have Gluon's counter names, then
    the same model built again (other names: ``hybridsequential1_dense2``) trained under the
    file. The file names the layer by its path, so the fix applies: 3 of 4 GEMMs stay low,
    no step is skipped, every loss is finite, and the cast report names the layer by its
    path. (Named ``hybridsequential0_dense2``, the rule matched nothing the second time and
    every step was skipped on a NaN loss.)"""
    dr, _, skipped = _layered("layer_overflow", hybridize=hybridize, doctor_steps=2,
                              named=False)
    assert skipped == [True, True]
    rec = dr.recommendation()
    assert rec.policy.mxnet_layers.fp32 == {"2"} and rec.verified
    path = tmp_path / "fix.toml"
    rec.write(path)
    amp.reset()
    losses, built = [], []
    _, _, skipped = _layered("layer_overflow", policy=str(path), hybridize=hybridize, steps=12,
                             named=False, losses=losses, built=built)
    try:
        assert sum(skipped) == 0 and np.isfinite(losses).all()
        (net,) = built
        assert net[2].name != dr.net[2].name  # built again: another counter name
        if hybridize:
            gemms = [d for d in amp.cast_report(net).decisions if d.op == "FullyConnected"]
            assert [d.precision for d in gemms] == ["float16", "float16", "float32", "float16"]
            assert [d.layer for d in gemms] == [None, None, "2", None]
            assert "layer '2' listed in Policy.mxnet_layers.fp32" in gemms[2].reason
    finally:
        amp.reset()


def test_a_layer_rule_that_names_no_layer_raises_naming_the_closest():
    """A rule naming no block path, block name or node of the model raises when the first loss
    is scaled (every block of the step has been called), naming the closest layers, and
    leaves the trainer's loss-scale state as it was."""
    from amp_adapters import AmpConfigError, LayerLists
    policy = Policy.preset("O1", emulate=True, mxnet_layers=LayerLists(fp32={"7", "2"}))
    amp.init(policy=policy)
    try:
        net, loss_fn = P.mxnet_layered("layer_overflow", named=False)
        trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 1e-3})
        amp.init_trainer(trainer)
        before = amp.loss_scale(trainer)
        x, y, _ = P.layered_arrays("layer_overflow", 0)
        with autograd.record():
            loss = loss_fn(net(mx.nd.array(x)), mx.nd.array(y))
            with pytest.raises(AmpConfigError) as e:
                with amp.scale_loss(loss, trainer):
                    pass
        msg = str(e.value)
        assert "layer '7' matches no layer of the model" in msg and "'2'" not in \
            msg.split(";")[0] and "the closest layers it has: '0', '1', '2'" in msg
        assert amp.loss_scale(trainer) == before
        # the doctor refuses it too, before recording anything
        with pytest.raises(AmpConfigError, match="layer '7' matches no layer"):
            with doctor(net, loss_fn, trainer) as dr:
                loss_fn(net(mx.nd.array(x)), mx.nd.array(y))
        assert dr.steps == 0
    finally:
        amp.reset()


@pytest.mark.parametrize("hybridize", [True, False], ids=["hybridized", "imperative"])
def test_a_backward_only_overflow_is_fixed_by_the_loss_scale_alone(hybridize, tmp_path):
    dr, _, skipped = _layered("layer_backward", hybridize=hybridize, doctor_steps=2)
    assert skipped == [True, True]
    rec = dr.recommendation()
    P.check_scale_only_fix(dr.report(), rec)
    assert rec.fix.endswith("no op moves")
    _, skipped = _trained_under(rec, "layer_backward", hybridize, tmp_path)
    assert sum(skipped) == 0 == _fp32_nans("layer_backward", hybridize, 4)


@pytest.mark.parametrize("hybridize", [True, False], ids=["hybridized", "imperative"])
def test_a_precision_loss_in_one_layer_is_named_and_only_it_moves(hybridize, tmp_path):
    dr, _, skipped = _layered("layer_precision", hybridize=hybridize, doctor_steps=2)
    rep = dr.report()
    assert rep.overflow_steps == 0 and skipped == [False, False]  # no overflow: precision
    (first,) = [f for f in rep.findings() if f.action]
    assert (first.kind, first.name) == ("precision", "dense2_fwd")
    assert rep.op_named("dense2_fwd").added[0] > 0.1
    rec = dr.recommendation()
    assert rec.policy.mxnet_layers.fp32 == {"2"} and rec.policy.ops == \
        P.policy("layer_precision").ops
    assert rec.verified and rec.keeps == ("3 of 4 linear ops stay fp16",)
    path = tmp_path / "fix.toml"
    rec.write(path)
    amp.reset()
    dr, _, _ = _layered("layer_precision", policy=str(path), hybridize=hybridize,
                        doctor_steps=2)
    again = dr.report()
    fixed = again.op_named("dense2_fwd")
    assert again.findings() == [] and fixed.added[0] == 0.0 and fixed.errors[0] < 1e-2


def test_bf16_is_a_candidate_whose_replay_has_no_overflow_where_this_cpu_runs_it():
    """The planted forward overflow in one layer: on a CPU whose bf16 kernels run every op the
    model ran in fp16, the same model in bf16 is a candidate (after the layer), and its
    replay of the recorded steps overflows nowhere (float32's range)."""
    from amp_adapters.services.doctor.candidates import candidates, passes
    from mxnet_amp.kernels import has_kernel
    if not has_kernel("FullyConnected", mx.cpu(), "bfloat16", backward=True):
        pytest.skip("no bfloat16 FullyConnected kernel here (oneDNN needs AVX-512)")
    dr, _, _ = _layered("layer_overflow", doctor_steps=2)
    try:
        found = [c for c in candidates(dr.report(), dr.policy, dr.bf16_kernels())
                 if c.kind == "bf16"]
        assert len(found) == 1 and found[0].policy.dtype == "bfloat16"
        replay = dr.replay(found[0].policy)
        assert not replay.overflow_steps and passes(replay)[0]
    finally:
        amp.reset()


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_the_fix_is_verified_by_training_under_it_on_a_held_out_step(optimizer):
    """The fix is derived from the first recorded step and verified on the second, held
    out, by training under it: its step 1 runs on the parameters its own optimizer update
    (a copy of the trainer's optimizer and state) gave, as real training under the fix does.
    The file says how many steps verified it. (Before: both steps replayed on the recorded
    parameters, without an update.)"""
    def run(policy, doctor_steps, lr=0.05):
        amp.init(policy=policy)
        net, loss_fn = P.mxnet_layered("layer_overflow")
        trainer = gluon.Trainer(net.collect_params(), optimizer, {"learning_rate": lr})
        amp.init_trainer(trainer)
        with doctor(net, loss_fn, trainer) as dr:
            for s in range(doctor_steps):
                x, y, _ = P.layered_arrays("layer_overflow", s)
                with autograd.record():
                    loss = loss_fn(net(mx.nd.array(x)), mx.nd.array(y))
                    with amp.scale_loss(loss, trainer) as scaled:
                        autograd.backward(scaled)
                trainer.step(4)
        amp.reset()
        return dr

    dr = run(P.policy("layer_overflow"), 2)
    rec = dr.recommendation()
    assert rec.verified and (rec.derived, rec.held_out, rec.updates) == (1, 1, 2)
    assert "# Verified on: 1 held-out step(s) (derived from 1; 2 optimizer update(s) in its " \
           "trial)." in rec.toml
    amp.init(policy=rec.policy)
    trial = dr.replay(rec.policy)
    amp.reset()
    assert [s.updated for s in trial.steps] == [True, True]
    real = run(rec.policy, 2).report()  # training under the fix, the doctor watching
    assert [s.overflow for s in real.steps] == [False, False]
    for mine, theirs in zip(trial.ops, real.ops):
        assert mine.name == theirs.name
        assert mine.outputs[1].max_abs == pytest.approx(theirs.outputs[1].max_abs, rel=1e-4)
    # and the update moved them: step 1 on the recorded parameters (no update) differs
    still = run(rec.policy, 2, lr=0.0).report()
    moved = [abs(m.outputs[1].max_abs - r.outputs[1].max_abs) /
             max(r.outputs[1].max_abs, 1e-12) for m, r in zip(trial.ops, still.ops)]
    assert max(moved) > 1e-3


def test_where_bf16_is_emulated_the_doctor_does_not_offer_it():
    """The planted overflow as two Dense layers, where keeping the first in fp32 fails: on
    bf16 kernels the model in bf16 is tried next, unless the device's truth says oneDNN
    emulates bf16 here (slower than float32): then it is not tried (the CPU class is given
    as data; the session reads it from ``isa.bf16_class``)."""
    from amp_adapters.services.doctor import recommend
    from amp_adapters.services.doctor.bf16 import Bf16Speed
    from amp_adapters.rules.isa import bf16_class, machine
    dr = _dense_doctor(P.policy("overflow"))
    try:
        assert dr.bf16_speed().emulated == (bf16_class(machine()) == "emulated")
        kernels = dr.bf16_kernels()
        if "FullyConnected" not in kernels:
            pytest.skip("no bfloat16 FullyConnected kernel here (oneDNN needs AVX-512)")
        tried = {speed: [what for what, _, _ in recommend(dr.report(), dr.policy, dr.replay,
                                                          kernels, Bf16Speed(speed)).tried]
                 for speed in (False, True)}
        assert any("bfloat16" in what for what in tried[False])
        assert not any("bfloat16" in what for what in tried[True])
    finally:
        amp.reset()


def test_the_trial_starts_from_the_recorded_optimizer_state_under_update_on_kvstore():
    """With ``update_on_kvstore=True`` the optimizer state lives in the kvstore's updater,
    not the trainer's: the trial of a fix still starts from Adam's moments as they were at
    the first recorded step (warm-up steps ran before the doctor), so its held-out step
    matches the same trial where the trainer updates (``update_on_kvstore=False``). (Before:
    under the kvstore the trial's Adam started from no moments.)"""
    def trial(on_kvstore):
        amp.init(policy=P.policy("layer_overflow"))
        net, loss_fn = P.mxnet_layered("layer_overflow")
        trainer = gluon.Trainer(net.collect_params(), "adam", {"learning_rate": 0.05},
                                kvstore=mx.kv.create("local"), update_on_kvstore=on_kvstore)
        amp.init_trainer(trainer)

        def step(s, factor=1.0):
            x, y, _ = P.layered_arrays("layer_overflow", s)
            with autograd.record():
                loss = loss_fn(net(mx.nd.array(x * factor)), mx.nd.array(y))
                with amp.scale_loss(loss, trainer) as scaled:
                    autograd.backward(scaled)
            trainer.step(4)
        for s in range(2):  # warm-up on small inputs (no overflow): Adam's moments exist
            step(s, 0.01)
        assert bool(trainer._update_on_kvstore) == on_kvstore
        assert amp.loss_scale(trainer).skipped_steps == 0
        with doctor(net, loss_fn, trainer) as dr:
            for s in range(2):
                step(s)
        rec = dr.recommendation()
        report = dr.replay(rec.policy)
        amp.reset()
        return report

    on, off = trial(True), trial(False)
    assert [s.updated for s in on.steps] == [s.updated for s in off.steps] == [True, True]
    for a, b in zip(on.ops, off.ops):
        assert a.outputs[1].max_abs == pytest.approx(b.outputs[1].max_abs, rel=1e-5), a.name
