"""A legacy-IR ``save_checkpoint`` folder written by every earlier version loads and resumes.

``tests/fixtures/v*/paddle/`` holds a checkpoint that ``write_fixtures.py paddle`` wrote
with that version (Paddle 2.6.2, legacy IR), and the recipe of its run. Only the public API
is used (``decorate``, ``opt.load_checkpoint``, ``opt.loss_scale``). The reference is
computed from the checkpoint's own files: the same layers in a plain program (no AMP) with
the saved tensors set through ``paddle.static.load_program_state`` (with a power-of-two
scale the scaled and unscaled steps are bit-identical; an overflow step changes nothing),
and DESIGN's loss-scale rule run from its saved ``loss_scale.json``."""
import json
import sys
from pathlib import Path

import numpy as np
import paddle
import pytest
from paddle.base import unique_name

import paddle_amp
from paddle_helpers import Static, pir_mode

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))
from reference import copy_checkpoint, next_state, saved_loss_scale, versions  # noqa: E402
from write_fixtures import pd_batch, pd_model  # noqa: E402

FIXTURES = [v / "paddle" for v in versions() if (v / "paddle").is_dir()]

pytestmark = pytest.mark.skipif(pir_mode(), reason=(
    "the fixtures are legacy-IR programs' checkpoints (0.1.0 saved no PIR program); this "
    "runs with AMP_TEST_IR=legacy"))


def _build(recipe, decorated):
    env = Static.new(seed=recipe["seed"] + 1)  # another init: values come from the fixture
    with paddle.static.program_guard(env.main, env.startup), \
            paddle.static.scope_guard(env.scope), unique_name.guard():
        loss = pd_model(paddle, recipe)
        opt = getattr(paddle.optimizer, recipe["optimizer"])(**recipe["optimizer_params"])
        if decorated:
            opt = paddle_amp.decorate(opt, **recipe["decorate"])
        opt.minimize(loss)
        env.exe.run(env.startup)
    return env, opt


def _tensors(env, names):
    return {n: np.array(env.scope.find_var(n).get_tensor()).copy() for n in names}


@pytest.mark.parametrize("fixture", FIXTURES, ids=lambda p: p.parent.name)
def test_checkpoint_loads_and_resumes_exactly(static, fixture, tmp_path):
    recipe = json.loads((fixture / "recipe.json").read_text())
    ckpt = copy_checkpoint(fixture, tmp_path)
    folder = ckpt / json.loads((ckpt / "CURRENT").read_text())["folder"]
    feeds = [pd_batch(seed, recipe["in_dim"], recipe["batch"], i in recipe["next_inf_steps"])
             for i, seed in enumerate(recipe["next_seeds"])]

    plain, _ = _build(recipe, decorated=False)
    names = sorted(v.name for v in plain.main.list_vars()
                   if v.persistable and v.type == paddle.base.core.VarDesc.VarType.LOD_TENSOR)
    with paddle.static.scope_guard(plain.scope):
        saved = paddle.static.load_program_state(str(folder / "model"))
        paddle.static.set_program_state(plain.main, {n: saved[n] for n in names})
        start = _tensors(plain, names)
        for i, feed in enumerate(feeds):
            if i not in recipe["next_inf_steps"]:
                plain.run(feed)
        want = _tensors(plain, names)
    expected, expected_states = saved_loss_scale(ckpt), []
    for i in range(len(feeds)):
        expected = {**expected, "state": next_state(expected, i in recipe["next_inf_steps"])}
        expected_states.append(expected["state"])

    env, opt = _build(recipe, decorated=True)
    with paddle.static.scope_guard(env.scope):
        assert opt.load_checkpoint(ckpt, env.main) == recipe["steps_run"]
        states = []
        for feed in feeds:
            env.run(feed)
            states.append(opt.loss_scale(env.scope).state.as_dict())
        got = _tensors(env, names)
    assert states == expected_states
    for name in names:
        assert got[name].tobytes() == want[name].tobytes(), name
    assert any(not np.array_equal(want[n], start[n]) for n in names)  # the clean steps moved
