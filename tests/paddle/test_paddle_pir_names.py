"""PIR op names mapped onto the legacy op tables (Paddle 3, AMP_TEST_IR=pir)."""
import paddle
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from paddle_amp.ir.pir import opnames
from paddle_helpers import pir_mode
from pir_testutil import phi_or_none

pytestmark = pytest.mark.skipif(not pir_mode(), reason="PIR programs: AMP_TEST_IR=pir on "
                                                       "Paddle 3 (make test-paddle3)")


def test_pir_names_map_onto_the_legacy_tables():
    pinned = {"pd_op.matmul": "matmul_v2", "pd_op.mean": "reduce_mean", "pd_op.sum": "reduce_sum",
              "pd_op.add_n": "sum", "pd_op.mean_all": "mean", "pd_op.legacy_matmul": "matmul",
              "pd_op.reshape": "reshape2", "pd_op.transpose": "transpose2",
              "pd_op.add": "elementwise_add", "pd_op.embedding": "lookup_table_v2",
              "pd_op.relu_": "relu", "pd_op.batch_norm_": "batch_norm",
              "pd_op.if": "conditional_block", "pd_op.while": "while",
              "pd_op.cross_entropy_with_softmax": "softmax_with_cross_entropy"}
    assert {p: opnames.legacy_name(p) for p in pinned} == pinned
    registered = set(paddle.base.core.get_all_op_names())
    assert set(opnames.OVERRIDES.values()) - {"pylayer"} <= registered
    # both directions over the op table: every legacy name reached from its own PIR name
    from amp_adapters.rules.oplists import load_table
    for legacy in sorted(load_table("paddle").names & registered):
        phi = paddle.base.core._get_phi_kernel_name(legacy)
        if phi and legacy not in ("reshape", "transpose", "fill"):  # v1 ops: not built by PIR
            assert opnames.legacy_name(f"pd_op.{phi}") == legacy, legacy
    # every phi name, both directions: the legacy op found is one that builds that phi kernel
    core = paddle.base.core
    for legacy in sorted(registered):
        try:
            phi = core._get_phi_kernel_name(legacy)
        except Exception:  # noqa: BLE001 - no phi kernel
            continue
        if phi:
            back = opnames.legacy_name(f"pd_op.{phi}")
            assert back in registered and core._get_phi_kernel_name(back) == phi, (legacy, back)
    # a PIR-only op is never mistaken for another legacy op
    assert opnames.legacy_name("pd_op.fused_no_such_op") == "fused_no_such_op"
    assert opnames.snake("MeanOut") == "mean_out" and opnames.snake("Scale") == "scale"
    # PIR operand names go back to the table's slots (the core decides kept slots by them)
    table = load_table("paddle")
    slots = {s for kept in (table.keep_fp32_inputs, table.keep_fp32_outputs)
             for names in kept.values() for s in names} | {"X", "XShape"}
    assert {s: opnames.camel(opnames.snake(s)) for s in slots} == {s: s for s in slots}


_PHI = sorted({paddle.base.core._get_phi_kernel_name(n) for n in paddle.base.core.get_all_op_names()
               if phi_or_none(n)} - {""}) if pir_mode() else ["matmul"]


@settings(max_examples=400, deadline=None, derandomize=True)
@given(name=st.one_of(st.sampled_from(_PHI), st.sampled_from(_PHI).map(lambda n: n + "_"),
                      st.text("abcdefghijklmnopqrstuvwxyz_2", min_size=1, max_size=24)))
def test_a_pir_name_never_maps_to_a_different_legacy_op(name):
    """Whatever the PIR name (real, in-place, made up): the legacy op it is planned as either
    builds that very phi kernel, is a pinned override, or is no registered op at all (an
    unknown op, which the core treats as 'follow')."""
    legacy = opnames.legacy_name(f"pd_op.{name}")
    base = name[:-1] if name.endswith("_") and name[:-1] else name
    if legacy in set(paddle.base.core.get_all_op_names()):
        assert phi_or_none(legacy) in (name, base) or {name, base} & set(opnames.OVERRIDES), \
            (name, legacy)
