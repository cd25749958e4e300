"""Cast reports: formatting, counting, and cross-framework comparison."""
from hypothesis import given, settings
from hypothesis import strategies as st

from amp_adapters.rules.device import DeviceProfile, ShapeClass
from amp_adapters import CastReport, Policy, compare, kernel_differences, OpCall, plan_op
from amp_adapters.services.report import GraphCasts

O1 = Policy.preset("O1")


def report(fw, ops):
    return CastReport(fw, tuple(plan_op(O1, fw, OpCall(op, dtypes)) for op, dtypes in ops))


MX = report("mxnet", [("FullyConnected", ("float32", "float32")), ("softmax", ("float16",)),
                      ("elemwise_add", ("float16", "float16"))])
PD = report("paddle", [("matmul_v2", ("float32", "float32")), ("softmax", ("float16",)),
                       ("elementwise_add", ("float16", "float16"))])


def test_format_lists_every_op_with_its_columns_and_reason():
    text = MX.format()
    assert text.splitlines()[0] == "mxnet: 3 ops, 3 casts planned"  # no graph: planned casts
    row = next(line for line in text.splitlines() if line.startswith("FullyConnected"))
    assert row.split()[:6] == ["FullyConnected", "linear", "lower", "float32,float32", "float16",
                               "2"]
    assert row.endswith("canonical op 'linear' is lower by default for float16")  # the why


def test_print_is_the_table():
    assert str(MX) == MX.format() and "CastReport(" not in str(MX)
    assert text_columns(str(MX)) == ["op", "canonical", "category", "inputs", "runs in", "casts",
                                     "why"]


def text_columns(text):
    header = text.splitlines()[1]
    return [c.strip() for c in header.split("  ") if c.strip()]


def test_graph_casts_are_the_count_and_round_trips_are_labelled():
    emulate = Policy.preset("O1", emulate=True)
    d = plan_op(emulate, "paddle", OpCall("mul", ("float32", "float32")),
                device=DeviceProfile(frozenset()))
    # x -> fp16 -> fp32 (a round trip), w -> fp16 -> fp32, out -> fp16 -> fp32, and one real cast
    casts = [("x", "x.h", "float16"), ("x.h", "x.r", "float32"), ("w", "w.h", "float16"),
             ("w.h", "w.r", "float32"), ("o", "o.h", "float16"), ("o.h", "o.r", "float32"),
             ("z", "z.h", "float16")]
    g = GraphCasts.count(casts)
    assert (g.total, g.round_trips) == (7, 6)
    r = CastReport("paddle", (d,), g)
    assert r.num_casts == 7 and r.planned_casts == 0
    assert str(r).splitlines()[0] == ("paddle: 1 ops, 7 casts in the forward graph (6 of them "
                                      "emulation's round trips through float16)")


@given(st.lists(st.tuples(st.sampled_from("abcdef"), st.sampled_from("abcdef"),
                          st.sampled_from(["float16", "bfloat16", "float32", None])),
                max_size=8))
@settings(max_examples=80, derandomize=True, deadline=None)
def test_round_trips_never_exceed_the_casts(casts):
    g = GraphCasts.count(casts)
    assert 0 <= g.round_trips <= g.total == len(casts)
    if not any(to == "float32" for _, _, to in casts):
        assert g.round_trips == 0


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
    d = plan_op(Policy.preset("O1", emulate=True), "mxnet", OpCall(
        "FullyConnected", ("float32", "float32")), device=DeviceProfile(frozenset()))
    assert "float32 (emulated float16)" in CastReport("mxnet", (d,)).format()


def test_emulated_and_real_low_precision_agree_but_fallback_does_not():
    emulate = Policy.preset("O1", emulate=True)
    emulated = CastReport("mxnet", (plan_op(emulate, "mxnet", OpCall(
        "FullyConnected", ("float32", "float32")), device=DeviceProfile(frozenset())),))
    real = CastReport("paddle", (plan_op(emulate, "paddle", OpCall("fc", ("float32", "float32"))),))
    fallback = CastReport("paddle", (plan_op(O1, "paddle", OpCall("fc", ("float32", "float32")),
                                             device=DeviceProfile(frozenset())),))
    assert emulated.decisions[0].precision == "float16" == real.decisions[0].precision
    assert compare(emulated, real) == []
    assert compare(emulated, fallback) == [
        "linear: mxnet runs it in ['float16'], paddle in ['float32']"]


def test_kernel_differences_name_ops_real_in_one_report_only():
    """A bf16 GEMM on a real kernel in one framework and emulated in the other: the machines'
    kernels differ, and the follow op after it runs in another dtype in each."""
    bf16 = Policy.preset("O1-bf16", emulate=True)
    here = frozenset({"FullyConnected", "Activation"})
    real = CastReport("mxnet", (plan_op(bf16, "mxnet", OpCall("FullyConnected", ("float32",) * 2),
                                        device=DeviceProfile(here)),
                                plan_op(bf16, "mxnet", OpCall(
                                    "Activation", ("bfloat16",), attrs={"act_type": "relu"}),
                                    device=DeviceProfile(here))))
    emulated = CastReport("paddle", (plan_op(bf16, "paddle", OpCall("mul", ("float32",) * 2),
                                             device=DeviceProfile(frozenset())),
                                     plan_op(bf16, "paddle", OpCall("relu", ("float32",)),
                                             device=DeviceProfile(frozenset()))))
    assert real.executions() == {"linear": {"kernel"}, "relu": {"kernel"}}
    assert emulated.executions() == {"matmul": {"emulated"}}
    # linear vs matmul: not the same op, but one model runs real kernels, the other's GEMM none
    assert kernel_differences(real, emulated) == [
        "matmul: paddle runs it emulated; mxnet's model has no such op"]
    paddle_real = CastReport("paddle", (plan_op(bf16, "paddle", OpCall("mul", ("float32",) * 2),
                                                device=DeviceProfile(frozenset({"mul"}))),))
    assert kernel_differences(paddle_real, emulated) == [
        "matmul: paddle runs it kernel, paddle emulated"]
    assert kernel_differences(paddle_real, paddle_real) == []
    assert compare(real, emulated)[-1] == "relu: mxnet runs it in ['bfloat16'], paddle in " \
                                          "['float32']"


def test_an_op_without_a_kernel_that_the_other_model_lacks_is_a_kernel_difference():
    """Paddle's bias add on its own, without a usable bf16 kernel here; MXNet adds the bias
    inside FullyConnected on a real one. Where neither runs a real kernel (a CPU without
    them), that is no difference: the models are then compared op by op."""
    bf16 = Policy.preset("O1-bf16")
    mx = CastReport("mxnet", (plan_op(bf16, "mxnet", OpCall("FullyConnected", ("float32",) * 3),
                                      device=DeviceProfile(frozenset({"FullyConnected"}))),))
    pd = CastReport("paddle", (
        plan_op(bf16, "paddle", OpCall("matmul_v2", ("float32",) * 2),
                device=DeviceProfile(frozenset({"matmul_v2", "elementwise_add"}))),
        plan_op(bf16, "paddle", OpCall(
            "elementwise_add", ("bfloat16", "float32"),
            shape=ShapeClass.of([(4, 8, 16), (16,)], result_rank=3), param_inputs=(False, True)),
            device=DeviceProfile(frozenset({"matmul_v2", "elementwise_add"}),
                                     slow_broadcast_grads={"elementwise_add"}, training=True))))
    assert kernel_differences(mx, pd) == [
        "add: paddle runs it fell back; mxnet's model has no such op"]
    assert kernel_differences(pd, mx) == [
        "add: paddle runs it fell back; mxnet's model has no such op"]
    none = frozenset()
    mx_none = CastReport("mxnet", (plan_op(bf16, "mxnet", OpCall(
        "FullyConnected", ("float32",) * 3), device=DeviceProfile(none)),))
    pd_none = CastReport("paddle", (
        plan_op(bf16, "paddle", OpCall("matmul_v2", ("float32",) * 2), device=DeviceProfile(none)),
        plan_op(bf16, "paddle", OpCall("elementwise_add", ("float32",) * 2),
                device=DeviceProfile(none))))
    assert kernel_differences(mx_none, pd_none) == []


def test_graph_casts_count_the_bytes_of_the_casts_of_a_known_size():
    from amp_adapters.services.report import GraphCasts, cast_bytes

    assert cast_bytes((4, 16), "bfloat16") == 128
    assert cast_bytes((-1, 16), "float16") is None  # the batch is not fed yet
    assert cast_bytes((4, 16), None) is None  # a dtype decided at run time
    sized = GraphCasts.count([("w", "w.cast", "float16", 2048), ("x", "x.cast", "float16", None),
                              ("b", "b.cast", "float32", 0)])
    assert (sized.total, sized.nbytes, sized.unsized) == (3, 2048, 1)
    assert sized.bytes_line() == "; 2048 bytes written by them per step (and 1 whose size " \
        "waits for the batch)"
    unsized = GraphCasts.count([("w", "w.cast", "float16")])
    assert unsized.nbytes is None and unsized.bytes_line() == ""
    assert GraphCasts.count([("w", "w.cast", "float16", 3 << 20)]).bytes_line() == \
        "; 3.00 MiB written by them per step"


def test_the_summary_says_which_copies_the_backward_casts_again():
    g = GraphCasts.count([("a", "a16", "bfloat16", 1 << 20), ("b", "b16", "bfloat16", 1 << 20)],
                         recast=[1 << 20])
    assert (g.recast, g.recast_bytes) == (1, 1 << 20)
    assert g.bytes_line() == ("; 2.00 MiB written by them per step; 1 of their copies cast "
                              "again in the backward rather than kept from the forward, "
                              "1.00 MiB")
    assert GraphCasts.count([("a", "a16", "bfloat16")], recast=[None]).bytes_line() == \
        "; 1 of their copies cast again in the backward rather than kept from the forward"
    assert "again" not in GraphCasts.count([("a", "a16", "bfloat16", 8)]).bytes_line()
