"""Layer rules in eager mode: ``Policy.paddle_layers`` / ``Policy.layers`` name a layer by its
path in the model (``1.ffn``, the paths ``named_sublayers`` gives, as the static runtime names
them), and ``paddle_amp.dygraph`` plans each wrapped op with the path of the Layer running it
(the planner's ``instance``). ``Layer.__call__`` is wrapped only inside a region whose policy
has layer rules."""
import numpy as np
import paddle
import pytest

from amp_adapters import LayerLists, Policy
from paddle_amp import dygraph as amp


class _Block(paddle.nn.Layer):
    def __init__(self):
        super().__init__()
        self.ffn, self.out = paddle.nn.Linear(8, 8), paddle.nn.Linear(8, 8)

    def forward(self, x):
        return self.out(self.ffn(x))


def _model():
    paddle.disable_static()
    return paddle.nn.Sequential(_Block(), _Block()), paddle.ones([4, 8])


def _precisions(policy):
    model, x = _model()
    return [(d.precision, d.layer) for d in amp.cast_report(model, x, policy=policy).decisions]


def test_a_layer_rule_keeps_that_layer_float32_and_its_siblings_low():
    base = Policy.preset("O1", emulate=True)
    assert _precisions(base) == [("float16", None)] * 4
    one = base.replace(paddle_layers=LayerLists(fp32={"1.ffn"}))
    assert _precisions(one) == [("float16", None)] * 2 + [("float32", "1.ffn"),
                                                          ("float16", None)]
    block = base.replace(layers=LayerLists(fp32={"0"}))  # a block: every layer under it
    assert _precisions(block) == [("float32", "0")] * 2 + [("float16", None)] * 2


def test_a_region_with_layer_rules_computes_as_its_decisions_say():
    """A training region (not a report): the float32 layer's output is not rounded through
    float16, its sibling's is; Layer.__call__ is back as it was after the region."""
    model, _ = _model()
    x = paddle.to_tensor(np.full((4, 8), 1.0 / 3.0, np.float32))
    native = paddle.nn.Layer.__call__
    outs = {}
    policy = Policy.preset("O1", emulate=True).replace(
        paddle_layers=LayerLists(fp32={"0.ffn"}))
    hooks = [model[0].ffn.register_forward_post_hook(
                 lambda layer, i, o: outs.__setitem__("ffn", o.numpy())),
             model[0].out.register_forward_post_hook(
                 lambda layer, i, o: outs.__setitem__("out", o.numpy()))]
    with amp.auto_cast(policy=policy) as region:
        model(x)
    for h in hooks:
        h.remove()
    assert paddle.nn.Layer.__call__ is native
    plain = model[0].ffn(x).numpy()
    assert np.array_equal(outs["ffn"], plain)  # float32: not rounded
    assert region.ran["matmul_v2"].precision == "float16"  # the last op, a sibling
    with amp.auto_cast(policy=Policy.preset("O1", emulate=True)):  # no rule: rounded
        assert not np.array_equal(model[0].ffn(x).numpy(), plain)


def test_a_region_without_layer_rules_leaves_layer_calls_alone():
    native = paddle.nn.Layer.__call__
    model, x = _model()
    seen = []
    with amp.auto_cast(policy=Policy.preset("O1", emulate=True)):
        seen.append(paddle.nn.Layer.__call__)
        model(x)
    # no path tracking: the only wrapper of a Layer call there is the step's cast sharing
    # (stepcasts: a tensor cast once per step), directly over Paddle's own
    assert [getattr(f, "__amp_original__", f) for f in seen] == [native]


class _Opens(paddle.nn.Layer):
    """A block whose ``forward`` opens the region itself (around its sublayers' calls), as
    a model that runs part of its forward in mixed precision does; ``seen``: the decisions
    of its GEMMs, in call order."""

    def __init__(self, policy, inner=None):
        super().__init__()
        self.policy, self.seen = policy, []
        self.inner = inner or paddle.nn.LayerList([paddle.nn.Linear(8, 8),
                                                   paddle.nn.Linear(8, 8)])

    def forward(self, x):
        with amp.auto_cast(policy=self.policy) as region:
            for layer in self.inner:
                x = layer(x)
                self.seen.append(region.ran["matmul_v2"])
        return x


def _nested(depth, policy):
    """(the model, the block that opens the region): the block ``depth`` levels down, under
    blocks named ``body`` (``body.body.inner.1`` at depth 2)."""
    opens = model = _Opens(policy)
    for _ in range(depth):
        outer = paddle.nn.Layer()
        outer.body = model
        outer.forward = lambda x, _m=model: _m(x)
        model = outer
    return model, opens


@pytest.mark.parametrize("depth", [0, 1, 2])
def test_a_region_opened_inside_a_forward_matches_paths_from_the_model(depth):
    """A region with layer rules opened inside a Layer's ``forward`` (the model was called
    before it) counts paths from the model called, as one opened around the model's call
    does: a rule naming ``body.inner.1`` from the model keeps that layer float32, its
    sibling runs low; after the region, no Layer call is tracked and ``Layer.__call__`` is
    Paddle's again. (Before: paths counted from the region's own sublayers, ``1``, the rule
    missed, and a warning said so.)"""
    from paddle_amp.dygraph import layer_paths
    native = paddle.nn.Layer.__call__
    path = ".".join(["body"] * depth + ["inner", "1"])
    policy = Policy.preset("O1", emulate=True).replace(paddle_layers=LayerLists(fp32={path}))
    paddle.disable_static()
    model, opens = _nested(depth, policy)
    model(paddle.ones([4, 8]))
    assert [(d.precision, d.layer) for d in opens.seen] == [("float16", None),
                                                            ("float32", path)]
    assert layer_paths._calls.root is None and layer_paths._calls.paths == []
    assert paddle.nn.Layer.__call__ is native
    opens.seen.clear()
    with amp.auto_cast(policy=policy):  # opened around the model's call: the same paths
        model(paddle.ones([4, 8]))
    assert [(d.precision, d.layer) for d in opens.seen] == [("float16", None),
                                                            ("float32", path)]
