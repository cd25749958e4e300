"""A failed minimize leaves the program unchanged and a corrected call works; misuse is refused."""
import copy
import importlib.util

import numpy as np
import paddle
import pytest

import paddle_amp
from amp_adapters import AmpConfigError, StaticLossScale
from paddle_helpers import batch, mlp


def _snapshot(program):
    block = program.global_block()
    return [op.type for op in block.ops], sorted(block.vars)


@pytest.mark.parametrize("bad_loss, error, needle", [
    (lambda x, loss: paddle.mean(x, axis=1), ValueError, r"has shape \[-1\], not one"),
    (lambda x, loss: paddle.mean(x), ValueError, "depends on no trainable parameter"),
    (lambda x, loss: 3.0, TypeError, "loss must be a paddle static Variable.*got float"),
    (lambda x, loss: np.float32(1.0), TypeError, "loss must be a paddle static Variable"),
])
def test_failed_minimize_changes_nothing_and_a_corrected_call_works(static, bad_loss, error,
                                                                    needle):
    x, y, loss = mlp()
    bad = bad_loss(x, loss)
    before = _snapshot(static.main)
    opt = paddle_amp.decorate(paddle.optimizer.SGD(0.1), init_loss_scaling=8.0)
    with pytest.raises(error, match=needle):
        opt.minimize(bad)
    assert _snapshot(static.main) == before
    opt.minimize(loss)  # the same wrapper, corrected
    static.exe.run(static.startup)
    static.run(batch(0))
    assert opt.loss_scale().total_steps == 1
    w0 = static.state()["fc_0.w_0"].copy()
    static.run(batch(1))
    assert not np.array_equal(static.state()["fc_0.w_0"], w0)


def test_no_grad_set_and_parameter_list_are_taken_into_account(static):
    _, _, loss = mlp()
    params = [p.name for p in static.main.global_block().all_parameters()]
    opt = paddle_amp.decorate(paddle.optimizer.SGD(0.1))
    with pytest.raises(ValueError, match="no trainable parameter"):
        opt.minimize(loss, no_grad_set=set(params))
    opt.minimize(loss, parameter_list=params[:1])


def test_second_decorated_wrapper_on_one_program_is_refused(static):
    _, _, loss = mlp()
    inner = paddle.optimizer.Adam(0.01)
    paddle_amp.decorate(inner).minimize(loss)
    before = _snapshot(static.main)
    with pytest.raises(RuntimeError, match="already built by another paddle_amp-decorated "
                                           "optimizer wrapping the same Adam"):
        paddle_amp.decorate(inner).minimize(loss)
    with pytest.raises(RuntimeError, match="already built by another"):
        paddle_amp.decorate(paddle.optimizer.SGD(0.1)).minimize(loss)
    assert _snapshot(static.main) == before


def test_load_state_dict_of_another_kind_or_missing_keys(static):
    _, _, loss = mlp()
    opt = paddle_amp.decorate(paddle.optimizer.SGD(0.1))
    opt.minimize(loss)
    static.exe.run(static.startup)
    good = opt.state_dict()
    with pytest.raises(AmpConfigError, match="'static'.*'dynamic'|'dynamic'.*'static'"):
        opt.load_state_dict(StaticLossScale(scale=8.0).state_dict())
    assert opt.state_dict() == good
    if importlib.util.find_spec("amp_adapters.loss_scale") is None:
        pytest.skip("missing keys: issue 11's strict state dicts (amp_adapters.loss_scale)")
    for key in ("kind", "good_steps"):
        partial = copy.deepcopy(good)
        for d in (partial, *(v for v in partial.values() if isinstance(v, dict))):
            d.pop(key, None)
        with pytest.raises(AmpConfigError, match=f"misses the key '{key}'"):
            opt.load_state_dict(partial)
    assert opt.state_dict() == good
