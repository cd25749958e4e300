"""Issue 22/26 in MXNet: a checkpoint is checked completely before anything is loaded; flags
are bools; only patching's own users import it; the loaded loss scale is not re-checked."""
import ast
from pathlib import Path

import mxnet as mx
import numpy as np
import pytest
from mxnet import autograd, gluon, nd

import mxnet_amp as amp
from amp_adapters import CheckpointError, DynamicLossScale

PKG = Path(amp.__file__).resolve().parent


def _build(loss_scale):
    mx.random.seed(0)
    net = gluon.nn.Dense(3, in_units=4)
    net.initialize(mx.init.Xavier())
    trainer = gluon.Trainer(net.collect_params(), "adam", {"learning_rate": 0.01})
    amp.init_trainer(trainer, loss_scale)
    return net, trainer


def _step(net, trainer, k):
    x = nd.array(np.random.RandomState(k).uniform(-1, 1, (2, 4)))
    with autograd.record():
        with amp.scale_loss(net(x).sum(), trainer) as scaled:
            scaled.backward()
    trainer.step(2)


def _snapshot(net, trainer):
    weights = {k: p.data().asnumpy().tobytes() for k, p in net.collect_params().items()}
    return weights, trainer._updaters[0].get_states(dump_optimizer=False), \
        amp.state_dict(trainer)


def test_other_loss_scale_constants_are_refused_before_anything_is_loaded(tmp_path):
    net, trainer = _build(DynamicLossScale(scale=2.0**10, growth_interval=2))
    for k in range(3):
        _step(net, trainer, k)
    amp.save_checkpoint(tmp_path, net, trainer)
    other, other_trainer = _build(DynamicLossScale(scale=2.0**10, growth_interval=5))
    _step(other, other_trainer, 7)  # its own optimizer state, to see that it stays
    before = _snapshot(other, other_trainer)
    with pytest.raises(CheckpointError, match=r"loss scale.*\['growth_interval'\] = 2: differs"):
        amp.load_checkpoint(tmp_path, other, other_trainer)
    assert _snapshot(other, other_trainer) == before  # parameters, trainer, loss scale


def test_a_checkpoint_with_contradicting_counters_is_refused(tmp_path):
    """An edited loss_scale.json (checksums recomputed) whose counters its config forbids."""
    import json

    from amp_adapters.services import checkpoint as core
    net, trainer = _build(DynamicLossScale(scale=2.0**10, growth_interval=2, hysteresis=2))
    _step(net, trainer, 0)
    amp.save_checkpoint(tmp_path, net, trainer)
    folder = tmp_path / json.loads((tmp_path / core.CURRENT).read_text())["folder"]
    d = json.loads((folder / core.LOSS_SCALE_FILE).read_text())
    d["state"]["bad_steps"] = 2
    (folder / core.LOSS_SCALE_FILE).write_text(json.dumps(d))
    manifest = json.loads((folder / core.MANIFEST).read_text())
    body = manifest["body"]
    body["files"][core.LOSS_SCALE_FILE] = {
        "bytes": (folder / core.LOSS_SCALE_FILE).stat().st_size,
        "sha256": core._sha256(folder / core.LOSS_SCALE_FILE)}
    (folder / core.MANIFEST).write_text(json.dumps({"body": body,
                                                    "sha256": core._body_digest(body)}))
    before = _snapshot(net, trainer)
    with pytest.raises(CheckpointError, match=r"\['bad_steps'\] = 2: must be < hysteresis"):
        amp.load_checkpoint(tmp_path, net, trainer)
    assert _snapshot(net, trainer) == before


@pytest.mark.parametrize("field, value, rule", [
    ("bad_steps", 5, "must be < hysteresis"),
    ("good_steps", 2, "must be < growth_interval"),
    ("consecutive_skips", 3, "skipped_steps"),
])
def test_load_state_dict_refuses_counters_its_config_forbids(field, value, rule):
    from amp_adapters import AmpConfigError
    net, trainer = _build(DynamicLossScale(scale=2.0**10, growth_interval=2, hysteresis=2))
    _step(net, trainer, 0)
    d = amp.state_dict(trainer)
    d["loss_scale"]["state"][field] = value
    before = _snapshot(net, trainer)
    with pytest.raises(AmpConfigError, match=rf"\['{field}'\] = {value}: .*{rule}"):
        amp.load_state_dict(trainer, d)
    assert _snapshot(net, trainer) == before


@pytest.mark.parametrize("value", ["false", "true", 1, None])
def test_emulate_must_be_a_bool(value):
    with pytest.raises(TypeError, match="emulate must be true or false"):
        amp.init(emulate=value)
    assert amp.active_policy() is None  # nothing installed


def _imports(path):
    tree = ast.parse(path.read_text())
    return [(node.module, alias.name) for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) for alias in node.names]


def test_the_active_policy_is_read_from_active_not_patching():
    for path in PKG.glob("*.py"):
        for module, name in _imports(path):
            if module == "patching":
                assert name in ("init", "reset"), (path.name, name)  # the patching itself
    assert "block_graph" in {n.name for n in ast.parse((PKG / "traced.py").read_text()).body
                             if isinstance(n, ast.FunctionDef)}


def test_no_import_below_all():
    for pkg in (PKG, PKG.parent / "amp_adapters"):
        src = (pkg / "__init__.py").read_text()
        assert "E402" not in src, pkg
