"""Paddle's kernel questions (the static programs' kernel sets, eager mode's routes) are asked
in the measuring child and kept on disk (``amp_adapters.services.device_book``): the process
that trains never reads Paddle's kernel registry nor runs a oneDNN probe, whose memory would
stay resident there (issue 40), and the answers are the ones the probes give here.

Here, reading the registry and running a probe in this process fail; the answers must come
anyway, from the child, and equal what this process finds when it is let probe."""
import pytest

from amp_adapters.rules.isa import bf16_class, machine
from amp_adapters.services import device_book
from paddle_amp import ir, kernels
from paddle_amp.dygraph import kernels as eager
from paddle_helpers import pir_mode

pytestmark = pytest.mark.usefixtures("own_speed_cache")  # (the root conftest): a fresh book
BF16 = "bfloat16"


def _forget_static():
    for f in (kernels.lowp_kernels, kernels.plain_kernels, kernels.onednn_kernels,
              kernels.slow_broadcast_grads, kernels.plain_cast_readers,
              getattr(kernels, "_answers", None)):
        if hasattr(f, "cache_clear"):
            f.cache_clear()


def test_static_kernel_sets_come_from_the_child_and_equal_this_processs(monkeypatch):
    def refused(*args, **kw):
        pytest.fail("the kernel registry was read, or a probe run, in the training process")
    probe = ir.probe_named("pir" if pir_mode() else "legacy")  # the suite's IR
    _forget_static()
    with monkeypatch.context() as m:
        m.setattr(kernels, "_registered", refused)
        m.setattr(kernels, "runs_onednn_bf16", refused)
        m.setattr(kernels.core, "_get_all_register_op_kernels", refused)
        got = kernels.device_profile("CPU", BF16, probe, training=True)
    here = kernels.kernel_answers("CPU", BF16, probe)  # probed in this process
    assert got.kernels == frozenset(here["plain"]) | frozenset(here["onednn"])
    assert got.onednn == frozenset(here["onednn"])
    assert got.slow_broadcast_grads == frozenset(here["slow"])
    assert got.plain_casts_before == frozenset(here["plain_casts"])
    assert any(f" static {probe.name} CPU bfloat16" in k
               for k in device_book._read(device_book.book_path()))
    _forget_static()


def test_eager_routes_come_from_the_child_and_equal_this_processs(monkeypatch):
    eager.forget()
    with monkeypatch.context() as m:
        m.setattr(eager, "_probe", lambda *a, **kw: pytest.fail(
            "an eager oneDNN probe ran in the training process"))
        got = eager.device_profile(BF16)
        missing = eager.missing_routes(BF16)
    eager.forget()
    if bf16_class(machine()) == "none":  # the device truth answers, nothing is asked
        assert not got.kernels and not missing
        return
    here = eager.eager_answers(BF16)  # probed in this process
    assert missing == here["missing"]
    assert got.kernels == frozenset(set(eager.ROUTES) - set(here["missing"]))
    assert got.slow_broadcast_grads == frozenset(here["slow"])
