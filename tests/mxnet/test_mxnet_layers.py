"""Per-layer precision in MXNet: Policy.layers keeps one Gluon block in float32 and its
siblings low, imperative and hybridized, by its path from the model's root or its name;
excluded_sym_names says the same; a name that matches nothing is an error naming the
closest names."""
import json

import numpy as np
import mxnet as mx
from mxnet import gluon

import mxnet_amp as amp
import pytest

from amp_adapters import AmpConfigError, LayerLists, Policy

POLICY = Policy.preset("O1", emulate=True, mxnet_layers=LayerLists(fp32={"dense2"}))


def _net(hybridize):
    net = gluon.nn.HybridSequential(prefix="")
    with net.name_scope():
        for i in range(4):
            net.add(gluon.nn.Dense(8, in_units=8, prefix=f"dense{i}_"))
    net.initialize(mx.init.Uniform(1.0))
    if hybridize:
        net.hybridize()
    return net


def _in_fp16(x):
    x = x.asnumpy().astype(np.float32)
    return np.array_equal(x, x.astype(np.float16).astype(np.float32))


def _x():
    return mx.nd.array(np.random.RandomState(0).uniform(-1.3, 1.7, (4, 8)))


def test_imperative_calls_match_their_block_name():
    amp.init(policy=POLICY)
    net = _net(hybridize=False)
    outs = {}
    for block in net:
        block.register_forward_hook(lambda b, a, o: outs.__setitem__(b.name, o))
    net(_x())
    low = {name: _in_fp16(o) for name, o in outs.items()}
    # float16 numerics (emulated or on a kernel) everywhere but the block the policy names
    assert low == {"dense0": True, "dense1": True, "dense2": False, "dense3": True}
    amp.reset()
    amp.init(policy=Policy.preset("O1", emulate=True))  # without the rule: dense2 low too
    outs.clear()
    net(_x())
    assert _in_fp16(outs["dense2"])


def test_a_hybridized_trace_matches_its_node_names_and_the_cast_report_says_so():
    amp.init(policy=POLICY)
    net = _net(hybridize=True)
    out = net(_x())
    _, sym = net._cached_graph
    nodes = json.loads(sym.tojson(remove_amp_cast=False))["nodes"]
    low = {nodes[n["inputs"][0][0]]["name"] for n in nodes
           if n["op"] == "amp_cast" and n["attrs"]["dtype"] == "float16"}
    # every weight but dense2's goes through float16 (a cast, or emulation's rounding)
    assert {f"dense{i}_{p}" for i in (0, 1, 3) for p in ("weight", "bias")} <= low
    assert not {"dense2_weight", "dense2_bias"} & low
    assert "dense2_fwd" in low  # dense3 reads dense2's float32 output in float16
    by_layer = [d for d in amp.cast_report(net).decisions if d.layer]
    assert len(by_layer) == 1 and by_layer[0].run_dtype == "float32"
    assert "layer 'dense2' listed in Policy.mxnet_layers.fp32" in by_layer[0].reason
    assert out.shape == (4, 8)


def test_excluded_sym_names_and_a_policy_file_agree(tmp_path):
    data = mx.sym.var("data")
    h = data
    for i in range(4):
        h = mx.sym.FullyConnected(h, num_hidden=8, name=f"fc{i}")
    path = tmp_path / "p.toml"
    path.write_text('preset = "mxnet-native"\n[layers.mxnet]\nfp32 = ["fc2"]\n')
    by_arg = amp.convert_symbol(h, excluded_sym_names=["fc2"])
    by_file = amp.convert_symbol(h, policy=str(path))
    assert by_arg.tojson() == by_file.tojson()
    plain = amp.convert_symbol(h)
    names = {n["name"] for n in json.loads(by_arg.tojson(remove_amp_cast=False))["nodes"]}
    plain_names = {n["name"] for n in json.loads(plain.tojson(remove_amp_cast=False))["nodes"]}
    assert "fc1_output_amp_cast_float32" in names - plain_names  # fc2 reads fc1 in float32
    # the native agrees: fc2 is excluded the same way
    from mxnet.contrib import amp as native
    nat = native.convert_symbol(h, excluded_sym_names=["fc2"])
    nat_names = {n["name"] for n in json.loads(nat.tojson(remove_amp_cast=False))["nodes"]}
    assert any(n.startswith("fc1") and "amp_cast" in n and "float32" in n for n in nat_names)


def test_a_layer_matching_nothing_raises_naming_the_closest_nodes():
    h = mx.sym.FullyConnected(mx.sym.var("data"), num_hidden=8, name="dense2")
    with pytest.raises(AmpConfigError) as e:
        amp.convert_symbol(h, excluded_sym_names=["dens2"])
    assert str(e.value).startswith("layer 'dens2' matches no layer of the symbol converted; the "
                                   "closest layers it has: 'dense2'. Name a layer by its path")


@pytest.mark.parametrize("hybridize", [True, False], ids=["hybridized", "imperative"])
def test_a_rule_matching_no_block_or_node_raises_when_the_loss_is_scaled(hybridize):
    """Raised once every block of the step has been called (a rule for the loss block is not
    refused while only the net has run), before the step scales anything."""
    amp.init(policy=Policy.preset("O1", emulate=True,
                                  mxnet_layers=LayerLists(fp32={"dense2", "dens3"})))
    try:
        net = _net(hybridize)
        trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1})
        amp.init_trainer(trainer)
        with mx.autograd.record():
            loss = net(_x()).sum()
            with pytest.raises(AmpConfigError) as e:
                with amp.scale_loss(loss, trainer):
                    pass
        assert str(e.value).startswith(
            "layer 'dens3' matches no layer of the model called under mxnet_amp.init; the "
            "closest layers it has: 'dense3'")
        assert "dense2" not in str(e.value).split(";")[0]
    finally:
        amp.reset()


class _Block(gluon.HybridBlock):
    def __init__(self, **kw):
        super().__init__(**kw)
        with self.name_scope():
            self.ffn = gluon.nn.Dense(8, in_units=8)
            self.out = gluon.nn.Dense(8, in_units=8)

    def hybrid_forward(self, F, x):
        return self.out(self.ffn(x))


class _Encoder(gluon.HybridBlock):
    def __init__(self, **kw):
        super().__init__(**kw)
        with self.name_scope():
            self.layers = gluon.nn.HybridSequential()
            for _ in range(2):
                self.layers.add(_Block())

    def hybrid_forward(self, F, x):
        return self.layers(x)


@pytest.mark.parametrize("hybridize", [True, False], ids=["hybridized", "imperative"])
def test_a_path_names_one_nested_block_in_every_build(hybridize):
    """``layers.1.ffn`` (the child names from the root) keeps that one Dense in float32, in a
    model built twice (Gluon's counter names differ: ``_encoder0...``, ``_encoder1...``);
    the cast report names it by that path."""
    amp.init(policy=Policy.preset("O1", emulate=True,
                                  mxnet_layers=LayerLists(fp32={"layers.1.ffn"})))
    try:
        names = set()
        for _ in range(2):
            enc = _Encoder()
            enc.initialize(mx.init.Uniform(1.0))
            if hybridize:
                enc.hybridize()
            outs = {}
            for i, blk in enumerate(enc.layers):
                for part in ("ffn", "out"):
                    getattr(blk, part).register_forward_hook(
                        lambda b, a, o, k=(i, part): outs.__setitem__(k, o))
            enc(_x())
            names.add(enc.layers[1].ffn.name)
            if hybridize:  # hooks see the symbols of the trace: the cast report says it
                fcs = [d for d in amp.cast_report(enc).decisions if d.op == "FullyConnected"]
                assert [d.layer for d in fcs] == [None, None, "layers.1.ffn", None]
                assert [d.precision for d in fcs] == ["float16"] * 2 + ["float32", "float16"]
            else:
                low = {k: _in_fp16(o) for k, o in outs.items()}
                assert low == {(0, "ffn"): True, (0, "out"): True, (1, "ffn"): False,
                               (1, "out"): True}
        assert len(names) == 2  # two builds, two counter names, one path
    finally:
        amp.reset()


def test_a_path_rule_holds_in_an_o2_trace_planned_again_with_its_readers():
    """O2 plans a traced graph again with each op's readers (an op between float32
    neighbours follows them): that plan keeps the layer rules' names, so the one Dense the
    rule names stays float32 in the graph that runs."""
    amp.init(policy=Policy.preset("O2", emulate=True,
                                  mxnet_layers=LayerLists(fp32={"layers.1.ffn"})))
    try:
        enc = _Encoder()
        enc.initialize(mx.init.Uniform(1.0))
        enc.hybridize()
        enc(_x())
        nodes = json.loads(enc._cached_graph[1].tojson(remove_amp_cast=False))["nodes"]
        low = {nodes[n["inputs"][0][0]]["name"] for n in nodes
               if n["op"] == "amp_cast" and n["attrs"]["dtype"] == "float16"}
        weights = {b.ffn.weight.name: b.ffn for b in enc.layers}
        weights.update({b.out.weight.name: b.out for b in enc.layers})
        assert {w for w in weights if w in low} == set(weights) - {enc.layers[1].ffn.weight.name}
    finally:
        amp.reset()
