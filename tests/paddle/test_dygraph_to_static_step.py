"""A whole training step under ``paddle.jit.to_static`` (forward in our ``auto_cast``,
``backward``, the optimizer's step), as the training engines write one: the same losses
and parameters as the same step in eager mode, step after step (issue 39 point 3)."""
import numpy as np
import paddle
import pytest

from amp_adapters.rules.isa import bf16_class, machine
from paddle_amp import dygraph as amp

BF16 = bf16_class(machine()) != "none"


def _pir() -> bool:
    return bool(paddle.framework.use_pir_api()) if hasattr(paddle.framework, "use_pir_api") \
        else False


def _model():
    paddle.seed(0)
    return paddle.nn.Sequential(paddle.nn.Linear(16, 32), paddle.nn.ReLU(),
                                paddle.nn.Linear(32, 4))


def _data(step):
    rng = np.random.default_rng(step)
    return (paddle.to_tensor(rng.standard_normal((8, 16)).astype("f4")),
            paddle.to_tensor(rng.standard_normal((8, 4)).astype("f4")))


class Trainer(paddle.nn.Layer):
    """A training engine's step as one callable (a converted function reads its model and
    optimizer from ``self``: the AST translator does not see a closure's variables), with
    ``loss.backward()`` after the region or inside it (legal: eager mode's gradients are the
    same either way)."""

    def __init__(self, model, backward_inside=False):
        super().__init__()
        self.model, self.backward_inside = model, backward_inside
        self.opt = paddle.optimizer.Adam(1e-2, parameters=model.parameters())

    def forward(self, x, y):
        with amp.auto_cast(dtype="bfloat16"):
            loss = paddle.nn.functional.mse_loss(self.model(x), y)
            if self.backward_inside:
                loss.backward()
        if not self.backward_inside:
            loss.backward()
        self.opt.step()
        self.opt.clear_grad()
        return loss


PIR_REFUSES = pytest.mark.skipif(
    _pir(), reason="Paddle 3.3.1's PIR translator refuses backward() in a converted "
    "function, with or without AMP ('Value' has no attribute 'backward'): there a program "
    "is a forward (the forward-only tests)")


def _train_both(backward_inside: bool) -> list:
    """Three steps eagerly and as one converted function, from the same start: the same loss
    at each step and the same parameters after it. Returns the program's losses."""
    eager_model, static_model = _model(), _model()
    eager = Trainer(eager_model, backward_inside)
    static = paddle.jit.to_static(Trainer(static_model, backward_inside), full_graph=True)
    losses = []
    for s in range(3):
        x, y = _data(s)
        want, got = eager(x, y).numpy(), static(x, y).numpy()
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7, err_msg=f"step {s}")
        for (name, p), q in zip(eager_model.named_parameters(), static_model.parameters()):
            np.testing.assert_allclose(q.numpy(), p.numpy(), rtol=1e-5, atol=1e-6,
                                       err_msg=f"{name} after step {s}")
        losses.append(got)
    return losses


@PIR_REFUSES
def test_a_whole_train_step_under_to_static_trains_as_in_eager_mode():
    x0, y0 = _data(0)
    with paddle.no_grad():
        fp32 = paddle.nn.functional.mse_loss(_model()(x0), y0).numpy()
    losses = _train_both(backward_inside=False)
    # where this CPU class runs bf16 GEMMs the program lowered them as eager mode did: its
    # first loss is not float32's; elsewhere both stay float32 (the fallback, said once)
    assert (losses[0] != fp32) == BF16, (losses[0], fp32)


@PIR_REFUSES
def test_a_backward_inside_the_region_is_built_from_the_written_forward():
    # the region writes its ops before the backward is appended: gradients of the bf16
    # forward eager mode runs, not of a float32 one (once ~1e-3 off after a step, silently)
    from paddle.base import backward
    own = backward.append_backward
    _train_both(backward_inside=True)
    # nothing stays hooked once the regions closed: Paddle's own append_backward again
    assert backward.append_backward is own


class TrainerO2(paddle.nn.Layer):
    """An O2 engine's step (``decorate(level="O2")``: fp16 parameters, emulated on every CPU
    class, and float32 masters)."""

    def __init__(self):
        super().__init__()
        model = _model()
        opt = paddle.optimizer.SGD(0.5, parameters=model.parameters())
        self.model, self.opt = amp.decorate(model, opt, level="O2", dtype="float16",
                                            emulate=True)

    def forward(self, x, y):
        with amp.auto_cast(level="O2", dtype="float16", emulate=True):
            loss = paddle.nn.functional.mse_loss(self.model(x).astype("float32"), y)
        loss.backward()
        self.opt.step()
        self.opt.clear_grad()
        return loss


@PIR_REFUSES
def test_an_o2_step_under_to_static_is_refused_naming_what_works():
    """An O2 optimizer's float32 masters are eager state: its step inside a program being
    built is refused with a clear error (it crashed the process in Paddle's eager cast), and
    the same step runs eagerly after it."""
    from amp_adapters.rules.errors import AmpConfigError
    from paddle_amp.dygraph import frames
    x, y = _data(0)
    trainer = TrainerO2()
    with pytest.raises(AmpConfigError, match=r"optimizer.step\(\) of an O2-decorated "
                       r"optimizer inside paddle.jit.to_static.*outside it"):
        paddle.jit.to_static(trainer, full_graph=True)(x, y)
    assert frames.current() is None
    assert np.isfinite(TrainerO2()(x, y).numpy())
