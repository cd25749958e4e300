"""The doctor's candidate fixes (amp_adapters.services.doctor.candidates) and the choice among them:
narrowest first, derived from the first half of the recorded steps, each verified by a
trial that holds the rest out (amp_adapters.services.doctor.verify), the first clean one
recommended. Reports are built from records here; the trial is a function of the policy
(what a backend's is: training under it from the recorded state)."""
import dataclasses
import math
import tomllib

from hypothesis import given, settings
from hypothesis import strategies as st

from amp_adapters import Policy
from amp_adapters.services.doctor import recommend
from amp_adapters.services.doctor.candidates import backward_scale, candidates, keeps, passes
from amp_adapters.services.doctor.report import DoctorReport, OpRecord, StepRecord
from amp_adapters.services.doctor.stats import Range

BASE = Policy.preset("O1", emulate=True)
OK = Range(8, 1.0, 0.0, 0.0, 0.0, 0.0)
HUGE = Range(8, 1e5, 0.0, 1.0, 0.0, 0.0)


def _op(i, name, low=True, big=False, canonical="linear"):
    return OpRecord(i, name, "FullyConnected", canonical, "lower",
                    "float16" if low else "float32", True, (HUGE if big else OK,), ((OK,),),
                    (math.inf if big else 1e-3,), (0.0,), (big,), layer=name.split("_")[0])


def _report(ops, forward=None, backward=None, scale=2.0 ** 16, backward_max=1.0, steps=2):
    """``steps`` steps alike (each op's records repeated per step)."""
    over = bool(forward or backward)
    step = [StepRecord(s, scale, over, forward, backward, (), {}, {}, backward_max,
                       updated=not over) for s in range(steps)]
    ops = [dataclasses.replace(r, outputs=r.outputs * steps, inputs=r.inputs * steps,
                               errors=r.errors * steps, added=r.added * steps,
                               nonfinite=r.nonfinite * steps) for r in ops]
    return DoctorReport("mxnet", "float16", True, tuple(ops), tuple(step))


def _four(flagged=(2,), forward=True):
    ops = [_op(i, f"dense{i}_fwd", big=i in flagged and forward) for i in range(4)]
    first = f"dense{flagged[0]}_fwd"
    return _report(ops, forward=first if forward else None,
                   backward=None if forward else first, backward_max=100.0)


def _clean(policy, n=4):
    """The replay of a policy that fixes everything: each layer it keeps fp32 is not low."""
    kept = policy.mxnet_layers.fp32
    ops = [_op(i, f"dense{i}_fwd", low=f"dense{i}" not in kept and "linear" not in
               policy.ops.fp32) for i in range(n)]
    return _report(ops)


def test_one_overflowing_layer_of_four_is_tried_alone_first_and_its_type_last():
    cands = candidates(_four(), BASE)
    assert [c.kind for c in cands] == ["layers", "all_ops"]  # 1 of 4 is not "most"
    assert cands[0].policy.mxnet_layers.fp32 == {"dense2"} and cands[0].policy.ops == BASE.ops
    assert cands[1].policy.ops.fp32 == {"linear"}
    rec = recommend(_four(), BASE, replay=_clean)
    assert rec.verified and rec.fix == "keep 'dense2' in float32"
    assert rec.keeps == ("3 of 4 linear ops stay fp16",) and len(rec.tried) == 1
    assert Policy.from_dict(tomllib.loads(rec.toml)) == rec.policy
    assert "# Keeps: 3 of 4 linear ops stay fp16." in rec.toml


def test_an_op_type_is_a_candidate_only_where_most_of_its_instances_need_it():
    ops = tuple(_op(i, f"dense{i}_fwd", big=i < 3) for i in range(4))
    # three overflow findings: each step's first non-finite op is another layer
    steps = tuple(StepRecord(s, 2.0 ** 16, True, f"dense{s}_fwd", None, (), {}, {}, 1.0)
                  for s in range(3))
    rep = DoctorReport("mxnet", "float16", True, ops, steps)
    kinds = [c.kind for c in candidates(rep, BASE)]
    assert kinds == ["layers", "ops"]
    assert candidates(rep, BASE)[1].policy.ops.fp32 == {"linear"}


def test_a_backward_only_overflow_tries_the_scale_alone_first():
    rep = _four(forward=False)
    cands = candidates(rep, BASE)
    assert cands[0].kind == "loss_scale" and cands[0].moved == ()
    assert cands[0].policy.replace(loss_scale=BASE.loss_scale) == BASE
    assert cands[0].policy.loss_scale.scale == 128  # 65504 / 4 / 100, a power of two

    def replay(policy):  # any scale up to 128 is clean; the layers alone are not
        clean = policy.loss_scale.scale <= 128
        return _report([_op(i, f"dense{i}_fwd") for i in range(4)],
                       backward=None if clean else "dense2_fwd", backward_max=100.0)

    rec = recommend(rep, BASE, replay=replay)
    assert rec.verified and rec.fix == "start the loss scale at 128; no op moves"
    assert rec.keeps == ("no op moves: every op that ran fp16 still does",)
    assert "init_scale = 128" in rec.toml


def test_a_layer_fix_that_leaves_a_backward_overflow_is_tried_again_at_a_lower_scale():
    def replay(policy):
        ops = [_op(i, f"dense{i}_fwd", low=f"dense{i}" not in policy.mxnet_layers.fp32)
               for i in range(4)]
        clean = policy.loss_scale.scale <= 1024
        return _report(ops, backward=None if clean else "dense3_fwd", backward_max=10.0)

    rec = recommend(_four(), BASE, replay=replay)
    assert rec.verified and rec.policy.mxnet_layers.fp32 == {"dense2"}
    assert rec.policy.loss_scale.scale == 1024  # 65504 / 4 / 10 -> 1024
    assert [(what, ok) for what, ok, _ in rec.tried] == [
        ("keep 'dense2' in float32", False),
        ("keep 'dense2' in float32, and start the loss scale at 1024", True)]


def test_when_no_candidate_passes_the_widest_is_written_not_verified():
    def replay(policy):
        return _report([_op(0, "dense0_fwd", big=True)], forward="dense0_fwd")

    rec = recommend(_four(), BASE, replay=replay)
    assert not rec.verified and rec.fix == "keep every 'linear' op in float32"
    assert rec.verification.startswith("none of the 2 candidate fixes passed its trial")
    assert "# NOT verified: none of the 2" in rec.toml and "NOT verified" in str(rec)


def test_without_a_replay_every_flagged_type_moves_unverified():
    rec = recommend(_four(), BASE)
    assert rec.policy.ops.fp32 == {"linear"} and not rec.verified and rec.fix == ""


def test_passes_needs_no_overflow_and_nothing_left_to_change():
    assert passes(_clean(BASE))[0]
    ok, why = passes(_four())
    assert not ok and "2 of 2 step(s) under it still overflow (step 0: op dense2_fwd" in why


@settings(max_examples=200, deadline=None)
@given(st.floats(1e-6, 1e6), st.integers(1, 24))
def test_backward_scale_is_a_power_of_two_that_keeps_the_values_in_range(big, exp):
    scale = 2.0 ** exp
    rep = _report([_op(0, "dense0_fwd")], backward="dense0_fwd", scale=scale,
                  backward_max=big)
    s = backward_scale(rep)
    if s is None:  # below 1 (the gradients' floor here) nothing keeps them
        assert big * 1.0 > 65504 / 4 or scale / 2 < 1
        return
    assert math.log2(s).is_integer() and s <= scale / 2
    assert big * s <= 65504 / 4
    assert s == scale / 2 or big * s * 2 > 65504 / 4  # the largest such power of two


def test_a_forward_overflow_has_no_scale_candidate():
    assert backward_scale(_four()) is None
    assert backward_scale(_report([_op(0, "dense0_fwd")])) is None  # nothing overflowed


def test_keeps_counts_by_execution_order():
    rep = _four()
    replay = _clean(BASE.replace(mxnet_layers=BASE.mxnet_layers.with_fp32({"dense2"})))
    (c, *_) = candidates(rep, BASE)
    assert keeps(rep, replay, c) == ("3 of 4 linear ops stay fp16",)


def test_bf16_is_a_candidate_where_range_is_the_problem_and_bf16_runs_every_low_op():
    """After the named layers, before an op type (it keeps every op low): the same model in
    bf16 (float32's range, no loss scale), only where every op the report ran in fp16 has a
    bf16 kernel here; never for a precision loss."""
    cands = candidates(_four(), BASE, bf16_kernels={"FullyConnected"})
    assert [c.kind for c in cands] == ["layers", "bf16", "all_ops"]
    bf16 = cands[1]
    assert bf16.policy == BASE.replace(dtype="bfloat16", loss_scale=None)
    rec = recommend(_four(), BASE, bf16_kernels={"FullyConnected"},
                    replay=lambda p: _clean(p) if p.dtype == "bfloat16" else _four())
    assert rec.verified and rec.fix == bf16.what and rec.policy.dtype == "bfloat16"
    assert Policy.from_dict(tomllib.loads(rec.toml)) == rec.policy
    assert rec.keeps == ("every op that ran fp16 runs bf16 (float32's range)",)
    assert [c.kind for c in candidates(_four(), BASE, bf16_kernels=set())] == \
        ["layers", "all_ops"]  # a low op without a bf16 kernel here
    assert [c.kind for c in candidates(_four(), BASE)] == ["layers", "all_ops"]  # not asked


def _kinds(policy=BASE, speed=None):
    return [c.kind for c in candidates(_four(), policy, {"FullyConnected"}, speed)]


def test_bf16_is_no_candidate_where_this_cpu_emulates_it_unless_measured_faster():
    """oneDNN emulates bfloat16 on AVX-512 without bf16 instructions (the device's truth,
    ``isa.bf16_class``): the kernel exists and is slower than float32, so the candidate is
    not offered on a kernel alone (it was, against docs/doctor.md); a measurement that says
    faster (costs as data) lets it back in, one that says slower keeps it out."""
    from amp_adapters.rules.device import Cost
    from amp_adapters.services.doctor.bf16 import Bf16Speed
    assert _kinds(speed=Bf16Speed(emulated=False)) == ["layers", "bf16", "all_ops"]
    assert _kinds(speed=Bf16Speed(emulated=True)) == ["layers", "all_ops"]
    faster = Bf16Speed(emulated=True, cost=lambda op: Cost(0.5, 0.01, 0.5, 0.01))
    slower = Bf16Speed(emulated=True, cost=lambda op: Cost(2.5, 0.05, 2.6, 0.05))
    assert _kinds(speed=faster) == ["layers", "bf16", "all_ops"]
    assert _kinds(speed=slower) == ["layers", "all_ops"]


def test_under_measured_speed_bf16_must_be_measured_faster_for_every_low_op():
    """A measured-speed policy lowers an op only where it was timed faster: so does its
    bfloat16 candidate (a tie within the margin, no measurement, or slower: not offered)."""
    from amp_adapters.rules.device import Cost
    from amp_adapters.services.doctor.bf16 import Bf16Speed, refusal
    measured = BASE.replace(speed="measured")
    book = {"FullyConnected": Cost(0.6, 0.02, 0.6, 0.02)}
    assert _kinds(measured, Bf16Speed(cost=book.get)) == ["layers", "bf16", "all_ops"]
    assert _kinds(measured, Bf16Speed()) == ["layers", "all_ops"]  # not measured
    tie = {"FullyConnected": Cost(0.95, 0.02, 0.95, 0.02)}
    assert _kinds(measured, Bf16Speed(cost=tie.get)) == ["layers", "all_ops"]
    slow = {"FullyConnected": Cost(1.4, 0.02, 1.4, 0.02)}
    assert _kinds(measured, Bf16Speed(cost=slow.get)) == ["layers", "all_ops"]
    assert "slower here (1.40x" in refusal("FullyConnected", measured, Bf16Speed(cost=slow.get))
    assert refusal("FullyConnected", BASE, Bf16Speed()) is None  # fixed speed, native bf16


def test_the_session_takes_the_cpu_class_from_the_device_truth():
    from amp_adapters.services.doctor.session import Session
    from amp_adapters.rules.isa import bf16_class, machine
    assert Session().bf16_speed().emulated == (bf16_class(machine()) == "emulated")


def test_a_rescaled_fix_says_its_loss_scale_once():
    """A fix that already starts at a lower scale, tried again lower (``rescaled``), says the
    new scale once. (Before: "keep '4' in float32, and start the loss scale at 8192, and
    start the loss scale at 4096".)"""
    from amp_adapters.services.doctor.candidates import rescaled
    cands = candidates(_four(forward=False), BASE)
    (both,) = [c for c in cands if c.kind == "layers" and "loss scale" in c.what]
    replay = _report([_op(i, f"dense{i}_fwd") for i in range(4)], backward="dense3_fwd",
                     scale=both.policy.loss_scale.scale, backward_max=1000.0)
    again = rescaled(both, replay)
    assert again.what.count("start the loss scale") == 1
    assert again.what == f"keep 'dense2' in float32, and start the loss scale at " \
                         f"{again.policy.loss_scale.scale:g}"
    assert again.policy.loss_scale.scale < both.policy.loss_scale.scale
