"""A ``save_checkpoint`` folder written by every earlier version loads here and resumes exactly.

``tests/fixtures/v*/mxnet/`` holds a checkpoint that ``write_fixtures.py mxnet`` wrote with
that version, and the recipe of its run. The reference is computed from the checkpoint's
own files with plain MXNet (``load_parameters``/``load_states``, a Trainer without AMP:
with a power-of-two scale the scaled and unscaled steps are bit-identical) and DESIGN's
loss-scale rule run from its saved ``loss_scale.json``; an overflow step of the reference
changes nothing."""
import json
import sys
from pathlib import Path

import mxnet as mx
import numpy as np
import pytest
from mxnet import autograd, gluon, nd

import mxnet_amp as amp
from amp_adapters import DynamicLossScale

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))
from reference import copy_checkpoint, next_state, saved_loss_scale, versions  # noqa: E402
from write_fixtures import mx_batch  # noqa: E402

FIXTURES = [v / "mxnet" for v in versions() if (v / "mxnet").is_dir()]


def _net(recipe):
    net = gluon.nn.Sequential()
    for units, in_units in recipe["layers"]:
        net.add(gluon.nn.Dense(units, in_units=in_units))
    net.initialize(mx.init.Zero())  # every value must come from the checkpoint
    return net


def _run(net, trainer, recipe, scaled):
    """The recipe's next steps; with ``scaled`` through AMP, else plain (overflow: no step)."""
    out_units = recipe["layers"][-1][0]
    for i, seed in enumerate(recipe["next_seeds"]):
        x, y = mx_batch(seed, recipe["batch"], out_units)
        overflow = i in recipe["next_inf_steps"]
        with autograd.record():
            loss = ((net(nd.array(x)) - nd.array(y)) ** 2).sum()
            if scaled:
                with amp.scale_loss(loss, trainer) as s:
                    s.backward()
            else:
                loss.backward()
        if scaled:
            if overflow:
                net[0].weight.grad()[0, 0] = np.inf
            trainer.step(recipe["batch"][0])
            yield amp.loss_scale(trainer).state.as_dict()
        elif not overflow:
            trainer.step(recipe["batch"][0])


def _weights(net):
    return {k: p.data().asnumpy().copy() for k, p in net._collect_params_with_prefix().items()}


@pytest.mark.parametrize("fixture", FIXTURES, ids=lambda p: p.parent.name)
def test_checkpoint_loads_and_resumes_exactly(fixture, tmp_path):
    recipe = json.loads((fixture / "recipe.json").read_text())
    ckpt = copy_checkpoint(fixture, tmp_path)
    folder = ckpt / json.loads((ckpt / "CURRENT").read_text())["folder"]

    plain = _net(recipe)  # the reference, before any AMP patching
    plain.load_parameters(str(folder / "net.params"))
    plain_trainer = gluon.Trainer(plain.collect_params(), recipe["optimizer"],
                                  recipe["optimizer_params"])
    plain_trainer.load_states(str(folder / "trainer.states"))
    saved = _weights(plain)
    list(_run(plain, plain_trainer, recipe, scaled=False))
    expected = saved_loss_scale(ckpt)
    expected_states = []
    for i in range(len(recipe["next_seeds"])):
        expected = {**expected, "state": next_state(expected, i in recipe["next_inf_steps"])}
        expected_states.append(expected["state"])

    amp.init(**recipe["init"])
    net = _net(recipe)
    trainer = gluon.Trainer(net.collect_params(), recipe["optimizer"],
                            recipe["optimizer_params"])
    amp.init_trainer(trainer, DynamicLossScale(**recipe["loss_scale"]))
    assert amp.load_checkpoint(ckpt, net, trainer) == recipe["steps_run"]
    assert list(_run(net, trainer, recipe, scaled=True)) == expected_states
    want = _weights(plain)
    got = _weights(net)
    assert sorted(got) == sorted(want)
    for name in want:
        assert got[name].tobytes() == want[name].tobytes(), name
        assert not np.array_equal(got[name], saved[name]), name  # the clean steps moved it
