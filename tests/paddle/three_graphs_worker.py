"""Worker for test_paddle_three_graphs.py: the cast reports of the consistency models in one
graph, as JSON on stdout: {model: {policy: [each op's decision, as a dict of its fields]}}.

``python three_graphs_worker.py mxnet``: MXNet's reports (tests/consistency's Gluon models).
``python three_graphs_worker.py paddle``: Paddle's, in the IR ``FLAGS_enable_pir_api`` picks
(the models written with the layer APIs both IRs and Paddle 2.6 and 3.x accept).
"""
import dataclasses
import json
import math
import os
import sys

POLICIES = {"O1 fp16": "O1", "O1 bf16": "O1-bf16", "O2 fp16": "O2"}
B, T, D, V, C, HW = 2, 4, 8, 16, 4, 8  # as tests/consistency/consistency_models.py


def _op(api, legacy_type, inputs, attrs, **kwargs):
    """``api(*inputs, **kwargs)``; on a legacy-IR program in Paddle 3.x, where ``paddle.matmul``
    and ``F.gelu`` build only PIR ops ("must be Value, but got Variable"), the op they append
    on Paddle 2.6 (``legacy_type`` with ``attrs``)."""
    import paddle
    from paddle.base import framework
    x = inputs[0]
    if not isinstance(x, framework.Variable) or paddle.__version__.startswith("2."):
        return api(*inputs, **kwargs)
    helper = paddle.base.layer_helper.LayerHelper(legacy_type)
    out = helper.create_variable_for_type_inference(x.dtype)
    helper.append_op(type=legacy_type, inputs=dict(zip("XY", inputs)), outputs={"Out": out},
                     attrs=attrs)
    return out


def _matmul(x, y, transpose_y=False):
    import paddle
    return _op(paddle.matmul, "matmul_v2", [x, y], {"trans_x": False, "trans_y": transpose_y},
               transpose_y=transpose_y)


def _gelu(x):
    import paddle
    return _op(paddle.nn.functional.gelu, "gelu", [x], {"approximate": False})


def paddle_forward(name):
    """The consistency models' forward, with paddle.nn layers (Paddle 3's static.nn.fc and
    layer_norm build no PIR op)."""
    import paddle
    F, nn = paddle.nn.functional, paddle.nn
    if name == "mlp":
        x = paddle.static.data("x", [B, D], "float32")
        return nn.Linear(D, V)(F.relu(nn.Linear(D, D)(x)))
    if name == "cnn":
        x = paddle.static.data("x", [B, 1, HW, HW], "float32")
        h = nn.BatchNorm2D(C)(nn.Conv2D(1, C, 3, padding=1)(x))
        return nn.Linear(C * (HW // 2) ** 2, V)(paddle.flatten(F.max_pool2d(F.relu(h), 2), 1))
    if name == "transformer":
        x = paddle.static.data("x", [B, T, D], "float32")
        q, k, v = (nn.Linear(D, D)(x) for _ in range(3))
        att = F.softmax(_matmul(q, k, transpose_y=True) * (1 / math.sqrt(D)), axis=-1)
        x = nn.LayerNorm(D)(x + nn.Linear(D, D)(_matmul(att, v)))
        return nn.LayerNorm(D)(x + nn.Linear(4 * D, D)(_gelu(nn.Linear(D, 4 * D)(x))))
    tokens = paddle.static.data("tokens", [B, T], "int64")
    h, _ = nn.LSTM(D, D)(nn.Embedding(V, D)(tokens))
    return nn.Linear(D, V)(h)


def paddle_report(name, policy):
    import paddle
    import paddle_amp
    paddle.enable_static()
    main, startup = paddle.static.Program(), paddle.static.Program()
    with paddle.static.program_guard(main, startup), paddle.utils.unique_name.guard():
        loss = paddle.mean(paddle_forward(name))
        paddle_amp.decorate(paddle.optimizer.SGD(0.1), policy=policy).minimize(loss)
    return paddle_amp.cast_report(main)


def main(graph):
    from amp_adapters import Policy
    if graph == "mxnet":
        from consistency_models import MODELS, mxnet_report as report
    else:
        MODELS, report = ("mlp", "cnn", "transformer", "lstm"), paddle_report
    out = {m: {p: [dataclasses.asdict(d) for d in
                   report(m, Policy.preset(preset, emulate=True)).decisions]
               for p, preset in POLICIES.items()} for m in MODELS}
    print("JSON " + json.dumps(out), flush=True)


if __name__ == "__main__":
    os.environ.setdefault("GLOG_minloglevel", "2")
    main(sys.argv[1])
