"""Cast reports: formatting, counting, and cross-framework comparison."""
from amp_adapters import CastReport, Policy, compare, plan_op

O1 = Policy.preset("O1")


def report(fw, ops):
    return CastReport(fw, tuple(plan_op(O1, fw, op, dtypes) for op, dtypes in ops))


MX = report("mxnet", [("FullyConnected", ("float32", "float32")), ("softmax", ("float16",)),
                      ("elemwise_add", ("float16", "float16"))])
PD = report("paddle", [("matmul_v2", ("float32", "float32")), ("softmax", ("float16",)),
                       ("elementwise_add", ("float16", "float16"))])


def test_format_lists_every_op_with_its_columns():
    text = MX.format()
    assert text.splitlines()[0] == "mxnet: 3 ops, 3 casts"
    row = next(line for line in text.splitlines() if line.startswith("FullyConnected"))
    assert row.split() == ["FullyConnected", "linear", "lower", "float32,float32", "float16", "2"]


def test_compare_flags_ops_missing_on_one_side():
    diffs = compare(MX, PD)
    assert diffs == [
        "linear: in mxnet only (runs in ['float16']); paddle's model has no such op",
        "matmul: in paddle only (runs in ['float16']); mxnet's model has no such op",
    ]


def test_compare_agrees_and_disagrees():
    same = report("paddle", [("fc", ("float32", "float32")), ("softmax", ("float16",)),
                             ("elementwise_add", ("float16", "float16"))])
    assert compare(MX, same) == []
    fp32 = report("paddle", [("fc", ("float32", "float32")), ("softmax", ("float16",)),
                             ("elementwise_add", ("float32", "float16"))])
    assert compare(MX, fp32) == ["add: mxnet runs it in ['float16'], paddle in ['float32']"]


def test_emulated_rows_are_labelled():
    d = plan_op(Policy.preset("O1", emulate=True), "mxnet", "FullyConnected",
                ("float32", "float32"), lowp_kernels=frozenset())
    assert "float32 (emulated float16)" in CastReport("mxnet", (d,)).format()


def test_emulated_and_real_low_precision_agree_but_fallback_does_not():
    emulate = Policy.preset("O1", emulate=True)
    emulated = CastReport("mxnet", (plan_op(emulate, "mxnet", "FullyConnected",
                                            ("float32", "float32"), lowp_kernels=frozenset()),))
    real = CastReport("paddle", (plan_op(emulate, "paddle", "fc", ("float32", "float32")),))
    fallback = CastReport("paddle", (plan_op(O1, "paddle", "fc", ("float32", "float32"),
                                             lowp_kernels=frozenset()),))
    assert emulated.decisions[0].precision == "float16" == real.decisions[0].precision
    assert compare(emulated, real) == []
    assert compare(emulated, fallback) == [
        "linear: mxnet runs it in ['float16'], paddle in ['float32']"]
