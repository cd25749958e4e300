"""Layer rules in eager mode: ``Policy.paddle_layers`` / ``Policy.layers`` name a layer by its
path in the model (``1.ffn``, the paths ``named_sublayers`` gives, as the static runtime names
them), and ``paddle_amp.dygraph`` plans each wrapped op with the path of the Layer running it
(the planner's ``instance``). ``Layer.__call__`` is wrapped only inside a region whose policy
has layer rules."""
import numpy as np
import paddle

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
