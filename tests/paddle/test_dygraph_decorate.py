"""paddle_amp.dygraph.decorate: the native's signature and O1 behaviour (models and
optimizers back as they are), every argument checked before anything is touched, O2 refused
(not built yet) with nothing cast; the scaler's arguments checked the same way."""
import numpy as np
import paddle
import pytest

from amp_adapters.errors import AmpConfigError, NotSupportedError
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
    (dict(level="O2"), NotSupportedError, "not built yet"),
    (dict(policy="O2-bf16"), NotSupportedError, "not built yet"),
])
def test_a_bad_or_unbuilt_argument_is_refused_before_any_parameter_is_cast(kwargs, error, words):
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
