"""The native LossScaler's fields on ``trainer._amp_loss_scaler``, as MXNet toolkits use them.

Sockeye sets ``_scale_seq_len`` right after ``init_trainer`` ("AMP does not allow passing
args when creating the loss scaler") and pickles ``_loss_scale``, ``_next_loss_scale``,
``_unskipped`` in every checkpoint, writing them back on resume. The same training code
(``native_scaler_job``) runs with the native ``mxnet.contrib.amp`` (in its own process:
its ``init`` patches MXNet globally) and with ``mxnet_amp``; reads must have the native's
meaning, writes must take effect, bad writes and unknown attributes must be refused.
"""
import json
import math
import os
import pickle
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mxnet.contrib.amp.loss_scaler import LossScaler as NativeLossScaler

import mxnet as mx
import mxnet_amp as amp
import native_scaler_job as job
from amp_adapters import AmpConfigError, DynamicLossScale, StaticLossScale
from mxnet_testutil import backward, batch, mlp

FIELDS = ("_loss_scale", "_next_loss_scale", "_unskipped", "_scale_seq_len", "_max_loss_scale")


@pytest.fixture(scope="module")
def native():
    """``native_scaler_job.run`` with the native ``mxnet.contrib.amp``, in a subprocess."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [os.getcwd(), os.path.dirname(job.__file__), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, job.__file__], env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def ours():
    amp.init()
    try:
        return job.run(amp)
    finally:
        amp.reset()


def test_the_fields_read_as_natively_at_init(native, ours):
    """``(_loss_scale, _next_loss_scale, _unskipped, _scale_seq_len, _max_loss_scale,
    loss_scale)`` right after init_trainer (and the _scale_seq_len write): the same values,
    the same Python types (a pickle of them loads in either)."""
    assert ours["interval"]["start"] == native["interval"]["start"] == [
        2.0**16, 2.0**16, 0, 4, 2.0**24, 2.0**16]
    _, trainer = job.build(amp)
    s = trainer._amp_loss_scaler
    assert [type(getattr(s, f)) for f in FIELDS + ("loss_scale",)] == [
        float, float, int, int, float, float]


def test_scale_seq_len_sets_the_growth_interval_in_both(native, ours):
    """``_scale_seq_len = 4``: both double the scale after 4 clean steps, and again after 4
    more. The decision (``_next_loss_scale``, ``_unskipped``) is the same step by step; the
    native applies it one step later (its ``_loss_scale`` and the scale its losses are
    multiplied by lag), ours uses it at the very next step, so both fields read it."""
    n, o = native["interval"], ours["interval"]
    assert [a[1] for a in n["after"]] == [a[1] for a in o["after"]] == (
        [2.0**16] * 3 + [2.0**17] * 4 + [2.0**18] * 2)
    assert [a[2] for a in n["after"]] == [a[2] for a in o["after"]] == [1, 2, 3, 0, 1, 2, 3, 0, 1]
    assert all(a[0] == a[1] for a in o["after"])  # no lag: the next step's scale
    assert [a[0] for a in n["after"]] == [2.0**16] * 4 + [2.0**17] * 4 + [2.0**18]
    assert o["used"] == [2.0**16] * 4 + [2.0**17] * 4 + [2.0**18]  # doubled at step 5
    assert n["used"] == [2.0**16] * 5 + [2.0**17] * 4  # natively at step 6
    assert n["used"][1:] == o["used"][:-1]


def test_checkpointed_fields_continue_the_same_trajectory_in_both(native, ours):
    """Pickle the three fields after K steps, write them back into a fresh trainer (by
    Sockeye's tuple assignment): the resumed run multiplies its losses by the very scales
    of the uninterrupted one, with overflows before and after the checkpoint."""
    for run in (native, ours):
        r = run["resume"]
        assert r["resumed"] == r["full"][job.K:]
        assert len(set(r["full"])) >= 3  # the scale moved both ways
    assert native["resume"]["checkpoint"] == [2.0**16, 2.0**15, 0]  # saved right after a move
    assert ours["resume"]["checkpoint"] == [2.0**15, 2.0**15, 0]


def test_a_native_checkpoint_resumes_ours_on_our_trajectory(native, ours):
    """The native's fields saved right after an overflow (``_loss_scale`` not yet halved,
    ``_next_loss_scale`` halved) restore ours to the state ours had there: restoring in the
    toolkit's order leaves the newer decision, which ours already uses."""
    amp.init()
    net, trainer = job.build(amp)
    trainer._amp_loss_scaler._scale_seq_len = 3
    job.restore(trainer, native["resume"]["checkpoint"])
    resumed = [job.train_step(amp, net, trainer, step, step in job.INF_STEPS)
               for step in range(job.K, job.N)]
    assert resumed == ours["resume"]["full"][job.K:]


def _trainer(loss_scale=None):
    net = mlp()
    trainer = mx.gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1})
    amp.init_trainer(trainer, loss_scale)
    return net, trainer


def _clean_steps(net, trainer, n, start=0):
    for step in range(start, start + n):
        backward(net, trainer, *batch(step))
        trainer.step(4)


def test_writes_take_effect_in_the_core_state():
    net, trainer = _trainer()
    s = trainer._amp_loss_scaler
    s._scale_seq_len = 2
    s._loss_scale = 2.0**9  # below the new ceiling first: a scale above it is refused
    s._max_loss_scale = 2.0**10
    assert amp.loss_scale(trainer).growth_interval == 2
    assert amp.loss_scale(trainer).max_scale == 2.0**10
    s._unskipped = 1
    _clean_steps(net, trainer, 1)
    assert amp.loss_scale(trainer).scale == s._loss_scale == s.loss_scale == 2.0**10
    _clean_steps(net, trainer, 2, start=1)
    assert s._loss_scale == 2.0**10 and s._unskipped == 0  # the ceiling holds
    assert amp.state_dict(trainer)["loss_scale"]["config"]["growth_interval"] == 2


def test_a_static_scale_takes_a_scale_and_refuses_growth_settings():
    net, trainer = _trainer(StaticLossScale(scale=2.0**8))
    s = trainer._amp_loss_scaler
    s._loss_scale = 2.0**6
    assert amp.loss_scale(trainer) == StaticLossScale(scale=2.0**6)
    _clean_steps(net, trainer, 3)
    assert s._loss_scale == 2.0**6
    s._scale_seq_len = s._scale_seq_len  # restoring what was read changes nothing
    with pytest.raises(AmpConfigError, match="'static' loss scale never grows.*_scale_seq_len"):
        s._scale_seq_len = 4


BAD_WRITES = [
    ("_loss_scale", -1.0, "must be >= 0"),
    ("_loss_scale", float("nan"), "must be finite"),
    ("_next_loss_scale", float("inf"), "must be finite"),
    ("_loss_scale", 0.0, "rounds to 0"),
    ("_loss_scale", 2.0**25, r"within \[min_scale, max_scale\]"),
    ("_loss_scale", "65536", "must be a real number"),
    ("_scale_seq_len", 0, r"int in \[1, "),
    ("_scale_seq_len", 2.5, "whole number"),
    ("_unskipped", -1, r"int in \[0, "),
    ("_unskipped", 2000, "must be < growth_interval = 2000"),
    ("_max_loss_scale", 2.0**10, r"would leave LossScaler._loss_scale = 65536.0"),
    ("_max_loss_scale", 0.5, "min_scale <= max_scale"),
]


@pytest.mark.parametrize("name, value, message", BAD_WRITES)
def test_a_write_that_breaks_an_invariant_is_refused_and_changes_nothing(name, value, message):
    net, trainer = _trainer()
    _clean_steps(net, trainer, 2)
    s = trainer._amp_loss_scaler
    before = amp.loss_scale(trainer)
    with pytest.raises(AmpConfigError, match=message) as err:
        setattr(s, name, value)
    assert f"LossScaler.{name}" in str(err.value)
    assert amp.loss_scale(trainer) == before


def test_interval_below_the_clean_steps_counted_is_refused():
    """Natively ``_unskipped == _scale_seq_len`` would never fire past it (the scale stops
    growing until an overflow); here the write says so and what to write first."""
    net, trainer = _trainer()
    _clean_steps(net, trainer, 3)
    s = trainer._amp_loss_scaler
    with pytest.raises(AmpConfigError, match="_scale_seq_len = 3 would leave "
                                             "LossScaler._unskipped = 3"):
        s._scale_seq_len = 3
    s._unskipped = 0
    s._scale_seq_len = 3
    _clean_steps(net, trainer, 3, start=3)
    assert s._loss_scale == 2.0**17


def test_unknown_attributes_and_loss_scale_are_refused(native):
    """The native scaler takes any attribute (a misspelt ``_scale_seqlen`` is set and the
    interval stays 2000); ours names the fields it has."""
    assert native["typo_ignored"] is True
    _, trainer = _trainer()
    s = trainer._amp_loss_scaler
    with pytest.raises(AttributeError, match="no attribute '_scale_seqlen'.*_scale_seq_len"):
        s._scale_seqlen = 4
    with pytest.raises(AttributeError, match="read-only.*write _loss_scale"):
        s.loss_scale = 2.0
    with pytest.raises(AttributeError, match="_max_loss_scale"):
        amp.LossScaler().loss_scaler = 1
    assert not hasattr(s, "_scale_seqlen") and s._scale_seq_len == 2000


# --------------------------------------------------------------- against the native class

def _param():
    p = mx.gluon.Parameter("w", shape=(2,))
    p.initialize(ctx=mx.cpu())
    return p


POW2 = st.integers(-30, 30).map(lambda e: 2.0**e)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_fields_follow_the_native_under_steps_and_writes(data):
    """Random steps (clean or overflow) and field writes on ``mxnet_amp.LossScaler`` and the
    native class: after each, ours reads the native's decided scale (``_next_loss_scale``)
    in both scale fields, and the native's ``_unskipped``, ``_scale_seq_len``,
    ``_max_loss_scale``; a write that breaks an invariant (applied to ours only) raises and
    leaves ours as it was."""
    p = _param()
    ours, theirs = amp.LossScaler(), NativeLossScaler()
    for _ in range(data.draw(st.integers(1, 30))):
        op = data.draw(st.sampled_from(["step", "step", "good", "bad"]))
        if op == "step":
            found_inf = data.draw(st.booleans())
            p.grad()[:] = np.inf if found_inf else 0.5
            assert ours.has_overflow([p]) is theirs.has_overflow([p]) is found_inf
        elif op == "good":
            name, value = _valid_write(data, ours)
            setattr(ours, name, value)
            setattr(theirs, name, value)
            if name in ("_loss_scale", "_next_loss_scale"):
                theirs._next_loss_scale = value  # natively the decided scale is _next
        else:
            name, value = _invalid_write(data, ours)
            before = ours.state
            with pytest.raises(AmpConfigError, match=f"LossScaler.{name}"):
                setattr(ours, name, value)
            assert ours.state == before
        assert ours._loss_scale == ours._next_loss_scale == theirs._next_loss_scale
        assert ours.loss_scale == ours.state.scale == ours._loss_scale
        assert (ours._unskipped, ours._scale_seq_len, ours._max_loss_scale) == (
            theirs._unskipped, theirs._scale_seq_len, theirs._max_loss_scale)


def _valid_write(data, s):
    name = data.draw(st.sampled_from(FIELDS))
    if name in ("_loss_scale", "_next_loss_scale"):
        return name, data.draw(POW2.filter(lambda v: v <= s._max_loss_scale))
    if name == "_unskipped":
        return name, data.draw(st.integers(0, s._scale_seq_len - 1))
    if name == "_scale_seq_len":
        return name, data.draw(st.integers(s._unskipped + 1, s._unskipped + 6))
    return name, data.draw(POW2.filter(lambda v: v >= s._loss_scale))


def _invalid_write(data, s):
    return data.draw(st.sampled_from([
        ("_loss_scale", -s._loss_scale), ("_next_loss_scale", math.nan),
        ("_loss_scale", s._max_loss_scale * 2), ("_unskipped", s._scale_seq_len),
        ("_scale_seq_len", 0), ("_max_loss_scale", s._loss_scale / 2),
        ("_unskipped", True)]))


def test_fields_survive_pickle_as_plain_numbers():
    """A checkpoint holds plain floats and ints (what the native pickles), not our types."""
    _, trainer = _trainer(DynamicLossScale(scale=2.0**12))
    saved = pickle.loads(pickle.dumps(job.fields(trainer)))
    assert saved == [2.0**12, 2.0**12, 0] and [type(v) for v in saved] == [float, float, int]
