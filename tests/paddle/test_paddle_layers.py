"""Per-layer precision in Paddle, in this IR (AMP_TEST_IR): Policy.paddle_layers keeps the ops
of one fc layer (by the parameters they read) in float32 and its siblings low;
custom_black_varnames says the same in the policy; a model built from paddle.nn layers is named
by layer paths; a name matching nothing is an error."""
import contextlib

import paddle
import pytest

import paddle_amp
from amp_adapters import AmpConfigError, LayerLists, Policy
from paddle_helpers import static_in_own_scope  # noqa: F401 (a fixture)


pytestmark = pytest.mark.usefixtures("static_in_own_scope")


def _build(**decorate):
    """Three fc layers ``dense0``..``dense2`` (parameters ``dense<i>.w_0``/``.b_0``), decorated
    with ``decorate``; returns (the decorated optimizer, {op decision rows})."""
    main, startup = paddle.static.Program(), paddle.static.Program()
    with paddle.static.program_guard(main, startup), paddle.utils.unique_name.guard():
        h = paddle.static.data("x", [4, 8], "float32")
        for i in range(3):
            h = paddle.static.nn.fc(h, 8, name=f"dense{i}",
                                    weight_attr=paddle.ParamAttr(name=f"dense{i}.w_0"),
                                    bias_attr=paddle.ParamAttr(name=f"dense{i}.b_0"))
        loss = paddle.mean(h)
        opt = paddle_amp.decorate(paddle.optimizer.SGD(0.1), emulate=True, **decorate)
        opt.minimize(loss)
    rows = [(d.op, d.precision, d.layer) for d in paddle_amp.cast_report(main).decisions
            if d.canonical in ("matmul", "add")]
    return opt, rows


def _matmuls(rows):
    return [(prec, layer) for op, prec, layer in rows if op in ("mul", "matmul_v2")]


def test_a_layer_rule_keeps_one_fc_layer_fp32_and_the_others_low():
    _, plain = _build(policy="O1")
    assert [p for p, _ in _matmuls(plain)] == ["float16"] * 3
    _, rows = _build(policy=Policy.preset("O1", paddle_layers=LayerLists(fp32={"dense1"})))
    assert _matmuls(rows) == [("float16", None), ("float32", "dense1"), ("float16", None)]
    # the bias add of dense1 reads dense1.b_0: the same layer
    assert [layer for op, _, layer in rows if op == "elementwise_add"][1] == "dense1"


def test_custom_black_varnames_and_a_policy_file_agree(tmp_path):
    lists = paddle_amp.AutoMixedPrecisionLists(custom_black_varnames=["dense2.w_0"])
    opt, by_lists = _build(amp_lists=lists)
    assert opt.policy.paddle_layers.fp32 == {"dense2.w_0"}
    path = tmp_path / "p.toml"
    path.write_text('preset = "paddle-native"\n[layers.paddle]\nfp32 = ["dense2.w_0"]\n')
    _, by_file = _build(policy=str(path))
    assert [p for _, p, _ in by_file] == [p for _, p, _ in by_lists]
    assert _matmuls(by_file)[2] == ("float32", "dense2.w_0")


def test_a_layer_matching_nothing_is_an_error_with_the_closest_names():
    with pytest.raises(AmpConfigError) as e:
        _build(policy=Policy.preset("O1", paddle_layers=LayerLists(fp32={"dens1"})))
    assert str(e.value).startswith("layer 'dens1' matches no layer of the program; the closest "
                                   "layers it has: 'dense1'")


class _Block(paddle.nn.Layer):
    def __init__(self):
        super().__init__()
        self.ffn = paddle.nn.Linear(8, 8)
        self.out = paddle.nn.Linear(8, 8)

    def forward(self, x):
        return self.out(self.ffn(x))


class _Encoder(paddle.nn.Layer):
    def __init__(self):
        super().__init__()
        self.layers = paddle.nn.LayerList([_Block(), _Block()])

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


def _encoder_rows(policy, fresh_names=False):
    """The matmul rows (precision, layer) of a nested paddle.nn model built in a program of its
    own (parameters from Paddle's counter: other names each time, but under
    ``fresh_names``: ``linear_0``...), decorated with ``policy``; and its parameter names."""
    main, startup = paddle.static.Program(), paddle.static.Program()
    names = paddle.utils.unique_name.guard() if fresh_names else contextlib.nullcontext()
    with paddle.static.program_guard(main, startup), names:
        h = _Encoder()(paddle.static.data("x", [4, 8], "float32"))
        opt = paddle_amp.decorate(paddle.optimizer.SGD(0.1), emulate=True, policy=policy)
        opt.minimize(paddle.mean(h))
    params = {p.name for p in main.global_block().all_parameters()}
    rows = [(d.op, d.precision, d.layer) for d in paddle_amp.cast_report(main).decisions
            if d.canonical == "matmul"]
    return [(prec, layer) for _, prec, layer in rows], params


def test_a_layer_path_names_one_nested_layer_in_every_build():
    """``layers.1.ffn`` (the child names of ``named_sublayers`` from the model called) keeps
    that one Linear in float32 however Paddle's counter named its parameters; the old form,
    a parameter name's stem, still matches."""
    policy = Policy.preset("O1", paddle_layers=LayerLists(fp32={"layers.1.ffn"}))
    first, names = _encoder_rows(policy)
    again, names_again = _encoder_rows(policy)
    assert first == again == [("float16", None)] * 2 + [("float32", "layers.1.ffn"),
                                                         ("float16", None)]
    assert not names & names_again
    by_stem = Policy.preset("O1", paddle_layers=LayerLists(fp32={"linear_2"}))
    rows, names = _encoder_rows(by_stem, fresh_names=True)
    assert "linear_2.w_0" in names and rows[2] == ("float32", "linear_2")
    assert [p for p, _ in rows] == ["float16", "float16", "float32", "float16"]


def test_under_o2_a_layer_kept_fp32_keeps_its_weight_fp32():
    """O2 stores a weight low only where every reader computes low: the layer a rule keeps in
    float32 reads its own weight in float32 (stored so, no cast up each step); the others'
    go low."""
    opt, rows = _build(policy=Policy.preset("O2", paddle_layers=LayerLists(fp32={"dense1"})))
    assert _matmuls(rows)[1] == ("float32", "dense1")
    plan = opt._param_plan
    assert plan.dtypes["dense1.w_0"] == "float32" and "layer 'dense1'" in \
        plan.reasons["dense1.w_0"]
    assert plan.dtypes["dense0.w_0"] == plan.dtypes["dense2.w_0"] == "float16"



def test_a_program_built_under_fresh_names_takes_no_path_of_an_earlier_model():
    """Under ``unique_name.guard()`` two programs share parameter names (``linear_0.w_0``):
    paths are kept per program (and per clone: an eval program, the doctor's copy), so a
    later program whose Linear is the model called (no path: its root) is not named by the
    earlier model's path."""
    _encoder_rows(Policy.preset("O1"), fresh_names=True)  # linear_0.w_0: layers.0.ffn there
    first = paddle.static.Program()
    with paddle.static.program_guard(first, paddle.static.Program()), \
            paddle.utils.unique_name.guard():
        _Encoder()(paddle.static.data("x", [4, 8], "float32"))
    eval_copy = first.clone()  # (PIR programs take no for_test)
    assert paddle_amp.layer_paths.path_of(eval_copy, "linear_0.w_0") == "layers.0.ffn"
    main, startup = paddle.static.Program(), paddle.static.Program()
    with paddle.static.program_guard(main, startup), paddle.utils.unique_name.guard():
        h = paddle.nn.Linear(8, 8)(paddle.static.data("x", [4, 8], "float32"))
        loss = paddle.mean(h)
    assert "linear_0.w_0" in {p.name for p in main.global_block().all_parameters()}
    assert paddle_amp.layer_paths.path_of(main, "linear_0.w_0") is None
    policy = Policy.preset("O1", paddle_layers=LayerLists(fp32={"layers.0.ffn"}))
    with paddle.static.program_guard(main, startup), paddle.utils.unique_name.guard():
        opt = paddle_amp.decorate(paddle.optimizer.SGD(0.1), emulate=True, policy=policy)
        with pytest.raises(AmpConfigError, match="'layers.0.ffn' matches no layer"):
            opt.minimize(loss)
