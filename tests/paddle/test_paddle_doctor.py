"""paddle_amp.doctor on static programs with a planted problem: it names the op, its policy
fixes the run, and every persistable (parameters, optimizer state, loss scale) is bit-identical
after it. Both program IRs (AMP_TEST_IR=pir on Paddle 3), with the same findings."""
import contextlib
import importlib.util
from pathlib import Path

import numpy as np
import paddle
import pytest

import paddle_amp
from amp_adapters import OpLists, Policy
from paddle_amp.doctor import doctor
from paddle_helpers import static_in_own_scope  # noqa: F401 (a fixture)

_spec = importlib.util.spec_from_file_location(
    "doctor_planted", Path(__file__).resolve().parents[1] / "doctor_planted.py")
P = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(P)

IR = __import__("os").environ.get("AMP_TEST_IR", "legacy")


pytestmark = pytest.mark.usefixtures("static_in_own_scope")


def _doctor(kind, policy=None, steps=2, optimizer=None):
    main, loss, opt, exe = P.paddle_model(kind, policy, optimizer)
    with doctor(opt, exe) as dr:
        for s in range(steps):
            exe.run(main, feed=P.paddle_feed(kind, s), fetch_list=[loss])
    return dr


def test_the_overflowing_matmul_is_named_first():
    rep = _doctor("overflow").report()
    assert rep.emulated and "EMULATED" in rep.format() and rep.overflow_steps == 2
    first = rep.findings()[0]
    assert (first.kind, first.op, first.canonical, first.action) == \
        ("overflow", "matmul_v2", "matmul", "fp32")
    assert first.name == rep.ops[0].name and rep.steps[0].first_forward == first.name
    assert rep.steps[0].first_backward  # the overflow reaches the backward too
    assert set(rep.steps[0].nonfinite_params) == {"w1", "w2"}
    assert rep.ops[0].outputs[0].max_abs > 65504
    # the ops after it see inf: their max|out| shows it and it counts (was: 0, 0.0%)
    after = [r for r in rep.ops[1:] if r.precision == "float32" and any(r.nonfinite)]
    assert after and all(r.worst()[1] > 0 and not r.worst()[0] < np.inf for r in after)
    rows = {line.split()[1]: line.split() for line in rep.format().splitlines()
            if line.startswith("  ") and len(line.split()) > 8}
    assert all(rows[r.name][5] in ("inf", "nan") for r in after), rows


def test_a_policy_that_keeps_no_op_low_is_said_plainly():
    """A fix that moved matmul to fp32 leaves this model nothing in fp16: the report says so
    in its second line, and does not say 'nothing to change'."""
    policy = Policy.preset("O1", emulate=True, ops=OpLists(fp32=frozenset({"matmul"})))
    rep = _doctor("overflow", policy).report()
    assert rep.overflow_steps == 0 and rep.findings() == []
    lines = rep.format().splitlines()
    assert lines[1].startswith("NOTE: no op of this model runs in fp16 under this policy")
    assert "nothing to change" not in lines[-1] and "no op runs in fp16" in lines[-1]


def test_its_recommended_policy_stops_the_overflow_steps(tmp_path):
    path = tmp_path / "fix.toml"
    _doctor("overflow").recommendation().write(path)
    main, loss, opt, exe = P.paddle_model("overflow", str(path))
    skipped = []
    for s in range(3):
        exe.run(main, feed=P.paddle_feed("overflow", s), fetch_list=[loss])
        skipped.append(opt.loss_scale().skipped_steps)
    assert skipped == [0, 0, 0]
    fixed = _doctor("overflow", str(path)).report()
    assert fixed.overflow_steps == 0 and fixed.findings() == []


def _grads(policy):
    main, loss, opt, exe = P.paddle_model("underflow", policy)
    scale = opt.loss_scale().scale if policy != "O0" else 1.0
    (g,) = exe.run(main, feed=P.paddle_feed("underflow", 0), fetch_list=["w1@GRAD"])
    return np.asarray(g) / scale if policy != "O0" else np.asarray(g)


def test_underflowing_gradients_get_a_loss_scale_that_keeps_them(tmp_path):
    dr = _doctor("underflow")
    rep = dr.report()
    (finding,) = rep.findings()
    assert finding.kind == "underflow" and finding.action == "loss_scale"
    assert rep.steps[0].grad_flush["w1"] > 0.2
    path = tmp_path / "fix.toml"
    rec = dr.recommendation()
    rec.write(path)
    # the scale the steps it was derived from need (the first half), verified on the rest
    (derived,) = rep.window(0, rec.derived).findings()
    assert Policy.from_file(path).loss_scale.scale == derived.value > 2 ** 16
    assert rec.verified and rec.held_out == 1
    exact = rep.steps[0]  # the doctor's float32 run saw non-zero gradients
    assert exact.grad_zero["w1"] > 0.2  # ... that the fp16 run flushed to zero
    fixed = _doctor("underflow", str(path)).report()
    assert fixed.steps[0].grad_zero["w1"] == 0 and fixed.findings() == []


def test_a_precision_sensitive_reduction_is_moved_to_fp32(tmp_path):
    dr = _doctor("reduction")
    rep = dr.report()
    first = rep.findings()[0]
    assert (first.kind, first.op, first.canonical) == ("precision", "matmul_v2", "matmul")
    assert rep.ops[0].errors[0] > 0.1
    path = tmp_path / "fix.toml"
    dr.recommendation().write(path)
    fixed = _doctor("reduction", str(path)).report()
    assert fixed.ops[0].errors[0] < 1e-5 and fixed.findings() == []


def test_every_persistable_is_bitwise_as_before():
    main, loss, opt, exe = P.paddle_model("underflow", optimizer=paddle.optimizer.Adam(1e-3))
    exe.run(main, feed=P.paddle_feed("underflow", 0), fetch_list=[loss])  # Adam moments exist
    scope = paddle.static.global_scope()
    names = [v.name for v in main.list_vars() if v.persistable and scope.find_var(v.name)]
    before = {n: np.array(scope.find_var(n).get_tensor()).tobytes() for n in names}
    scale_before = opt.loss_scale()
    run_before = exe.run
    with doctor(opt, exe) as dr:
        for s in range(1, 3):
            exe.run(main, feed=P.paddle_feed("underflow", s), fetch_list=[loss])
        assert exe.run is not run_before
    assert dr.steps == 2
    after = {n: np.array(scope.find_var(n).get_tensor()).tobytes() for n in names}
    assert after == before and opt.loss_scale() == scale_before
    assert "run" not in exe.__dict__  # off: the executor's own run again


def test_the_doctor_needs_a_decorated_optimizer_that_built_its_program():
    opt = paddle_amp.decorate(paddle.optimizer.SGD(0.1), policy="O1")
    with pytest.raises(RuntimeError, match="after minimize"):
        doctor(opt, paddle.static.Executor(paddle.CPUPlace()))


def _in(ir, kind):
    """The doctor over two steps of ``kind``, its program built in ``ir`` (one process)."""
    guard = paddle.pir_utils.OldIrGuard() if ir == "legacy" else contextlib.nullcontext()
    with guard:
        return _doctor(kind)


@pytest.mark.skipif(IR != "pir", reason="both IRs in one process: AMP_TEST_IR=pir on Paddle 3")
@pytest.mark.parametrize("kind", P.KINDS)
def test_under_pir_the_same_findings_and_recommendation_as_the_legacy_ir(kind):
    """The doctor consistency suite's comparison, PIR against the legacy IR (whose doctor
    that suite holds equal to MXNet's)."""
    old, new = _in("legacy", kind), _in("pir", kind)
    assert old.program is not new.program and new.ir.name == "pir" and old.ir.name == "legacy"
    ro, rn = old.report(), new.report()
    assert rn.findings() and rn.findings() == ro.findings()
    assert new.recommendation().policy == old.recommendation().policy
    assert [s.overflow for s in rn.steps] == [s.overflow for s in ro.steps]
    assert [(r.name, r.canonical, r.precision, r.emulated) for r in rn.ops] == \
        [(r.name, r.canonical, r.precision, r.emulated) for r in ro.ops]
    assert [dict(s.grad_flush) for s in rn.steps] == [dict(s.grad_flush) for s in ro.steps]
    assert [set(s.nonfinite_params) for s in rn.steps] == \
        [set(s.nonfinite_params) for s in ro.steps]


def test_bf16_keeps_the_range_that_overflowed_in_fp16():
    """On real bf16 kernels (oneDNN; skips on a CPU without them): the planted matmul that
    overflows fp16 (emulated) runs in bf16 with fp32's range, and no step is skipped."""
    from paddle_amp import ir, kernels
    probe = (ir.PirProgram if IR == "pir" else ir.LegacyProgram).probe
    if not kernels.runs_onednn_bf16("matmul_v2", backward=True, probe=probe):
        pytest.skip("no oneDNN bfloat16 matmul here (it needs AVX-512, and avx512_bf16 to be "
                    "fast): the probe's answer")
    rep = _doctor("overflow", Policy.preset("O1-bf16")).report()
    assert not rep.emulated and rep.overflow_steps == 0
    assert not [f for f in rep.findings() if f.kind == "overflow"]
    matmuls = [r for r in rep.ops if r.canonical == "matmul"]
    assert matmuls and all(r.precision == "bfloat16" and not r.emulated for r in matmuls)
    assert matmuls[0].outputs[0].max_abs > 65504  # past fp16's range, within bf16's


# -- the narrowest fix: four fc layers (tests/doctor_planted.py: LAYERED), in this IR -----------

def _layered(kind, policy=None, doctor_steps=0, steps=2, layers=False, built=None):
    """(doctor or None, [skipped steps so far, per step]) of ``steps`` training steps of a
    layered planted program, the first ``doctor_steps`` inside the doctor (``layers``: built
    from ``paddle.nn`` layers with counter-named parameters; the program is appended to
    ``built``)."""
    main, loss, opt, exe = P.paddle_layered(kind, policy, layers=layers)
    if built is not None:
        built.append(main)
    dr = doctor(opt, exe) if doctor_steps else None
    skipped, losses = [], []
    for s in range(steps):
        if dr is not None and s == 0:
            dr.__enter__()
        (value,) = exe.run(main, feed=P.paddle_layered_feed(kind, s), fetch_list=[loss])
        losses.append(float(np.asarray(value)))
        if policy != "O0":
            skipped.append(opt.loss_scale().skipped_steps)
        if dr is not None and s == doctor_steps - 1:
            dr.__exit__(None, None, None)
    return dr, skipped, losses


def test_one_overflowing_layer_is_named_and_only_it_moves_to_fp32(tmp_path):
    dr, skipped, _ = _layered("layer_overflow", doctor_steps=2)
    assert skipped == [1, 2]  # the planted overflow, under plain O1
    rep = dr.report()
    first = rep.findings()[0]
    assert (first.kind, first.canonical) == ("overflow", "matmul")
    assert rep.op_named(first.name).layer_name == "dense2"
    rec = dr.recommendation()
    assert rec.policy.paddle_layers.fp32 == {"dense2"} and rec.policy.layers.fp32 == set()
    assert rec.policy.ops == P.policy("layer_overflow").ops  # no op type moves
    assert rec.verified and rec.keeps == ("3 of 4 matmul ops stay fp16",)
    assert rec.tried[0] == ("keep 'dense2' in float32", True, rec.verification)
    assert "# Keeps: 3 of 4 matmul ops stay fp16." in rec.toml
    path = tmp_path / "fix.toml"
    rec.write(path)
    _, skipped, losses = _layered("layer_overflow", policy=str(path), steps=4)
    _, _, fp32 = _layered("layer_overflow", policy="O0", steps=4)
    assert skipped == [0, 0, 0, 0] and np.isfinite(fp32).all()
    np.testing.assert_allclose(losses, fp32, rtol=2e-2)
    dr, _, _ = _layered("layer_overflow", policy=str(path), doctor_steps=2)
    again = dr.report()
    assert again.overflow_steps == 0 and again.findings() == []
    assert [r.layer_name for r in again.ops if r.lowered and r.canonical == "matmul"] == \
        ["dense0", "dense1", "dense3"]


def test_the_fix_applies_to_the_model_built_again_in_the_same_process(tmp_path):
    """A script that diagnoses and then trains: the planted model built from ``paddle.nn``
    layers (parameters named by Paddle's counter: ``linear_2.w_0``, then ``linear_6.w_0``...),
    the doctor's file applied to the same model built again. The file names the layer by
    its path (``2``), so the fix applies: 3 of 4 GEMMs stay low, no step is skipped, every
    loss is finite, and the cast report names the layer by its path."""
    built = []
    dr, skipped, _ = _layered("layer_overflow", doctor_steps=2, layers=True, built=built)
    assert skipped == [1, 2]
    rep = dr.report()
    assert rep.op_named(rep.findings()[0].name).layer_name == "2"
    rec = dr.recommendation()
    assert rec.policy.paddle_layers.fp32 == {"2"} and rec.verified
    assert rec.keeps == ("3 of 4 matmul ops stay fp16",)
    path = tmp_path / "fix.toml"
    rec.write(path)
    _, skipped, losses = _layered("layer_overflow", policy=str(path), steps=12, layers=True,
                                  built=built)
    assert skipped == [0] * 12 and np.isfinite(losses).all()
    first, again = ({p.name for p in prog.global_block().all_parameters()} for prog in built)
    assert not first & again  # built again: other parameter names
    gemms = [d for d in paddle_amp.cast_report(built[1]).decisions if d.canonical == "matmul"]
    assert [d.precision for d in gemms] == ["float16", "float16", "float32", "float16"]
    assert [d.layer for d in gemms] == [None, None, "2", None]
    assert "layer '2' listed in Policy.paddle_layers.fp32" in gemms[2].reason


def test_a_layer_rule_that_names_no_layer_raises_naming_the_closest():
    """A rule naming no layer path, parameter, variable or name scope of the program raises at
    minimize, naming the closest layers, before the program changes."""
    from amp_adapters import AmpConfigError, LayerLists
    main, startup = paddle.static.Program(), paddle.static.Program()
    with paddle.static.program_guard(main, startup):
        x = paddle.static.data("x", [4, 8], "float32")
        net = paddle.nn.Sequential(*(paddle.nn.Linear(8, 8) for _ in range(3)))
        loss = paddle.mean(net(x))
        ops = [paddle_amp.ir.of(main).op_type(op) for op in main.global_block().ops]
        opt = paddle_amp.decorate(paddle.optimizer.SGD(0.1), emulate=True, policy=Policy.preset(
            "O1", paddle_layers=LayerLists(fp32={"7", "1"})))
        with pytest.raises(AmpConfigError) as e:
            opt.minimize(loss)
    msg = str(e.value)
    assert msg.startswith("layer '7' matches no layer of the program; the closest layers it "
                          "has: '0', '1', '2'")
    assert "'1' matches" not in msg
    assert [paddle_amp.ir.of(main).op_type(op) for op in main.global_block().ops] == ops
    assert opt._train_program is None


def _paramless(policy, x=1.2):
    """(main, loss, decorated optimizer, executor) of ``h = x @ w; g = h @ h.T``: the second
    matmul, which reads no parameter (no layer path, no parameter name), overflows fp16."""
    main, startup = paddle.static.Program(), paddle.static.Program()
    with paddle.static.program_guard(main, startup):
        data = paddle.static.data("x", [4, 8], "float32")
        w = paddle.static.create_parameter(
            [8, 8], "float32", default_initializer=paddle.nn.initializer.Constant(10.0))
        h = data @ w
        loss = paddle.mean(h @ paddle.transpose(h, [1, 0])) * 1e-6
        opt = paddle_amp.decorate(paddle.optimizer.SGD(1e-3), policy=policy, emulate=True)
        opt.minimize(loss)
    exe = paddle.static.Executor(paddle.CPUPlace())
    exe.run(startup)
    opt.amp_init(paddle.CPUPlace())
    return main, loss, opt, exe


def test_a_candidate_naming_an_op_without_parameters_fails_its_replay_quietly(tmp_path):
    """An op that reads no parameter has only its record name (``matmul_v2_7``), which no
    rule matches: keeping it by name fails its replay, without an error or a warning, and
    the doctor recommends a wider fix, which applies to the program built again."""
    import warnings
    main, loss, opt, exe = _paramless("O1")
    with doctor(opt, exe) as dr:
        for _ in range(2):
            exe.run(main, feed={"x": np.full((4, 8), 1.2, np.float32)}, fetch_list=[loss])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rec = dr.recommendation()
    assert not [w for w in caught if "matches no" in str(w.message)]
    by_name = [t for t in rec.tried if t[0].startswith("keep 'matmul_v2_")]
    assert by_name and not by_name[0][1] and rec.verified
    assert not rec.policy.paddle_layers and not rec.policy.layers
    path = tmp_path / "fix.toml"
    rec.write(path)
    main, loss, opt, exe = _paramless(str(path))
    (value,) = exe.run(main, feed={"x": np.full((4, 8), 1.2, np.float32)}, fetch_list=[loss])
    assert np.isfinite(value).all()


def test_a_backward_only_overflow_is_fixed_by_the_loss_scale_alone(tmp_path):
    dr, skipped, _ = _layered("layer_backward", doctor_steps=2)
    assert skipped == [1, 2]
    rec = dr.recommendation()
    P.check_scale_only_fix(dr.report(), rec)
    path = tmp_path / "fix.toml"
    rec.write(path)
    _, skipped, _ = _layered("layer_backward", policy=str(path), steps=4)
    assert skipped == [0, 0, 0, 0]


def test_a_precision_loss_in_one_layer_is_named_and_only_it_moves(tmp_path):
    dr, skipped, _ = _layered("layer_precision", doctor_steps=2)
    rep = dr.report()
    assert rep.overflow_steps == 0 and skipped == [0, 0]  # no overflow: precision
    (first,) = [f for f in rep.findings() if f.action]
    assert first.kind == "precision" and rep.op_named(first.name).layer_name == "dense2"
    rec = dr.recommendation()
    assert rec.policy.paddle_layers.fp32 == {"dense2"}
    assert rec.policy.ops == P.policy("layer_precision").ops
    assert rec.verified and rec.keeps == ("3 of 4 matmul ops stay fp16",)
    path = tmp_path / "fix.toml"
    rec.write(path)
    dr, _, _ = _layered("layer_precision", policy=str(path), doctor_steps=2)
    again = dr.report()
    assert again.findings() == []
    (fixed,) = [r for r in again.ops if r.layer_name == "dense2" and r.canonical == "matmul"]
    assert not fixed.lowered and fixed.added[0] == 0.0 and fixed.errors[0] < 1e-2


def test_bf16_is_a_candidate_whose_replay_has_no_overflow_where_this_cpu_runs_it():
    """As in MXNet: on a CPU whose bf16 kernels run every op the program ran in fp16, the
    same program in bf16 is a candidate, and its replay of the recorded steps overflows
    nowhere."""
    from amp_adapters.services.doctor.candidates import candidates, passes
    dr, _, _ = _layered("layer_overflow", doctor_steps=2)
    kernels = dr.bf16_kernels()
    missing = sorted(r.op for r in dr.report().ops if r.lowered and r.op not in kernels)
    if missing:
        pytest.skip(f"no bfloat16 kernel here for {missing} (oneDNN needs AVX-512)")
    found = [c for c in candidates(dr.report(), dr.policy, kernels) if c.kind == "bf16"]
    assert len(found) == 1 and found[0].policy.dtype == "bfloat16"
    replay = dr.replay(found[0].policy)
    assert not replay.overflow_steps and passes(replay)[0]


@pytest.mark.parametrize("optimizer", ["SGD", "Adam"])
def test_the_fix_is_verified_by_training_under_it_on_a_held_out_step(optimizer):
    """As in MXNet, in this IR: the fix is derived from the first recorded step and verified
    on the second, held out, by training under it (the whole decorated program: skip,
    update, loss scale), so its step 1 runs on the parameters its own update gave, as real
    training under the fix does; the file says how many steps verified it. (Before: the
    recorded steps replayed on the recorded parameters, without an update.)"""
    def run(policy, lr=0.05):
        opt = getattr(paddle.optimizer, optimizer)(lr)
        main, loss, dopt, exe = P.paddle_layered("layer_overflow", policy, opt)
        with doctor(dopt, exe) as dr:
            for s in range(2):
                exe.run(main, feed=P.paddle_layered_feed("layer_overflow", s),
                        fetch_list=[loss])
        return dr

    dr = run(None)
    inner = dr.optimizer._optimizer  # the user's: the trials train with fresh copies of it

    def accumulators():
        return {k: {p: id(v) for p, v in d.items()} for k, d in inner._accumulators.items()}

    before = accumulators()
    rec = dr.recommendation()
    assert accumulators() == before
    assert rec.verified and (rec.derived, rec.held_out, rec.updates) == (1, 1, 2)
    assert "# Verified on: 1 held-out step(s) (derived from 1; 2 optimizer update(s) in its " \
           "trial)." in rec.toml
    trial = dr.replay(rec.policy)
    assert [s.updated for s in trial.steps] == [True, True]
    real = run(rec.policy).report()  # training under the fix, the doctor watching
    assert [s.overflow for s in real.steps] == [False, False]
    for mine, theirs in zip(trial.ops, real.ops):
        assert mine.name == theirs.name
        assert mine.outputs[1].max_abs == pytest.approx(theirs.outputs[1].max_abs, rel=1e-4)
    still = run(rec.policy, lr=0.0).report()  # step 1 on the recorded parameters
    moved = [abs(m.outputs[1].max_abs - r.outputs[1].max_abs) /
             max(r.outputs[1].max_abs, 1e-12) for m, r in zip(trial.ops, still.ops)]
    assert max(moved) > 1e-3
