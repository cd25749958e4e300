"""paddle_amp.dygraph.save_checkpoint / load_checkpoint: a run resumed from a checkpoint
continues the same trajectory (parameters, Adam's moments, the loss scale and its counters,
bit-identical), and a checkpoint that does not fit is refused with nothing changed."""
import numpy as np
import paddle
import pytest

from amp_adapters.rules.errors import CheckpointError
from paddle_amp import dygraph as amp

STEPS, SAVE_AT, INJECT = 8, 4, (2, 6)


def _setup():
    paddle.seed(3)
    net = paddle.nn.Sequential(paddle.nn.Linear(8, 16), paddle.nn.ReLU(), paddle.nn.Linear(16, 1))
    opt = paddle.optimizer.Adam(1e-2, parameters=net.parameters())
    return net, opt, amp.GradScaler(init_loss_scaling=256.0, incr_every_n_steps=3)


def _step(net, opt, scaler, i):
    x = paddle.to_tensor(np.linspace(-1, 1, 64, dtype=np.float32).reshape(8, 8) * (i + 1))
    with amp.auto_cast(dtype="float16", emulate=True):
        loss = (net(x) ** 2).mean()
    if i in INJECT:
        loss = loss * float("inf")
    scaled = scaler.scale(loss)
    scaled.backward()
    scaler.minimize(opt, scaled)
    opt.clear_grad()


def _state(net, opt, scaler):
    """Parameters, optimizer state keyed by (parameter index, accumulator), loss scale."""
    names = {p.name: i for i, p in enumerate(net.parameters())}
    moments = {}
    for k, v in opt.state_dict().items():
        if hasattr(v, "numpy"):
            owner = max((n for n in names if k.startswith(n + "_")), key=len)
            moments[(names[owner], k[len(owner):])] = v.numpy().copy()
    return [p.numpy().copy() for p in net.parameters()], moments, scaler.loss_scale()


def test_a_resumed_run_continues_bit_identically(tmp_path):
    net, opt, scaler = _setup()
    for i in range(STEPS):
        if i == SAVE_AT:
            amp.save_checkpoint(tmp_path / "ckpt", net, opt, scaler)
        _step(net, opt, scaler, i)
    straight = _state(net, opt, scaler)

    net2, opt2, scaler2 = _setup()
    _step(net2, opt2, scaler2, 0)  # a different state, overwritten by the load
    assert amp.load_checkpoint(tmp_path / "ckpt", net2, opt2, scaler2) == SAVE_AT
    for i in range(SAVE_AT, STEPS):
        _step(net2, opt2, scaler2, i)
    resumed = _state(net2, opt2, scaler2)
    assert all(np.array_equal(a, b) for a, b in zip(straight[0], resumed[0]))
    assert straight[1].keys() == resumed[1].keys()
    assert all(np.array_equal(straight[1][k], resumed[1][k]) for k in straight[1])
    assert straight[2] == resumed[2] and straight[2][1].skipped_steps == 2


def test_a_checkpoint_that_does_not_fit_changes_nothing(tmp_path):
    net, opt, scaler = _setup()
    _step(net, opt, scaler, 0)
    amp.save_checkpoint(tmp_path / "ckpt", net, opt, scaler)
    paddle.seed(4)
    other = paddle.nn.Sequential(paddle.nn.Linear(8, 32), paddle.nn.ReLU(),
                                 paddle.nn.Linear(32, 1))
    other_opt = paddle.optimizer.Adam(1e-2, parameters=other.parameters())
    other_scaler = amp.GradScaler()
    before = _state(other, other_opt, other_scaler)
    with pytest.raises(CheckpointError, match="does not fit this model"):
        amp.load_checkpoint(tmp_path / "ckpt", other, other_opt, other_scaler)
    with pytest.raises(CheckpointError, match="the optimizer"):
        amp.load_checkpoint(tmp_path / "ckpt", other,
                            paddle.optimizer.SGD(parameters=other.parameters()), other_scaler)
    with pytest.raises(CheckpointError, match="loss scale"):
        amp.load_checkpoint(tmp_path / "ckpt", other, other_opt, amp.GradScaler(enable=False))
    after = _state(other, other_opt, other_scaler)
    assert all(np.array_equal(a, b) for a, b in zip(before[0], after[0]))
    assert before[2] == after[2]
    with pytest.raises(CheckpointError, match="no complete checkpoint|does not exist"):
        amp.load_checkpoint(tmp_path / "none", net, opt, scaler)


def test_a_failure_half_way_through_paddles_loaders_changes_nothing(tmp_path):
    """A checkpoint saved before the first step has no moments; an optimizer that has taken
    a step has them: Paddle's set_state_dict then asserts after the model, the learning-rate
    schedule and the master weights were set. The load puts everything back."""
    def setup():
        paddle.seed(3)
        net = paddle.nn.Sequential(paddle.nn.Linear(8, 16), paddle.nn.ReLU(),
                                   paddle.nn.Linear(16, 1))
        sched = paddle.optimizer.lr.StepDecay(1e-2, step_size=1)
        opt = paddle.optimizer.Adam(sched, parameters=net.parameters())
        return net, opt, amp.GradScaler(init_loss_scaling=256.0, incr_every_n_steps=3), sched
    net, opt, scaler, _ = setup()
    amp.save_checkpoint(tmp_path / "ckpt", net, opt, scaler)
    net2, opt2, scaler2, sched2 = setup()
    for i in range(3):
        _step(net2, opt2, scaler2, i + 3)
        sched2.step()
    before, lr = _state(net2, opt2, scaler2), sched2.state_dict()
    with pytest.raises(CheckpointError, match="could not be loaded.*as they were"):
        amp.load_checkpoint(tmp_path / "ckpt", net2, opt2, scaler2)
    after = _state(net2, opt2, scaler2)
    assert all(np.array_equal(a, b) for a, b in zip(before[0], after[0]))
    assert before[1].keys() == after[1].keys()
    assert all(np.array_equal(before[1][k], after[1][k]) for k in before[1])
    assert before[2] == after[2] and sched2.state_dict() == lr
    _step(net2, opt2, scaler2, 7)  # and the run goes on


def test_a_resume_whose_first_step_is_skipped_keeps_adams_moments(tmp_path):
    """Paddle parks the moments a load hands an Adam that has no accumulators yet (a fresh
    process) until its first update; ``state_dict()`` leaves them out. A resumed run whose
    first step overflowed (skipped: no update) saved a checkpoint without them, and the next
    resume restarted Adam's moments from zero (found by the kill test)."""
    net, opt, scaler = _setup()
    for i in range(STEPS):
        _step(net, opt, scaler, i)
    straight = _state(net, opt, scaler)

    net, opt, scaler = _setup()
    for i in range(INJECT[0]):
        _step(net, opt, scaler, i)
    amp.save_checkpoint(tmp_path / "a", net, opt, scaler)
    net2, opt2, scaler2 = _setup()
    amp.load_checkpoint(tmp_path / "a", net2, opt2, scaler2)
    _step(net2, opt2, scaler2, INJECT[0])  # overflows: skipped, Adam takes nothing
    amp.save_checkpoint(tmp_path / "b", net2, opt2, scaler2)
    net3, opt3, scaler3 = _setup()
    assert amp.load_checkpoint(tmp_path / "b", net3, opt3, scaler3) == INJECT[0] + 1
    for i in range(INJECT[0] + 1, STEPS):
        _step(net3, opt3, scaler3, i)
    resumed = _state(net3, opt3, scaler3)
    assert straight[1].keys() == resumed[1].keys()
    assert all(np.array_equal(straight[1][k], resumed[1][k]) for k in straight[1])
    assert all(np.array_equal(a, b) for a, b in zip(straight[0], resumed[0]))
    assert straight[2] == resumed[2]


def test_a_bf16_run_whose_scaler_turned_itself_off_resumes(tmp_path):
    """Under bfloat16 a dynamic GradScaler turns itself off at its first ``scale()``, as the
    native's does; the checkpoint then has no loss scale, and resuming it with the same
    (fresh, enabled) scaler was refused ("saved without a loss scale") (found by the kill
    test). The resumed scaler is turned off as the saved one was; a checkpoint saved with
    no scaler at all still refuses an enabled one."""
    x = paddle.ones([8, 8])
    net, opt, scaler = _setup()
    with pytest.warns(UserWarning, match="dynamic loss scaling for bfloat16"):
        with amp.auto_cast(dtype="bfloat16"):
            loss = (net(x) ** 2).mean()
        scaled = scaler.scale(loss)
    scaled.backward()
    scaler.minimize(opt, scaled)
    amp.save_checkpoint(tmp_path / "ckpt", net, opt, scaler, step=1)
    net2, opt2, scaler2 = _setup()
    assert amp.load_checkpoint(tmp_path / "ckpt", net2, opt2, scaler2) == 1
    assert not scaler2.is_enable() and scaler2.loss_scale() == scaler.loss_scale()
    amp.save_checkpoint(tmp_path / "none", net, opt, None, step=1)
    with pytest.raises(CheckpointError, match="saved without a loss scale"):
        amp.load_checkpoint(tmp_path / "none", net2, opt2, _setup()[2])
