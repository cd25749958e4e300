"""init / reset: validation before patching, clear errors, a complete undo, numpy ops patched."""
import sys

import numpy as np
import pytest
import mxnet as mx
from mxnet import gluon

import mxnet_amp as amp
from amp_adapters import AmpConfigError, ConflictingOpError, Policy, UnknownOpError
from mxnet_testutil import batch, mlp

_PREFIXES = ("mxnet.ndarray", "mxnet.symbol", "mxnet.numpy", "mxnet.numpy_extension")


def _op_functions():
    return {(name, attr): value for name, mod in list(sys.modules.items())
            if mod is not None and name.startswith(_PREFIXES)
            for attr, value in list(vars(mod).items()) if callable(value)}


def test_reset_undoes_init_completely():
    before = _op_functions()
    amp.init(policy="O1")  # the shared lists name the mx.np/npx ops (the native's do not)
    patched = {k for k, v in _op_functions().items() if before.get(k) is not v}
    assert {("mxnet.ndarray", "FullyConnected"), ("mxnet.symbol", "FullyConnected"),
            ("mxnet.numpy", "matmul"), ("mxnet.numpy.multiarray", "matmul"),
            ("mxnet.numpy_extension", "fully_connected"), ("mxnet.ndarray", "softmax"),
            ("mxnet.symbol.numpy", "exp")} <= patched
    amp.reset()
    assert _op_functions() == before
    assert amp.active_policy() is None


def test_unknown_op_is_named_and_nothing_is_patched():
    before = _op_functions()
    with pytest.raises(UnknownOpError, match="'FullyConected'.*Did you mean 'FullyConnected'"):
        amp.init(fp32_ops=["FullyConected"])
    assert _op_functions() == before and amp.active_policy() is None
    assert amp.init(fp32_ops=["FullyConnected"]).mxnet_ops.fp32 == {"FullyConnected"}


def test_op_in_two_lists_is_named():
    with pytest.raises(ConflictingOpError, match="'relu'.*fp32, lower"):
        amp.init(target_precision_ops=["relu"], fp32_ops=["relu"])
    assert amp.active_policy() is None
    amp.init(target_precision_ops=["relu"])
    # as natively, the list replaces the default low list (FullyConnected leaves it) and only
    # that one: the default fp32 list stays
    assert amp.list_lp16_ops("float16") == ["relu"]
    assert "softmax" in amp.list_fp32_ops("float16")


def test_each_list_argument_replaces_the_default_list_it_names():
    from mxnet.contrib import amp as native  # what mxnet.contrib.amp.init does with them
    amp.init(target_precision_ops=["Convolution"])
    assert amp.list_lp16_ops("float16") == ["Convolution"]  # FullyConnected is out
    assert amp.list_fp32_ops("float16") == sorted(native.list_fp32_ops("float16"))
    assert amp.list_widest_type_cast("float16") == sorted(native.list_widest_type_cast("float16"))
    assert amp.list_conditional_fp32_ops("float16") == native.list_conditional_fp32_ops("float16")
    fc = mx.sym.FullyConnected(mx.sym.var("x"), num_hidden=2, name="fc")
    assert "amp_cast" not in fc.tojson(remove_amp_cast=False)  # no cast: it follows its input
    amp.reset()
    amp.init(fp32_ops=["softmax"])
    assert amp.list_fp32_ops("float16") == ["softmax"]
    assert "FullyConnected" in amp.list_lp16_ops("float16")  # the low list keeps its default
    amp.reset()
    rule = ("Activation", "act_type", ["relu"])
    amp.init(conditional_fp32_ops=[rule])
    assert amp.list_conditional_fp32_ops("float16") == [rule]
    x = mx.nd.ones((2, 2), dtype="float16")
    assert mx.nd.Activation(x, act_type="softrelu").dtype == np.float16  # the default rule went
    assert mx.nd.Activation(x, act_type="relu").dtype == np.float32


def test_a_listed_op_wins_over_a_default_list_the_user_did_not_pass():
    amp.init(target_precision_ops=["softmax"])  # softmax is in the default fp32 list
    assert "softmax" in amp.list_lp16_ops("float16")
    assert "softmax" not in amp.list_fp32_ops("float16")
    x = mx.nd.ones((2, 2))
    assert mx.nd.softmax(x).dtype == np.float16  # softmax has a float16 CPU kernel


def test_second_init_with_another_policy_is_an_error():
    amp.init()
    amp.init()  # the same policy again: fine
    with pytest.raises(AmpConfigError, match="different policy.*reset"):
        amp.init(target_dtype="bfloat16")
    amp.reset()
    assert amp.init(target_dtype="bfloat16").dtype == "bfloat16"


def test_explicit_policy_wins_and_lists_with_it_are_refused(tmp_path):
    assert amp.init("float16", policy="O1-bf16").dtype == "bfloat16"
    amp.reset()
    path = tmp_path / "policy.toml"
    path.write_text('preset = "O1"\n[ops.mxnet]\nfp32 = ["dot"]\n')
    assert "dot" in amp.init(policy=str(path)).mxnet_ops.fp32
    amp.reset()
    with pytest.raises(AmpConfigError, match="not both"):
        amp.init(fp32_ops=["dot"], policy=Policy())
    with pytest.raises(UnknownOpError, match="'dott'"):
        amp.init(policy=Policy(mxnet_ops=amp.Policy().mxnet_ops.__class__(fp32={"dott"})))


def test_target_dtype_spellings_and_emulate_are_the_core_rules():
    """init and the list helpers read target_dtype through the core vocabulary; ``emulate=``
    merges into a policy as the core says (it adds, it never removes)."""
    assert amp.list_lp16_ops("fp16") == amp.list_lp16_ops(np.float16) == \
        amp.list_lp16_ops("float16")
    with pytest.raises(AmpConfigError, match="unknown target_dtype 'float32'"):
        amp.list_fp32_ops("float32")
    assert amp.init(target_dtype="bf16").dtype == "bfloat16"
    amp.reset()
    # without policy= the native lists (issue 14): mxnet-native, not the shared O1
    assert amp.init(np.float16, emulate=True) == \
        Policy.preset("mxnet-native").with_emulation(True)
    amp.reset()
    assert amp.init(policy=Policy(emulate=True), emulate=False).emulate


def test_trainer_api_errors_name_the_problem():
    net = mlp()
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1})
    with pytest.raises(TypeError, match="Trainer, got SGD"):
        amp.init_trainer(mx.optimizer.SGD())
    with pytest.raises(TypeError, match="Trainer, got list"):
        amp.init_trainer([trainer])
    x, y = batch(0)
    with pytest.raises(RuntimeError, match="init_trainer"):
        with amp.scale_loss(net(x), trainer):
            pass
    with pytest.raises(RuntimeError, match="init_trainer"):
        amp.unscale(trainer)
    with pytest.raises(AmpConfigError, match="loss_scale must be"):
        amp.init_trainer(trainer, "dynamic")
    amp.init_trainer(trainer)
    with amp.scale_loss(net(x), trainer) as scaled:
        assert np.allclose(scaled.asnumpy(), net(x).asnumpy() * 2.0**16)


def test_numpy_ops_are_patched_imperative_and_hybridized():
    amp.init(policy="O1")  # the shared lists name the mx.np/npx ops (the native's do not)
    mx.npx.set_np()
    a = mx.np.ones((2, 2), dtype="float16")
    out = a @ a  # no float16 GEMM on CPU: runs in float32 instead of failing
    assert out.dtype == np.float32 and float(out[0, 0]) == 2.0
    assert mx.np.exp(a).dtype == np.float32  # fp32 op
    assert (a + mx.np.ones((2, 2))).dtype == np.float32  # promote: the widest wins
    assert mx.npx.relu(a).dtype == np.float16  # follow
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Dense(3, in_units=4))
    net.initialize()
    net.hybridize()
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1})
    amp.init_trainer(trainer)
    x = mx.np.ones((2, 4))
    with mx.autograd.record():
        with amp.scale_loss(net(x).sum(), trainer) as scaled:
            scaled.backward()
    trainer.step(2)
    report = amp.cast_report(net)
    assert [d.op for d in report.decisions] == ["FullyConnected"]
    assert report.decisions[0].run_dtype == "float32"


def _softmax_output_update(use_amp: bool, hybrid_warning: bool = False) -> float:
    """One SGD step through an imperative SoftmaxOutput (a loss-output op: it makes its own
    gradient, scaled by grad_scale, and ignores the head gradient), as MXNet's AMP
    tutorial's users write it: the norm of the update."""
    from mxnet import autograd, nd
    w = gluon.Parameter("w", shape=(8, 3))
    w.initialize(mx.init.Constant(0.1))
    trainer = gluon.Trainer([w], "sgd", {"learning_rate": 1.0})
    if use_amp:
        amp.init_trainer(trainer, amp.DynamicLossScale(scale=2.0 ** 16))
    x = nd.array(np.random.RandomState(0).randn(4, 8))
    y = nd.array([0, 1, 2, 0])
    start = w.data().copy()
    with autograd.record():
        out = nd.SoftmaxOutput(nd.dot(x, w.data()), y)
        if use_amp:
            with amp.scale_loss(out, trainer) as scaled:
                autograd.backward(scaled)
        else:
            out.backward()
    trainer.step(4)
    return float(nd.norm(w.data() - start).asscalar())


def test_a_loss_output_op_gets_the_loss_scale_in_its_grad_scale(caplog):
    """Natively init multiplies the grad_scale of SoftmaxOutput & co by the (first) trainer's
    loss scale, which the trainer divides out again; without it, updates came out 65536
    times too small, silently. In a symbol it cannot, and says so once, as natively."""
    fp32 = _softmax_output_update(use_amp=False)
    amp.init(target_dtype="float16", fp32_ops=["dot"])  # dot: no float16 kernel on a CPU
    assert _softmax_output_update(use_amp=True) == pytest.approx(fp32, rel=1e-6)
    with caplog.at_level("WARNING", logger="mxnet_amp"):
        mx.sym.SoftmaxOutput(mx.sym.var("x"), mx.sym.var("y"))
        mx.sym.SoftmaxOutput(mx.sym.var("x"), mx.sym.var("y"))
    assert sum("SoftmaxOutput does not support dynamic loss scaling" in r.getMessage()
               for r in caplog.records) == 1
    amp.reset()
    assert mx.nd.SoftmaxOutput.__name__ == "SoftmaxOutput"
    assert _softmax_output_update(use_amp=False) == fp32
