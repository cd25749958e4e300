"""Per-layer precision in MXNet: Policy.layers keeps one Gluon block in float32 and its
siblings low, imperative and hybridized; excluded_sym_names says the same; a name that
matches nothing warns with the closest names."""
import json
import warnings

import numpy as np
import mxnet as mx
from mxnet import gluon

import mxnet_amp as amp
from amp_adapters import LayerLists, Policy, UnmatchedLayerWarning

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


def test_a_layer_matching_nothing_warns_naming_the_closest_nodes():
    h = mx.sym.FullyConnected(mx.sym.var("data"), num_hidden=8, name="dense2")
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        amp.convert_symbol(h, excluded_sym_names=["dens2"])
    msgs = [str(x.message) for x in w if issubclass(x.category, UnmatchedLayerWarning)]
    assert msgs == ["layer 'dens2' of the policy matches no op of the symbol converted; the "
                    "closest names it has: 'dense2' (a layer rule covers names equal to it or "
                    "starting with it and a separator: _ . / - :)"]


def test_a_trace_warns_once_for_a_layer_matching_no_block_or_node():
    amp.init(policy=Policy.preset("O1", emulate=True,
                                  mxnet_layers=LayerLists(fp32={"dense2", "dens3"})))
    net = _net(hybridize=True)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        net(_x())
        net.hybridize()  # traced again: no second warning
        net(_x())
    msgs = [str(x.message) for x in w if issubclass(x.category, UnmatchedLayerWarning)]
    assert len(msgs) == 1 and msgs[0].startswith(
        "layer 'dens3' of the policy matches no op of the blocks traced so far (the last: ")
    assert "closest names it has: 'dense3'" in msgs[0]
