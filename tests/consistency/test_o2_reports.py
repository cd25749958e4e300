"""O2 under one policy in both frameworks: the same ops low, the same kinds of parameters low.

Each reference model is built in both frameworks; MXNet stores the planned
parameters low with ``cast_params`` and is traced again, Paddle decorates and
rewrites. The cast reports must agree op by op (by precision, an EMULATED op
counting as its low dtype), and the core's parameter plans must store the
same number of parameters low and keep the same number in float32 (the
frameworks name and split parameters alike in these models: a weight and a
bias per dense/conv layer, scale and bias per norm).
"""
import paddle
import pytest

import mxnet_amp
import paddle_amp
from amp_adapters import Policy, compare

from consistency_models import MODELS, mxnet_block, paddle_forward

# parameters per model: (stored low, kept float32), the same in both frameworks
EXPECTED = {
    "mlp": (4, 0),
    "cnn": (4, 4),          # conv and dense low; batch-norm scale, bias and statistics fp32
    "transformer": (12, 4),  # six dense layers low; two layer norms fp32
    "lstm": (7, 0),         # embedding, four LSTM weights/biases, dense weight and bias
}
# paddle.nn.LSTM also owns a flattened weight buffer no forward op reads: kept float32
UNREAD = {("paddle", "lstm"): 1}


def mxnet_o2(name, policy):
    mxnet_amp.init(policy=policy)
    try:
        net, x = mxnet_block(name)
        plan = mxnet_amp.cast_params(net)
        net(x)  # trace again, with the low parameters
        return mxnet_amp.cast_report(net), plan
    finally:
        mxnet_amp.reset()


def paddle_o2(name, policy):
    paddle.enable_static()
    main, startup = paddle.static.Program(), paddle.static.Program()
    with paddle.static.program_guard(main, startup), paddle.utils.unique_name.guard():
        loss = paddle.mean(paddle_forward(name))
        opt = paddle_amp.decorate(paddle.optimizer.Momentum(0.1), policy=policy)
        opt.minimize(loss)
    return paddle_amp.cast_report(main), opt.param_plan()


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("preset", ["O2", "O2-bf16"])
def test_o2_reports_and_param_plans_agree(model, preset):
    policy = Policy.preset(preset, emulate=True)
    (mx_report, mx_plan), (pd_report, pd_plan) = mxnet_o2(model, policy), paddle_o2(model,
                                                                                   policy)
    diffs = [d for d in compare(mx_report, pd_report) if " only " not in d]
    assert diffs == [], f"{model} under {preset}:\n" + "\n".join(diffs) + "\n" + \
        mx_report.format() + "\n" + pd_report.format()
    counts = {fw: (len(plan.low), len(plan.fp32)) for fw, plan in
              (("mxnet", mx_plan), ("paddle", pd_plan))}
    low, fp32 = EXPECTED[model]
    assert counts == {fw: (low, fp32 + UNREAD.get((fw, model), 0)) for fw in counts}, (
        mx_plan.format() + "\n" + pd_plan.format())
    dtype = {"O2": "float16", "O2-bf16": "bfloat16"}[preset]
    mx_low_inputs = {d.op for d in mx_report.decisions if dtype in d.input_dtypes}
    assert mx_low_inputs, "MXNet traced no low-precision parameter"
