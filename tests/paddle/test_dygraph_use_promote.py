"""auto_cast(use_promote=...): the native's rule (``GetAmpDestDtype``, Paddle 2.6.2 and 3.3.1,
default True in both): at O2 with use_promote=True an op in neither list promotes (float32
when a floating input is float32, else the low dtype); with use_promote=False every op not
black-listed runs low. At O1 the native reads no use_promote: it promotes either way. The
planner decides it (device-free here: the rule, not this CPU's kernels)."""
import inspect

import paddle
import pytest

from amp_adapters import OpCall, plan_op
from paddle_amp import dygraph as amp
from paddle_amp.dygraph.config import policy_of
from paddle_amp.dygraph.lists import native_sets

UNLISTED, DTYPE = "elementwise_add", "bfloat16"


def _run(op, level, use_promote, dtypes=("float32", DTYPE)):
    return plan_op(policy_of(level=level, dtype=DTYPE, use_promote=use_promote), "paddle",
                   OpCall(op, dtypes)).run_dtype


def test_the_default_is_the_natives():
    native = inspect.signature(paddle.amp.auto_cast).parameters["use_promote"].default
    assert inspect.signature(amp.auto_cast).parameters["use_promote"].default is native is True


def test_an_unlisted_op_promotes_at_o2_only_with_use_promote():
    white, black = native_sets(DTYPE, "O2")
    assert UNLISTED not in white | black
    assert _run(UNLISTED, "O2", True) == "float32"
    assert _run(UNLISTED, "O2", True, (DTYPE, DTYPE)) == DTYPE
    assert _run(UNLISTED, "O2", False) == DTYPE
    assert _run("add", "O2", False) == DTYPE  # either spelling


@pytest.mark.parametrize("use_promote", [True, False])
def test_lists_decide_whatever_use_promote_says(use_promote):
    assert "lookup_table_v2" in native_sets(DTYPE, "O2")[1]
    assert _run("lookup_table_v2", "O2", use_promote, ("float32",)) == "float32"
    assert _run("matmul_v2", "O2", use_promote) == DTYPE
    custom = policy_of(level="O2", dtype=DTYPE, use_promote=use_promote,
                       custom_black_list={UNLISTED})
    assert plan_op(custom, "paddle", OpCall(UNLISTED, ("float32", DTYPE))).run_dtype == "float32"


def test_at_o1_the_native_promotes_whatever_use_promote_says():
    assert _run(UNLISTED, "O1", False) == _run(UNLISTED, "O1", True) == "float32"


def test_a_policy_keeps_its_own_rule_unless_use_promote_is_false():
    from amp_adapters import Policy
    base = Policy.preset("O2-bf16")
    assert not policy_of(policy=base).use_promote  # the project's O2: every op low
    promoting = base.replace(use_promote=True)
    assert policy_of(policy=promoting).use_promote
    assert not policy_of(policy=promoting, use_promote=False).use_promote
