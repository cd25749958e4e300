"""auto_cast's lists are paddle.amp's, with both spellings of an op meaning the op
(hypothesis over custom lists): the native's own ``_update_list`` decides an eager op as we
do, except where its default lists name the op in one spelling only (there we take both);
and a custom list written in the other spelling decides alike. The data copy of the lists
(``amp-adapters diff --framework paddle-dygraph``) is the installed Paddle's, and the diff
says where this runtime's native decisions and O1's differ."""
import paddle
import pytest
from hypothesis import given, settings, strategies as st

from amp_adapters import categorize
from paddle.amp.auto_cast import _update_list
from paddle_amp.dygraph.config import policy_of
from paddle_amp.dygraph.names import program_name
from amp_adapters.rules.oplists import eager_to_program

# eager names (their program spelling differs or not) that the native lists or users name
EAGER = ["matmul", "conv2d", "add", "multiply", "softmax", "exp", "mean", "sum", "relu",
         "layer_norm", "einsum", "bilinear_interp", "embedding", "tanh", "divide"]
OTHER = {e: p for e, p in eager_to_program().items()}


def _native_category(op: str, white: set, black: set) -> str:
    """paddle.amp's eager decision for ``op``: white runs low, black float32, the rest
    promotes (GetPromoteType)."""
    return "lower" if op in white else "fp32" if op in black else "promote"


lists = st.tuples(st.sets(st.sampled_from(EAGER), max_size=4),
                  st.sets(st.sampled_from(EAGER), max_size=4)).filter(lambda t: not t[0] & t[1])


@settings(max_examples=60, deadline=None)
@given(custom=lists, dtype=st.sampled_from(["float16", "bfloat16"]),
       level=st.sampled_from(["O1", "O2", "OD"]))
def test_eager_names_decide_as_the_native_update_list(custom, dtype, level):
    white_c, black_c = custom
    policy = policy_of(custom_white_list=white_c, custom_black_list=black_c, dtype=dtype,
                       level=level)
    white, black = _update_list(white_c, black_c, level, dtype)
    default_w, default_b = _update_list(None, None, level, dtype)
    for op in EAGER:
        other = program_name(op)
        if other != op and ((op in default_w) != (other in default_w) or
                            (op in default_b) != (other in default_b)):
            continue  # the native lists one spelling only: ours takes both (docs/dygraph.md)
        want = _native_category(op, white, black)
        got = categorize(policy, "paddle", other).category
        if level == "OD":
            want = "lower" if want == "lower" else "fp32"
        assert got == want, (op, other, got, want)


@settings(max_examples=40, deadline=None)
@given(custom=lists)
def test_either_spelling_of_a_custom_list_decides_alike(custom):
    white_c, black_c = custom
    swap = lambda names: {OTHER.get(n, n) for n in names}
    a = policy_of(custom_white_list=white_c, custom_black_list=black_c, dtype="bfloat16")
    b = policy_of(custom_white_list=swap(white_c), custom_black_list=swap(black_c),
                  dtype="bfloat16")
    for op in EAGER:
        assert categorize(a, "paddle", program_name(op)).category == \
            categorize(b, "paddle", program_name(op)).category, op


def test_where_the_native_names_only_the_program_spelling_ours_takes_both():
    # paddle.amp's black list has reduce_sum, not the eager name sum: natively paddle.sum
    # promotes in eager mode; here it runs float32, as the list means
    white, black = _update_list(None, None, "O1", "bfloat16")
    assert "reduce_sum" in black and "sum" not in black
    assert categorize(policy_of(dtype="bfloat16"), "paddle", "reduce_sum").category == "fp32"


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_the_native_preset_means_paddle_amp_here(dtype):
    mine = policy_of(policy="paddle-native", dtype=dtype, custom_black_list=["matmul"])
    assert mine == policy_of(dtype=dtype, custom_black_list=["matmul"])
    assert categorize(mine, "paddle", "matmul_v2").category == "fp32"
    assert categorize(mine, "paddle", "elementwise_add").category == "promote"


def test_the_data_copy_of_paddle_amps_lists_is_the_installed_paddles():
    """``paddle_dygraph.toml`` [native] (what ``amp-adapters diff --framework paddle-dygraph``
    reads without Paddle) holds the installed ``paddle.amp``'s O1 lists exactly."""
    from paddle.amp import amp_lists

    from amp_adapters.rules.oplists import _read
    version = paddle.__version__
    data = _read("paddle_dygraph.toml")["native"][version]
    for dtype in ("float16", "bfloat16"):
        assert set(data[dtype]["lower"]) == set(amp_lists.white_list()[dtype]["O1"])
        assert set(data[dtype]["fp32"]) == set(amp_lists.black_list()[dtype]["O1"])


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_diff_says_where_o1_and_this_runtimes_native_decisions_differ(capsys, dtype):
    """Every row of ``amp-adapters diff --framework paddle-dygraph`` is an op that
    ``paddle_amp.dygraph`` categorizes differently without ``policy=`` (paddle.amp's lists)
    and with ``policy="O1"``, as the row says; every other listed op is categorized alike."""
    from amp_adapters.services.cli import main
    from amp_adapters.rules.oplists import dygraph_native_lists, load_table
    from amp_adapters.rules.planner import categorize
    from paddle_amp.dygraph.config import policy_of
    assert main(["diff", "--framework", "paddle-dygraph", "--dtype", dtype]) == 0
    rows = {line.split("|")[1].strip(" `"): (line.split("|")[3].strip(),
                                              line.split("|")[4].strip())
            for line in capsys.readouterr().out.splitlines() if line.startswith("| `")}
    native, o1 = policy_of(dtype=dtype), policy_of(policy="O1", dtype=dtype)
    ops = dygraph_native_lists(dtype).names | load_table("paddle").names
    for op in ops:
        pair = (categorize(native, "paddle", op).category, categorize(o1, "paddle", op).category)
        if op in rows:
            assert pair == rows[op], op
        else:
            assert pair[0] == pair[1], op
    assert rows
