"""A user's custom lists on top of op lists: one rule (``OpLists.with_custom``), the native
``_update_list``'s, that ``with_custom_lists`` (a policy's overrides), Paddle's static live
sets and ``paddle.amp``'s own lists all use."""
from hypothesis import given, settings, strategies as st

from amp_adapters import OpLists, Policy
from amp_adapters.rules.policy import with_custom_lists

OPS = st.sampled_from(["matmul", "softmax", "conv2d", "relu", "exp", "pool2d", "sum", "log"])
CATS = ("lower", "fp32", "promote")


@st.composite
def disjoint(draw, cats=CATS):
    """Op lists with each op in at most one of ``cats``."""
    owner = draw(st.dictionaries(OPS, st.sampled_from(cats)))
    return {c: frozenset(op for op, k in owner.items() if k == c) for c in cats}


@settings(deadline=None, max_examples=50)
@given(base=disjoint(), custom=disjoint(("lower", "fp32")), replace=st.booleans(),
       rule=st.sampled_from([(), (("log", "act", ("gelu",)),), (("exp", "act", ("gelu",)),)]))
def test_a_custom_op_takes_its_list_and_leaves_the_others(base, custom, replace, rule):
    lists = OpLists(**{c: s for c, s in base.items() if not rule or rule[0][0] not in s},
                    conditional_fp32=rule, replace=replace)
    got = lists.with_custom(OpLists(**custom))
    named = custom["lower"] | custom["fp32"]
    for cat in CATS:
        assert getattr(got, cat) == (getattr(lists, cat) - named) | custom.get(cat, frozenset())
    assert got.conditional_fp32 == tuple(r for r in rule if r[0] not in named)
    assert got.replace == lists.replace
    if not named:
        assert got is lists


@settings(deadline=None, max_examples=50)
@given(base=disjoint(), custom=disjoint(("lower", "fp32")))
def test_a_policy_gets_custom_lists_by_the_same_rule(base, custom):
    policy = Policy(dtype="bfloat16", paddle_ops=OpLists(**base))
    over = with_custom_lists(policy, "paddle", OpLists(**custom))
    assert over.paddle_ops == OpLists(**base).with_custom(OpLists(**custom))
    assert over.mxnet_ops == policy.mxnet_ops
