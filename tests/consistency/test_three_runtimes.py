"""One policy, three runtimes: Gluon, a Paddle static program and Paddle's dynamic graph
(``paddle_amp.dygraph``) make the same per-op decisions for the same model.

The dygraph runtime decides only the ops it wraps: the Python entry points of Paddle's
GEMMs and convolutions (``_C_ops.matmul``, ``linear``, ``conv2d``: canonical ``matmul`` and
``conv``). Every other op of an eager forward runs as Paddle runs it (float32 on a CPU,
promoting after a lowered GEMM hands back float32: docs/dygraph.md), so a dygraph report
holds only those ops and is compared on them; the ops it does not decide are out of scope
here, and ``test_cast_reports.py`` compares them between Gluon and the static program.

Compared: the category (what the policy says) and the precision (the dtype whose numerics
the op has, emulated counting as its low dtype). Not compared: how a low op runs. A
``Linear`` on a batch of sequences is a broadcast ``matmul_v2`` in eager mode, whose bf16
weight gradient oneDNN sums on a reference implementation (emulated, docs/dygraph.md),
while the static program's ``fc`` flattens it into a 2-D ``mul`` (a real kernel): the same
decision on a different op form. MXNet's ``Dense`` is canonical ``linear`` (one op with its
bias), Paddle's ``Linear`` a ``matmul`` and an add, so Gluon is compared on the canonical ops
both name alike (``conv``; ``batch_dot`` and ``paddle.matmul`` as ``matmul``).
"""
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from amp_adapters import OpLists, Policy

from consistency_models import MODELS, dygraph_report, mxnet_report, paddle_report
from test_cast_reports import policies

WRAPPED = {"matmul", "conv"}  # the canonical ops paddle_amp.dygraph decides
# what each model's dygraph report must hold (not vacuous), and what it shares with Gluon's
DYGRAPH = {"mlp": {"matmul"}, "cnn": {"conv", "matmul"}, "transformer": {"matmul"},
           "lstm": {"matmul"}}
WITH_GLUON = {"mlp": set(), "cnn": {"conv"}, "transformer": {"matmul"}, "lstm": set()}


def _agree(dy, other, ops, where):
    for op in ops:
        assert dy.categories()[op] == other.categories()[op], f"{op} {where}\n{dy.format()}"
        assert dy.precisions()[op] == other.precisions()[op], f"{op} {where}\n{dy.format()}"


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("policy_name", ["O1 fp16", "O1 bf16", "O2 fp16", "custom file"])
def test_dygraph_decides_as_the_static_program_and_gluon(model, policy_name, tmp_path):
    policy = policies(tmp_path)[policy_name]
    dy = dygraph_report(model, policy)
    assert set(dy.precisions()) == DYGRAPH[model], dy.format()
    static, gluon = paddle_report(model, policy), mxnet_report(model, policy)
    _agree(dy, static, DYGRAPH[model], f"{model} under {policy_name}: dygraph vs static")
    assert set(gluon.precisions()) & DYGRAPH[model] == WITH_GLUON[model]
    _agree(dy, gluon, WITH_GLUON[model], f"{model} under {policy_name}: dygraph vs Gluon")


CUSTOM_OPS = st.fixed_dictionaries({
    "lower": st.sets(st.sampled_from(["conv", "softmax"]), max_size=2),
    "fp32": st.sets(st.sampled_from(["matmul", "layer_norm"]), max_size=2)})


@settings(max_examples=3, deadline=None, derandomize=True)
@given(ops=CUSTOM_OPS, dtype=st.sampled_from(["float16", "bfloat16"]),
       level=st.sampled_from(["O1", "O2"]))
@example(ops={"lower": {"softmax"}, "fp32": {"matmul"}}, dtype="bfloat16", level="O1")
def test_a_drawn_custom_policy_decides_alike_in_the_three_runtimes(ops, dtype, level):
    """A custom ``Policy`` (moves of the wrapped ops and of ops around them) on the CNN and
    the transformer: the three runtimes agree on every op the dygraph runtime decides."""
    policy = Policy.preset(level, dtype=dtype, emulate=True).replace(
        ops=OpLists(lower=frozenset(ops["lower"]), fp32=frozenset(ops["fp32"])))
    for model in ("cnn", "transformer"):
        dy = dygraph_report(model, policy)
        _agree(dy, paddle_report(model, policy), DYGRAPH[model], f"{model} under {policy}")
        _agree(dy, mxnet_report(model, policy), WITH_GLUON[model], f"{model} under {policy}")
    if "matmul" in ops["fp32"]:
        assert dy.precisions()["matmul"] == {"float32"}
