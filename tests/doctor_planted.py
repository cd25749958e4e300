"""The planted models of the doctor's tests, loaded by path from the test files: the numpy
weights and data of ``amp_demo.doctor_models`` (also what ``amp-adapters doctor`` runs), and
the framework builders from the demo's trainers, imported only when asked."""
from amp_demo.doctor_models import B, D, FACTOR, H, KINDS, PLANTED_CANONICAL, arrays, policy  # noqa: F401
from amp_demo.doctor_models import LAYERED, layered_arrays  # noqa: F401


def mxnet_layered(kind, hybridize=True):
    from amp_demo.mxnet_trainer import layered_model
    return layered_model(kind, hybridize)


def mxnet_model(kind, hybridize=True):
    from amp_demo.mxnet_trainer import doctor_model
    return doctor_model(kind, hybridize)


def paddle_model(kind, policy=None, optimizer=None):
    from amp_demo.paddle_trainer import doctor_program
    return doctor_program(kind, policy, optimizer)


def paddle_feed(kind, step):
    from amp_demo.paddle_trainer import doctor_feed
    return doctor_feed(kind, step)


def paddle_layered(kind, policy=None, optimizer=None):
    from amp_demo.paddle_trainer import layered_program
    return layered_program(kind, policy, optimizer)


def paddle_layered_feed(kind, step):
    from amp_demo.paddle_trainer import layered_feed
    return layered_feed(kind, step)
