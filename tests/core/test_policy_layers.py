"""Per-layer precision in the policy: LayerLists, the [layers] tables, the matching rule, and
plan_op(instance=...) applying it over the op-type lists."""
import re
import tomllib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from amp_adapters import AmpConfigError, LayerLists, Policy, OpCall, plan_op
from amp_adapters.services.doctor.recommend import policy_toml
from amp_adapters.rules.layers import check_matched, layer_paths, matches, unmatched

FC = ("FullyConnected", ["float32", "float32", "float32"])


def _plan(policy, instance, op=FC):
    return plan_op(policy, "mxnet", OpCall(op[0], op[1], instance=instance))


def test_a_layer_rule_keeps_one_instance_fp32_and_its_siblings_low():
    pol = Policy.from_dict(tomllib.loads('preset = "O1"\n[layers]\nfp32 = ["dense2"]\n'))
    kept = _plan(pol, "dense2_fwd")
    assert (kept.category, kept.run_dtype, kept.layer) == ("fp32", "float32", "dense2")
    assert kept.reason == "layer 'dense2' listed in Policy.layers.fp32 (matches 'dense2_fwd')"
    for other in ("dense0_fwd", "dense1_fwd", "dense3_fwd", "dense20_fwd", None):
        d = _plan(pol, other)
        assert (d.run_dtype, d.layer) == ("float16", None), other
    # without the rule the same instance runs low: the rule made the decision
    assert _plan(Policy.preset("O1"), "dense2_fwd").run_dtype == "float16"


def test_a_framework_table_wins_over_the_canonical_one_and_lower_runs_an_fp32_type_low():
    pol = Policy.from_dict(tomllib.loads(
        '[layers]\nfp32 = ["net"]\n[layers.mxnet]\nlower = ["net_softmax"]\n'))
    sm = ("softmax", ["float32"])
    assert _plan(Policy(), "net_softmax_fwd", sm).run_dtype == "float32"  # fp32 by its type
    d = _plan(pol, "net_softmax_fwd", sm)
    assert (d.run_dtype, d.layer) == ("float16", "net_softmax")
    assert "Policy.mxnet_layers.lower" in d.reason
    assert _plan(pol, "net_dense0_fwd").run_dtype == "float32"  # the canonical 'net' rule
    # the framework's table is not read by the other framework
    p = plan_op(pol, "paddle", OpCall("softmax", ["float32"], instance="net_softmax_fwd"))
    assert p.run_dtype == "float32" and p.layer == "net"


def test_the_longest_pattern_decides_within_a_table_and_o0_has_no_rules():
    pol = Policy(layers=LayerLists(fp32={"block"}, lower={"block_dense1"}))
    assert _plan(pol, "block_dense1_fwd").run_dtype == "float16"
    assert _plan(pol, "block_dense0_fwd").run_dtype == "float32"
    assert _plan(pol.replace(level="OD"), "block_dense1_fwd").run_dtype == "float16"
    o0 = Policy.preset("O0", layers=LayerLists(lower={"block"}))
    assert _plan(o0, "block_dense1_fwd").run_dtype == "float32"


def test_any_of_an_instance_names_can_match():
    pol = Policy(paddle_layers=LayerLists(fp32={"linear_2"}))
    d = plan_op(pol, "paddle", OpCall(
        "matmul_v2", ["float32", "float32"], instance=("linear_2.tmp_0", "linear_2.w_0")))
    assert d.run_dtype == "float32" and "matches 'linear_2.tmp_0'" in d.reason
    assert plan_op(pol, "paddle", OpCall("matmul_v2", ["float32", "float32"], instance=(
        "linear_3.tmp_0", "linear_3.w_0"))).run_dtype == "float16"


@pytest.mark.parametrize("pattern,name,hit", [
    ("dense2", "dense2", True), ("dense2", "dense2_fwd", True),
    ("dense2", "dense2_fwd_backward", True), ("dense2", "dense20_fwd", False),
    ("dense2_", "dense2_fwd", True), ("dense2_", "dense2", False),
    ("linear_2", "linear_2.tmp_0", True), ("linear_2", "linear_21.tmp_0", False),
    ("enc/ffn", "enc/ffn/matmul", True), ("dense*_fwd", "dense3_fwd", True),
    ("dense?", "dense2_fwd", False), ("fc", "fc1", False)])
def test_matching_rule(pattern, name, hit):
    assert matches(pattern, name) is hit


_NAME = st.from_regex(r"[a-z]{1,6}[0-9]{0,2}", fullmatch=True)
_SEP = st.sampled_from("_./-:")


@settings(max_examples=200, deadline=None)
@given(_NAME, _SEP, _NAME)
def test_a_pattern_covers_exactly_its_own_name_and_names_under_it(stem, sep, rest):
    assert matches(stem, stem) and matches(stem, stem + sep + rest)
    assert matches(stem + sep, stem + sep + rest)
    # a longer stem (dense2 vs dense20) is another layer
    assert not matches(stem, stem + "0" + sep + rest)


@settings(max_examples=200, deadline=None)
@given(st.lists(_NAME, max_size=4), st.lists(_NAME, max_size=4))
def test_layer_lists_accept_any_disjoint_names_and_load_back_from_toml(fp32, lower):
    lower = [n for n in lower if n not in fp32]
    pol = Policy(layers=LayerLists(fp32=fp32, lower=lower),
                 mxnet_layers=LayerLists(fp32=lower))
    assert Policy.from_dict(tomllib.loads(policy_toml(pol))) == pol


_BAD_VALUES = st.one_of(st.integers(), st.floats(allow_nan=False), st.booleans(), st.none(),
                        st.dictionaries(_NAME, _NAME, min_size=1))


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(["fp32", "lower"]), st.sampled_from([None, "mxnet", "paddle"]),
       _BAD_VALUES, st.integers(0, 2))
def test_an_instance_name_of_the_wrong_type_names_its_key(cat, fw, bad, pos):
    names = ["dense0", "dense1"]
    names.insert(pos, bad)
    table = {cat: names}
    d = {"layers": {fw: table} if fw else table}
    path = f"layers.{fw}.{cat}" if fw else f"layers.{cat}"
    with pytest.raises(AmpConfigError, match=re.escape(f"{path}[{pos}] = ")):
        Policy.from_dict(d)
    with pytest.raises(AmpConfigError, match=f"LayerLists: {cat}"):
        LayerLists(**{cat: names})


@settings(max_examples=100, deadline=None)
@given(st.lists(_NAME, min_size=1, max_size=4, unique=True), st.data(),
       st.sampled_from([None, "mxnet", "paddle"]))
def test_an_instance_in_both_lists_is_an_error_naming_it(fp32, data, fw):
    both = data.draw(st.sampled_from(fp32))
    table = {"fp32": fp32, "lower": ["other_layer", both]}
    with pytest.raises(AmpConfigError, match=re.escape(
            f"layers{'.' + fw if fw else ''}.lower[1] = {both!r}: already listed in")):
        Policy.from_dict({"layers": {fw: table} if fw else table})
    with pytest.raises(AmpConfigError, match=f"layer {both!r} is listed in both"):
        LayerLists(fp32=fp32, lower=[both])


@settings(max_examples=100, deadline=None)
@given(st.lists(_NAME, max_size=4), st.lists(_NAME, max_size=4))
def test_a_file_table_and_layer_lists_refuse_the_same_layers_in_both(fp32, lower):
    """One rule for the two lists, wherever they come from: a file's table and LayerLists
    refuse exactly the same overlaps, naming the same layer (the first alphabetically), and
    build the same lists otherwise."""
    both = sorted(set(fp32) & set(lower))
    if not both:
        assert Policy.from_dict({"layers": {"fp32": fp32, "lower": lower}}).layers == \
            LayerLists(fp32=fp32, lower=lower)
        return
    with pytest.raises(AmpConfigError, match=re.escape(
            f"layers.lower[{lower.index(both[0])}] = {both[0]!r}: already listed in "
            f"layers.fp32; a layer runs in one precision")):
        Policy.from_dict({"layers": {"fp32": fp32, "lower": lower}})
    with pytest.raises(AmpConfigError, match=f"layer {both[0]!r} is listed in both"):
        LayerLists(fp32=fp32, lower=lower)


@pytest.mark.parametrize("layers,ops", [
    ({"fp32": [True]}, {"lower": [True]}),
    ({"fp32": "dense2"}, {"lower": "dense2"}),
    ({"fp32": 3}, {"lower": 3}),
])
def test_layer_and_op_lists_refuse_a_wrong_value_in_the_same_form(layers, ops):
    """The [layers] and [ops] tables check with the same helpers: a wrong value is shown the
    same way (a bool as TOML writes it) after the same key path, with what is accepted."""
    with pytest.raises(AmpConfigError) as lay:
        Policy.from_dict({"layers": layers})
    with pytest.raises(AmpConfigError) as op:
        Policy.from_dict({"ops": ops})
    shown = lambda e: str(e.value).split(": ")[1]  # noqa: E731 (the "path = value" part)
    assert shown(lay).replace("layers.fp32", "") == shown(op).replace("ops.lower", "")
    assert "must be a" in str(lay.value) and "must be a" in str(op.value)


@pytest.mark.parametrize("d,msg", [
    ({"layers": {"tensorflow": {"fp32": ["a"]}}}, "[layers.tensorflow]: 'tensorflow' is no "
     "framework"),
    ({"layers": {"mxnt": {"fp32": ["a"]}}}, "did you mean 'mxnet'"),
    ({"layers": {"mxnet": ["dense2"]}}, "layers.mxnet = ['dense2']: must be a table"),
    ({"layers": {"mxnet": {"paddle": {"fp32": ["a"]}}}}, "unknown key 'paddle' in "
     "layers.mxnet"),
    ({"layers": {"fp23": ["a"]}}, "unknown key 'fp23' in layers; did you mean 'fp32'"),
    ({"layers": {"fp32": "dense2"}}, "layers.fp32 = 'dense2': must be a list of layer names; "
     "write ['dense2']"),
    ({"layers": {"fp32": ["dense 2"]}}, "layers.fp32[0] = 'dense 2'"),
    ({"layers": ["dense2"]}, "layers = ['dense2']: must be a table"),
])
def test_a_layers_table_in_the_wrong_place_is_an_error_naming_the_key(d, msg):
    with pytest.raises(AmpConfigError, match=re.escape(msg)):
        Policy.from_dict(d)


def test_policy_refuses_a_layers_field_that_is_no_layer_lists():
    with pytest.raises(AmpConfigError, match="Policy.mxnet_layers must be a LayerLists"):
        Policy(mxnet_layers={"fp32": ["dense2"]})


def test_a_name_matching_nothing_is_an_error_naming_the_closest_names():
    names = ["dense0_fwd", "dense1_fwd", "dense2_fwd", "dense3_fwd", "relu0"]
    [(pattern, close)] = unmatched(["dense2", "dens2"], names)
    assert pattern == "dens2" and close[0] == "dense2"
    check_matched(["dense2", "dense1_fwd"], names, "the model")  # both match: nothing raised
    with pytest.raises(AmpConfigError) as e:
        check_matched(["dense9", "dense1"], names, "the model")
    assert str(e.value).startswith("layer 'dense9' matches no layer of the model; the closest "
                                   "layers it has: 'dense")
    assert "'dense1'" not in str(e.value).split(";")[0]
    # a path the model does not have: the paths of its depth (difflib finds no '7' alike)
    with pytest.raises(AmpConfigError, match="layer '7' matches no layer of the model; the "
                                             "closest layers it has: '0', '1', '2'"):
        check_matched(["7"], ["0", "1", "2", "3", "4", "dense2_fwd"], "the model")


_TREE = st.recursive(st.just(()), lambda kids: st.lists(
    st.tuples(st.sampled_from(["0", "1", "2", "ffn", "layers", "encoder"]), kids),
    max_size=3, unique_by=lambda kv: kv[0]), max_leaves=12)


class _Node:
    """A tree of layers from a hypothesis spec: [(child name, child spec)]."""

    def __init__(self, spec):
        self.kids = [(name, _Node(k)) for name, k in spec]


@settings(max_examples=60, deadline=None)
@given(_TREE)
def test_layer_paths_name_each_layer_by_its_child_names_and_every_path_matches(spec):
    """Each layer's path is its parent's path, a dot, its own name (the root's is ''), paths
    are unique, and the rules of a model's paths pass ``check_matched`` while a path one
    level deeper than any leaf raises naming close ones."""
    root = _Node(spec)
    paths = layer_paths(root, lambda n: n.kids)
    assert paths[id(root)] == ""
    todo = [root]
    while todo:
        node = todo.pop()
        for name, child in node.kids:
            parent = paths[id(node)]
            assert paths[id(child)] == (f"{parent}.{name}" if parent else name)
            todo.append(child)
    named = [p for p in paths.values() if p]
    assert len(set(named)) == len(named)
    check_matched(named, named, "the model")
    if named:
        with pytest.raises(AmpConfigError, match="the closest layers it has: '"):
            check_matched([named[0] + ".nothing"], named, "the model")


def test_a_shared_layer_keeps_its_first_path_depth_first():
    """As Paddle's ``named_sublayers`` gives it: ``a.x``, reached before ``b``."""
    root = _Node([("a", [("x", [])]), ("b", [])])
    shared = root.kids[0][1].kids[0][1]
    root.kids[1] = ("b", shared)
    assert layer_paths(root, lambda n: n.kids)[id(shared)] == "a.x"
