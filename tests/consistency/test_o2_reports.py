"""O2 under one policy in both frameworks: the same ops low, the same kinds of parameters low.

Each reference model is built in both frameworks; MXNet stores the planned
parameters low with ``cast_params`` and is traced again, Paddle decorates and
rewrites. The cast reports must agree op by op (by precision, an EMULATED op
counting as its low dtype), but for the ops that follow their float32 neighbours
(issue 38, point 8), whose neighbours the two models differ in; the scale of the
attention does so in both. The core's parameter plans must store the
same number of parameters low and keep the same number in float32 (the
frameworks name and split parameters alike in these models: a weight and a
bias per dense/conv layer, scale and bias per norm).
"""
import dataclasses

import paddle
import pytest

import mxnet_amp
import paddle_amp
from amp_adapters import Policy, compare, policy_disagreements

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


def _follows_neighbours(d) -> bool:
    """O2 left this op (one that follows or promotes its inputs) in float32 with a kernel
    at hand: it follows its float32 neighbours."""
    return d.category in ("follow", "promote") and d.run_dtype == "float32" and \
        not (d.emulated or d.fell_back)


def _planned_low(report):
    """``report`` without the ops that follow their float32 neighbours."""
    return dataclasses.replace(report, decisions=tuple(
        d for d in report.decisions if not _follows_neighbours(d)))


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
    where = f"{model} under {preset}:\n" + "\n".join(compare(mx_report, pd_report)) + \
        "\n" + mx_report.format() + "\n" + pd_report.format()
    # every op O2 runs low, or keeps float32 by its category or for want of a kernel, agrees;
    # an op that follows or promotes its inputs and follows its float32 neighbours (issue
    # 38, point 8) is set apart: its neighbours are what differs, where the two frameworks
    # run them on different kernels (emulated here, real there) or model them differently
    # (MXNet's Dense adds its bias; its native bf16 list keeps Flatten fp32)
    mx_low, pd_low = _planned_low(mx_report), _planned_low(pd_report)
    assert policy_disagreements(mx_low, pd_low) == [], where
    assert [d for d in compare(mx_low, pd_low) if " only " not in d] == [], where
    counts = {fw: (len(plan.low), len(plan.fp32)) for fw, plan in
              (("mxnet", mx_plan), ("paddle", pd_plan))}
    low, fp32 = EXPECTED[model]
    assert counts == {fw: (low, fp32 + UNREAD.get((fw, model), 0)) for fw in counts}, (
        mx_plan.format() + "\n" + pd_plan.format())
    dtype = {"O2": "float16", "O2-bf16": "bfloat16"}[preset]
    mx_low_inputs = {d.op for d in mx_report.decisions if dtype in d.input_dtypes}
    assert mx_low_inputs, "MXNet traced no low-precision parameter"


def _around(report, op, before, after):
    """The decisions of ``op`` in ``report`` whose neighbours in graph order are ``before``
    and ``after`` (canonical or framework names), with the casts the plan puts on the op
    and on the reader after it."""
    ds = report.decisions
    return [(d, ds[i + 1]) for i, d in enumerate(ds[:-1]) if d.op == op and i > 0
            and before in (ds[i - 1].canonical, ds[i - 1].op)
            and after in (ds[i + 1].canonical, ds[i + 1].op)]


def test_o2_fp16_emulated_the_attentions_scale_follows_its_float32_neighbours():
    """Issue 38, point 8: ``batch_dot -> * (1/sqrt(d)) -> softmax`` under O2 fp16 emulated on
    a CPU: the GEMM is emulated (float32 values rounded through float16), softmax is fp32,
    and the scale, which has a CPU float16 kernel in both frameworks, runs float32 between
    them: no cast around it (the native's 0), in the graph that runs in each framework."""
    policy = Policy.preset("O2", emulate=True)
    (mx_report, _), (pd_report, _) = mxnet_o2("transformer", policy), \
        paddle_o2("transformer", policy)
    for report, op in ((mx_report, "_mul_scalar"), (pd_report, "scale")):
        [(lone, reader)] = _around(report, op, "matmul", "softmax")
        assert (lone.run_dtype, lone.num_casts, reader.num_casts) == ("float32", 0, 0), \
            report.format()
        assert not lone.emulated and "follows its data" in lone.reason
    # the casts in the graphs that run: none reads or writes the scale's values
    mx_casts = mxnet_graph_casts_around("_mul_scalar")
    assert mx_casts == 0
    assert paddle_program_casts_around("scale") == 0


def mxnet_graph_casts_around(op):
    """``amp_cast`` nodes reading ``op``'s output or feeding it a low value (not the end of
    the emulated GEMM's round trip, which is the GEMM's), in the graph the reference
    transformer runs under ``init(policy="O2", emulate)``, after ``cast_params``."""
    import json
    mxnet_amp.init(policy=Policy.preset("O2", emulate=True))
    try:
        net, x = mxnet_block("transformer")
        mxnet_amp.cast_params(net)
        net(x)
        nodes = json.loads(net._cached_graph[1].tojson(remove_amp_cast=False))["nodes"]
    finally:
        mxnet_amp.reset()
    [at] = [i for i, n in enumerate(nodes) if n["op"] == op]
    feeds = [i for i, *_ in nodes[at]["inputs"]]
    return sum(n["op"] in ("amp_cast", "amp_multicast") and (
        (i in feeds and n.get("attrs", {}).get("dtype") != "float32") or
        any(j == at for j, *_ in n["inputs"])) for i, n in enumerate(nodes))


def paddle_program_casts_around(op):
    """``cast`` ops reading ``op``'s output or feeding it a low value (not the end of the
    emulated GEMM's round trip) in the rewritten program of the
    reference transformer under O2 fp16 emulated (Paddle 2.6.2: the legacy IR; PIR's program
    is checked in tests/paddle/test_paddle_o2_moves.py)."""
    paddle.enable_static()
    main, startup = paddle.static.Program(), paddle.static.Program()
    with paddle.static.program_guard(main, startup), paddle.utils.unique_name.guard():
        loss = paddle.mean(paddle_forward("transformer"))
        opt = paddle_amp.decorate(paddle.optimizer.Momentum(0.1),
                                  policy=Policy.preset("O2", emulate=True))
        opt.minimize(loss)
    ops = main.global_block().ops
    lone = next(o for o in ops if o.type == op)  # the forward one (the backward follows)
    ins, outs = set(lone.input_arg_names), set(lone.output_arg_names)
    block = main.global_block()
    return sum(o.type == "cast" and bool(
        (set(o.output_arg_names) & ins and
         block.var(o.output_arg_names[0]).dtype != paddle.float32) or
        set(o.input_arg_names) & outs) for o in ops)
