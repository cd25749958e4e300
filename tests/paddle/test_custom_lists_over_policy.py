"""Custom lists over ``policy=``: the static ``decorate`` and the dynamic-graph ``auto_cast``
put a user's custom white/black lists on top of a policy by the core's one rule
(``amp_adapters.rules.policy.with_custom_lists``), so both runtimes decide alike."""
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from amp_adapters import ConflictingOpError, Policy, effective_lists
from amp_adapters.rules.oplists import eager_to_program, load_table
from amp_adapters.rules.policy import with_custom_lists
from paddle_amp.lists import AutoMixedPrecisionLists, AutoMixedPrecisionListsBF16
from paddle_amp.config import resolve_decorate
from paddle_amp.dygraph.config import known_ops, policy_of

# program names that mean one op in both runtimes (an eager name is another op in a program)
NAMES = sorted((load_table("paddle").names & known_ops()) - set(eager_to_program()))
# every preset but the native one: "paddle-native" is each runtime's own native by design
PRESETS = ["O1", "O2", "O1-bf16", "O2-bf16"]


def _static(preset, white, black):
    lists = (AutoMixedPrecisionListsBF16(white, black) if preset.endswith("bf16") else
             AutoMixedPrecisionLists(custom_white_list=white, custom_black_list=black))
    return resolve_decorate(lists, policy=preset).policy


def _dygraph(preset, white, black):
    return policy_of(custom_white_list=sorted(white), custom_black_list=sorted(black),
                     policy=preset)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(preset=st.sampled_from(PRESETS),
       lists=st.lists(st.tuples(st.sampled_from(NAMES), st.booleans()), max_size=6,
                      unique_by=lambda t: t[0]))
def test_the_static_and_dygraph_runtimes_give_the_same_effective_lists(preset, lists):
    white = {op for op, low in lists if low}
    black = {op for op, low in lists if not low}
    static, dygraph = _static(preset, white, black), _dygraph(preset, white, black)
    assert effective_lists(static, "paddle") == effective_lists(dygraph, "paddle")
    ops = effective_lists(static, "paddle")
    assert white <= set(ops["lower"]) and black <= set(ops["fp32"])


def test_a_custom_list_moves_an_op_out_of_the_policy_lists_and_its_rules():
    base = Policy.preset("O1").replace(paddle_ops=Policy.preset("O1").paddle_ops.__class__(
        fp32={"softmax"}, conditional_fp32=(("pool2d", "pooling_type", ["max"]),)))
    over = with_custom_lists(base, "paddle", type(base.paddle_ops)(lower={"softmax", "pool2d"}))
    assert over.paddle_ops.lower == {"softmax", "pool2d"} and not over.paddle_ops.fp32
    assert over.paddle_ops.conditional_fp32 == ()
    assert with_custom_lists(base, "paddle", type(base.paddle_ops)()) is base


def test_an_op_in_both_custom_lists_is_refused_in_both_runtimes():
    with pytest.raises(ConflictingOpError):
        _dygraph("O1", {"softmax"}, {"softmax"})
    with pytest.raises(Exception):  # the native AutoMixedPrecisionLists' own check
        _static("O1", {"softmax"}, {"softmax"})
