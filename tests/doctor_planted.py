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
