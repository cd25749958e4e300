"""The doctor's verification is out of sample (amp_adapters.services.doctor.verify): a fix is
derived
from the first half of the recorded steps, and verified by a trial, training under it with
optimizer updates, whose later steps were held out of the derivation; the file says on how
many steps. Before, the recorded steps were replayed on the recorded parameters, without an
update, and the loss scale was derived from the same maxima it was then checked on."""
import math
import tomllib

from hypothesis import given, settings
from hypothesis import strategies as st

from amp_adapters import DynamicLossScale, NoOpLossScale, Policy, StaticLossScale
from amp_adapters.services.doctor import recommend
from amp_adapters.services.doctor.candidates import candidates
from amp_adapters.services.doctor.report import DoctorReport, OpRecord, StepRecord
from amp_adapters.services.doctor.stats import Range
from amp_adapters.services.doctor.verify import after_step, derived_steps, verdict

BASE = Policy.preset("O1", emulate=True)
OK = Range(8, 1.0, 0.0, 0.0, 0.0, 0.0)
HUGE = Range(8, 1e5, 0.0, 1.0, 0.0, 0.0)


def _op(i, per_step_big):
    """Op ``dense<i>_fwd``; ``per_step_big[s]``: its output overflows at step s."""
    return OpRecord(i, f"dense{i}_fwd", "FullyConnected", "linear", "lower", "float16", True,
                    tuple(HUGE if b else OK for b in per_step_big),
                    tuple((OK,) for _ in per_step_big),
                    tuple(math.inf if b else 1e-3 for b in per_step_big),
                    tuple(0.0 for _ in per_step_big), tuple(per_step_big), layer=f"dense{i}")


def _steps(forward=(), backward=(), backward_max=(), scale=2.0 ** 16, updated=()):
    n = max(len(forward), len(backward), len(backward_max))
    forward = list(forward) + [None] * (n - len(forward))
    backward = list(backward) + [None] * (n - len(backward))
    bmax = list(backward_max) + [1.0] * (n - len(backward_max))
    return tuple(StepRecord(s, scale, bool(forward[s] or backward[s]), forward[s], backward[s],
                            (), {}, {}, bmax[s], updated=s in updated) for s in range(n))


def test_half_the_recorded_steps_derive_the_fix_and_the_rest_verify_it():
    assert [derived_steps(n) for n in range(1, 9)] == [1, 1, 2, 2, 3, 3, 4, 4]
    assert all(n - derived_steps(n) >= 1 for n in range(2, 50))


def test_the_layers_a_fix_keeps_come_from_the_derivation_steps_only():
    """Step 0 overflows in dense2, step 1 (held out) in dense0: the fix is derived from step
    0 (keep dense2), and its trial, which overflows in dense0 on the held-out step, fails
    it; before, both layers were derived from both steps and checked on them."""
    ops = (_op(0, (False, True)), _op(1, (False, False)), _op(2, (True, False)),
           _op(3, (False, False)))
    rep = DoctorReport("mxnet", "float16", True, ops,
                       _steps(forward=("dense2_fwd", "dense0_fwd")))
    first = candidates(rep.window(0, derived_steps(2)), BASE)[0]
    assert first.policy.mxnet_layers.fp32 == {"dense2"}

    def trial(policy):  # the held-out batch overflows dense0 unless it is kept fp32
        kept = policy.mxnet_layers.fp32 | ({"dense0", "dense2"} if "linear" in
                                           policy.ops.fp32 else set())
        ops = tuple(_op(i, (False, i == 0 and "dense0" not in kept)) for i in range(4))
        bad = "dense0_fwd" if "dense0" not in kept else None
        return DoctorReport("mxnet", "float16", True, ops,
                            _steps(forward=(None, bad), updated={0}))

    rec = recommend(rep, BASE, replay=trial)
    assert rec.tried[0][:2] == ("keep 'dense2' in float32", False)
    assert "1 held out of its derivation" in rec.tried[0][2] and "dense0_fwd" in rec.tried[0][2]
    assert rec.verified and rec.policy.ops.fp32 == {"linear"}


def test_the_loss_scale_is_derived_from_the_first_steps_and_checked_on_the_others():
    """The backward maxima of the held-out step are larger: a scale derived from the first
    step alone (128) overflows there, and the trial says so; before, the scale came from
    the maxima of every step (16) and was checked on the same ones."""
    ops = tuple(_op(i, (False, False)) for i in range(4))
    rep = DoctorReport("mxnet", "float16", True, ops,
                       _steps(backward=("dense2_fwd", "dense2_fwd"),
                              backward_max=(100.0, 1000.0)))
    scale_first = candidates(rep.window(0, 1), BASE)[0]
    assert scale_first.policy.loss_scale.scale == 128  # 65504 / 4 / 100

    def trial(policy):  # each batch's backward maxima at the policy's scale
        s = policy.loss_scale.scale
        bad = [m * s > 65504 for m in (100.0, 1000.0)]
        return DoctorReport("mxnet", "float16", True, ops,
                            _steps(backward=tuple("dense2_fwd" if b else None for b in bad),
                                   backward_max=(100.0, 1000.0), scale=s,
                                   updated={i for i, b in enumerate(bad) if not b}))

    rec = recommend(rep, BASE, replay=trial)
    what, ok, why = rec.tried[0]
    assert what == "start the loss scale at 128; no op moves" and not ok
    assert "1 held out of its derivation" in why and "overflow (step 1" in why


def test_the_file_says_how_many_steps_verified_it_and_with_how_many_updates():
    ops = (_op(0, (False,) * 4), _op(1, (False,) * 4), _op(2, (True,) * 4),
           _op(3, (False,) * 4))
    rep = DoctorReport("mxnet", "float16", True, ops, _steps(forward=("dense2_fwd",) * 4))

    def trial(policy):
        return DoctorReport("mxnet", "float16", True,
                            tuple(_op(i, (False,) * 4) for i in range(4)),
                            _steps(forward=(None,) * 4, updated={0, 1, 2, 3}))

    rec = recommend(rep, BASE, replay=trial)
    assert rec.verified and (rec.held_out, rec.derived, rec.updates) == (2, 2, 4)
    assert "# Verified on: 2 held-out step(s) (derived from 2; 4 optimizer update(s) in " \
           "its trial)." in rec.toml
    assert rec.verification.startswith("4 step(s) trained under it (4 optimizer update(s)), "
                                       "2 held out of its derivation: no overflow")
    assert Policy.from_dict(tomllib.loads(rec.toml)) == rec.policy


def test_one_recorded_step_verifies_nothing():
    ops = (_op(0, (True,)),)
    rep = DoctorReport("mxnet", "float16", True, ops, _steps(forward=("dense0_fwd",)))
    calls = []
    rec = recommend(rep, BASE, replay=lambda p: calls.append(p))
    assert not calls and not rec.verified  # no trial: nothing could be held out
    assert "record at least 2 steps" in rec.verification
    assert "# NOT verified: no step was held out" in rec.toml
    assert "not verified: no step was held out" in str(rec)
    assert not verdict(rep, 1).ok


@settings(max_examples=100, deadline=None)
@given(st.lists(st.booleans(), max_size=30),
       st.sampled_from(["dynamic", "static", "none"]))
def test_after_step_is_the_scalers_state_machine_and_skips_what_it_skips(overflows, kind):
    """The trial's scale and skip: the core's loss-scale update, step by step; an update
    applies unless the step overflowed under a scale that checks overflow."""
    ls = {"dynamic": DynamicLossScale(growth_interval=3), "static": StaticLossScale(),
          "none": NoOpLossScale()}[kind]
    expect = ls
    for over in overflows:
        nxt, applied = after_step(ls, over)
        expect = expect.adjust(over)
        assert nxt == expect
        assert applied == (not over or kind == "none")
        ls = nxt
