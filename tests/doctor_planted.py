"""The planted models of the doctor's tests, loaded by path from the test files: the numpy
weights and data of ``amp_demo.doctor_models`` (also what ``amp-adapters doctor`` runs), and
the framework builders from the demo's trainers, imported only when asked."""
from amp_demo.doctor_models import B, D, FACTOR, H, KINDS, PLANTED_CANONICAL, arrays, policy  # noqa: F401
from amp_demo.doctor_models import LAYERED, layered_arrays  # noqa: F401


def mxnet_layered(kind, hybridize=True, named=True):
    from amp_demo.mxnet_trainer import layered_model
    return layered_model(kind, hybridize, named)


def mxnet_model(kind, hybridize=True):
    from amp_demo.mxnet_trainer import doctor_model
    return doctor_model(kind, hybridize)


def paddle_model(kind, policy=None, optimizer=None):
    from amp_demo.paddle_trainer import doctor_program
    return doctor_program(kind, policy, optimizer)


def paddle_feed(kind, step):
    from amp_demo.paddle_trainer import doctor_feed
    return doctor_feed(kind, step)


def paddle_layered(kind, policy=None, optimizer=None, layers=False):
    from amp_demo.paddle_trainer import layered_program
    return layered_program(kind, policy, optimizer, layers)


def paddle_layered_feed(kind, step):
    from amp_demo.paddle_trainer import layered_feed
    return layered_feed(kind, step)


def check_scale_only_fix(rep, rec):
    """What every framework's doctor says of the planted backward-only overflow at scale
    2**16 with a finite forward: the fix is the loss scale, no op and no layer moves, and
    the replay verified it."""
    assert rep.steps[0].scale == 2 ** 16 and not any(s.first_forward for s in rep.steps)
    assert rep.findings()[0].kind == "backward_overflow"
    before = policy("layer_backward")
    assert rec.policy.replace(loss_scale=before.loss_scale) == before  # no op, no layer moves
    assert rec.policy.loss_scale.scale < 2 ** 15 and rec.verified
    assert rec.keeps == ("no op moves: every op that ran fp16 still does",)


def paddle_dygraph_model(kind):
    from amp_demo.paddle_dygraph_trainer import doctor_model
    return doctor_model(kind)


def paddle_dygraph_layered(kind):
    """(model, loss_fn) of a ``LAYERED`` doctor model in eager mode, as a user writes it: a
    ``paddle.nn.Sequential`` of four ``Linear`` with a ``LayerNorm`` after the third (paths
    ``0``, ``1``, ``2``, ``3`` the norm, ``4``), and its loss as a Layer."""
    import paddle
    from amp_demo.doctor_models import LAYERED_FACTOR, NORM_AFTER
    paddle.disable_static()
    _, _, weights = layered_arrays(kind)
    blocks = []
    for i, (w, b) in enumerate(weights):
        linear = paddle.nn.Linear(w.shape[0], w.shape[1])
        linear.weight.set_value(w)
        linear.bias.set_value(b)
        blocks.append(linear)
        if i == NORM_AFTER:
            blocks.append(paddle.nn.LayerNorm(w.shape[1]))

    class Loss(paddle.nn.Layer):
        def forward(self, pred, label):
            d = pred - label
            return paddle.mean(d * d) * LAYERED_FACTOR[kind]

    return paddle.nn.Sequential(*blocks), Loss()


def paddle_dygraph_steps(kind, model, loss_fn, opt, scaler, policy, steps):
    """``steps`` of a user's eager loop (``amp_demo``'s ``engine_steps``) on ``kind``'s
    layered batches."""
    from amp_demo.paddle_dygraph_trainer import engine_steps
    engine_steps(model, loss_fn, opt, scaler, policy,
                 (layered_arrays(kind, s)[:2] for s in range(steps)))
