"""OptimizerWithMixedPrecision.save_checkpoint / load_checkpoint: round trip, clear errors, in
whichever IR the suite builds (AMP_TEST_IR): one checkpoint API for both."""
import numpy as np
import paddle
import pytest
from paddle.base import unique_name

import paddle_amp
from amp_adapters import CheckpointError
from paddle_helpers import Static, batch, mlp, resume_build, resume_run

def test_round_trip_continues_bit_identically(static, tmp_path):
    opt = resume_build(paddle_amp)
    static.exe.run(static.startup)
    resume_run(static, opt, range(4))
    opt.save_checkpoint(tmp_path, static.main)
    rest = resume_run(static, opt, range(4, 8))
    final = static.state()

    other = Static.new(seed=123)  # another init: everything must come from the checkpoint
    with paddle.static.program_guard(other.main, other.startup), \
            paddle.static.scope_guard(other.scope), unique_name.guard():  # as in a new process
        opt2 = resume_build(paddle_amp)
        other.exe.run(other.startup)
        assert opt2.load_checkpoint(tmp_path, other.main) == 4
        assert resume_run(other, opt2, range(4, 8)) == rest
        state = other.state()
    assert sorted(state) == sorted(final)
    assert all(np.array_equal(state[k], final[k]) for k in final)


def _other_program(hidden=16, optimizer=paddle.optimizer.Adam, **decorate):
    env = Static.new(seed=3)
    with paddle.static.program_guard(env.main, env.startup), \
            paddle.static.scope_guard(env.scope), unique_name.guard():
        _, _, loss = mlp(hidden=hidden, names="ck")  # PIR names ignore unique_name.guard
        opt = paddle_amp.decorate(optimizer(0.01), init_loss_scaling=8.0,
                                  incr_every_n_steps=2, **decorate)
        opt.minimize(loss)
        env.exe.run(env.startup)
    return env, opt


@pytest.mark.parametrize("kw, needle", [
    (dict(hidden=8), r"does not fit this program: ck0.b is float32\[16\] there, "
                     r"float32\[8\] here"),
    (dict(optimizer=paddle.optimizer.AdamW), "optimizer was 'Adam' when it was saved"),
    (dict(use_dynamic_loss_scaling=False), "another policy .*loss_scale"),
])
def test_mismatch_is_a_clear_error_and_changes_nothing(static, tmp_path, kw, needle):
    env0, opt0 = _other_program()
    with paddle.static.scope_guard(env0.scope):
        env0.run(batch(0))
        opt0.save_checkpoint(tmp_path, env0.main)
    env, opt2 = _other_program(**kw)
    before = env.state()
    with paddle.static.scope_guard(env.scope), pytest.raises(CheckpointError, match=needle):
        opt2.load_checkpoint(tmp_path, env.main)
    after = env.state()
    assert all(np.array_equal(before[k], after[k]) for k in before)


def test_wrong_program_scope_or_folder(static, tmp_path):
    opt = resume_build(paddle_amp)
    with pytest.raises(RuntimeError, match="run the startup program"):
        opt.save_checkpoint(tmp_path, static.main)
    static.exe.run(static.startup)
    with pytest.raises(CheckpointError, match="the program this optimizer decorated"):
        opt.save_checkpoint(tmp_path, paddle.static.Program())
    with pytest.raises(TypeError, match="program must be a paddle.static.Program"):
        opt.load_checkpoint(tmp_path, "main")
    with pytest.raises(CheckpointError, match="does not exist"):
        opt.load_checkpoint(tmp_path / "none", static.main)
    opt.save_checkpoint(tmp_path, static.main, step=5)
    with pytest.raises(CheckpointError, match="not in the scope: run the startup program"):
        opt.load_checkpoint(tmp_path, static.main, scope=paddle.static.Scope())
    static.run(batch(0))
    assert opt.load_checkpoint(tmp_path, static.main) == 5


@pytest.mark.parametrize("damage", ["edit", "truncate"])
def test_torn_or_edited_checkpoint_is_a_clear_error_and_changes_nothing(static, tmp_path,
                                                                        damage):
    """Whatever the IR: a changed byte or a truncated tensor file is a CheckpointError
    (the manifest's SHA-256 and sizes), and no var of the scope is written."""
    opt = resume_build(paddle_amp)
    static.exe.run(static.startup)
    resume_run(static, opt, range(2))
    opt.save_checkpoint(tmp_path, static.main)
    resume_run(static, opt, range(2, 4))
    before, scale = static.state(), opt.state_dict()
    (params,) = tmp_path.glob("*/model.pdparams")
    data = params.read_bytes()
    params.write_bytes(data[:-1] + bytes([data[-1] ^ 1]) if damage == "edit" else data[:-8])
    needle = "SHA-256" if damage == "edit" else "truncated or torn"
    with pytest.raises(CheckpointError, match=needle):
        opt.load_checkpoint(tmp_path, static.main)
    after = static.state()
    assert sorted(after) == sorted(before)
    assert all(np.array_equal(before[k], after[k]) for k in before)
    assert opt.state_dict() == scale
