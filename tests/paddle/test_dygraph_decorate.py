"""paddle_amp.dygraph.decorate: the native's signature and O1 behaviour (models and
optimizers back as they are), every argument checked before anything is touched, at O2
too (the native casts the parameters first, then raises); the scaler's arguments checked
the same way."""
import numpy as np
import paddle
import pytest

from hypothesis import given, settings
from hypothesis import strategies as st

from amp_adapters.rules.errors import AmpConfigError
from paddle_amp import dygraph as amp


def _model_and_opt():
    paddle.seed(0)
    model = paddle.nn.Sequential(paddle.nn.Linear(4, 4), paddle.nn.LayerNorm(4))
    return model, paddle.optimizer.AdamW(parameters=model.parameters())


def _dtypes(model):
    return [str(p.dtype) for p in model.parameters()]


def test_o1_returns_what_it_was_given():
    model, opt = _model_and_opt()
    assert amp.decorate(model) is model
    m, o = amp.decorate(models=model, optimizers=opt, level="O1", save_dtype="float32")
    assert m is model and o is opt
    ms, os_ = amp.amp_decorate([model], [opt], "O1", "bfloat16")
    assert ms == [model] and os_ == [opt]


@pytest.mark.parametrize("kwargs, error, words", [
    (dict(level="O3"), AmpConfigError, "level"),
    (dict(dtype="float64"), AmpConfigError, "dtype"),
    (dict(save_dtype="int8"), AmpConfigError, "save_dtype"),
    (dict(master_weight="yes"), TypeError, "master_weight"),
    (dict(master_grad=1), TypeError, "master_grad"),
    (dict(excluded_layers=["Linear"]), AmpConfigError, "excluded_layers"),
    (dict(optimizers="adam"), AmpConfigError, "optimizers"),
    (dict(level="O2", save_dtype="int8"), AmpConfigError, "save_dtype"),
    (dict(level="O2", optimizers="adam"), AmpConfigError, "optimizers"),
    (dict(level="O2", optimizers=[None]), AmpConfigError, "optimizers"),
    (dict(level="O2", excluded_layers=[3]), AmpConfigError, "excluded_layers"),
    (dict(level="O2", master_grad="yes"), TypeError, "master_grad"),
    (dict(level="O2", dtype="bf16"), AmpConfigError, "dtype"),
    (dict(policy="O2-bf16", emulate=2), TypeError, "emulate"),
])
def test_a_bad_argument_is_refused_before_any_parameter_is_cast(kwargs, error, words):
    model, opt = _model_and_opt()
    before = [p.numpy().copy() for p in model.parameters()]
    dtypes = _dtypes(model)
    kwargs = {"optimizers": opt, **kwargs}
    with pytest.raises(error, match=words):
        amp.decorate(model, **kwargs)
    assert _dtypes(model) == dtypes
    assert all(np.array_equal(a, p.numpy()) for a, p in zip(before, model.parameters()))


def test_models_must_be_layers():
    with pytest.raises(AmpConfigError, match="models"):
        amp.decorate("model")


@pytest.mark.parametrize("kwargs, words", [
    (dict(incr_ratio=1.0), "incr_ratio"),
    (dict(decr_ratio=1.5), "decr_ratio"),
    (dict(incr_every_n_steps=0), "incr_every_n_steps"),
    (dict(init_loss_scaling="big"), "init_loss_scaling"),
    (dict(init_loss_scaling=-1.0), "init_loss_scaling"),
    (dict(use_dynamic_loss_scaling="no"), "use_dynamic_loss_scaling"),
    (dict(policy="O1", init_loss_scaling=8.0), "policy"),
])
def test_a_bad_scaler_argument_names_itself(kwargs, words):
    with pytest.raises((AmpConfigError, TypeError), match=words):
        amp.GradScaler(**kwargs)


# (None is no bad level or dtype: the default, the policy's own or the native's, as auto_cast)
_BAD = {"level": st.sampled_from(["o2", "O3", 2]),
        "dtype": st.sampled_from(["float32", "bf16", 16]),
        "master_weight": st.sampled_from(["no", 0, 1.0]),
        "save_dtype": st.sampled_from(["int8", "fp32", 32]),
        "master_grad": st.sampled_from([None, "true", 1]),
        "excluded_layers": st.sampled_from([["Linear"], 3, [paddle.nn.Linear, "x"]]),
        "optimizers": st.sampled_from(["adam", [None], 3])}


@settings(max_examples=25, deadline=None)
@given(bad=st.sampled_from(sorted(_BAD)).flatmap(
    lambda k: st.tuples(st.just(k), _BAD[k])), good_level=st.sampled_from(["O1", "O2"]))
def test_any_bad_argument_at_o2_leaves_the_parameters_and_optimizer_as_they_were(bad,
                                                                                  good_level):
    model, opt = _model_and_opt()
    before = [(p.numpy().copy(), p.dtype) for p in model.parameters()]
    kwargs = {"optimizers": opt, "level": good_level, "dtype": "bfloat16", **dict([bad])}
    with pytest.raises((AmpConfigError, TypeError)):
        amp.decorate(model, **kwargs)
    assert all(np.array_equal(a, p.numpy()) and d == p.dtype
               for (a, d), p in zip(before, model.parameters()))
    assert not hasattr(opt, "_amp_adapters_o2") and not opt._master_weights
