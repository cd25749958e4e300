"""Paddle's kernel questions (the static programs' kernel sets, eager mode's routes) are asked
in the measuring child and kept on disk (``amp_adapters.services.device_book``): the process
that trains never reads Paddle's kernel registry nor runs a oneDNN probe, whose memory would
stay resident there (issue 40), and the answers are the ones the probes give here.

Here, reading the registry and running a probe in this process fail; the answers must come
anyway, from the child, and equal what this process finds when it is let probe."""
import paddle
import pytest

from amp_adapters.rules.isa import bf16_class, machine
from amp_adapters.services import device_book, measure_process
from paddle_amp import ir, kernels
from paddle_amp.dygraph import kernels as eager
from paddle_helpers import pir_mode

pytestmark = pytest.mark.usefixtures("own_speed_cache")  # (the root conftest): a fresh book
BF16 = "bfloat16"


def _forget_static():
    """Every process cache of the static kernel questions, the private ones the answers are
    computed from included: a warm one would answer a fallback in this process without
    reading the registry or probing, whatever ran before in this worker."""
    for name in dir(kernels):
        if hasattr(getattr(kernels, name), "cache_clear"):
            getattr(kernels, name).cache_clear()


def test_static_kernel_sets_come_from_the_child_and_equal_this_processs(monkeypatch,
                                                                       child_asked):
    def refused(*args, **kw):
        pytest.fail("the kernel registry was read, or a probe run, in the training process")
    probe = ir.probe_named("pir" if pir_mode() else "legacy")  # the suite's IR
    _forget_static()
    with monkeypatch.context() as m:
        m.setattr(kernels, "_registered", refused)
        m.setattr(kernels, "runs_onednn_bf16", refused)
        m.setattr(kernels.core, "_get_all_register_op_kernels", refused)
        got = kernels.device_profile("CPU", BF16, probe, training=True)
    assert ("kernel_answers", "CPU", BF16, probe.name) in child_asked, child_asked
    assert {q[0] for q in child_asked} == {"kernel_answers"}, child_asked
    here = kernels.kernel_answers("CPU", BF16, probe)  # probed in this process
    assert got.kernels == frozenset(here["plain"]) | frozenset(here["onednn"])
    assert got.onednn == frozenset(here["onednn"])
    assert got.slow_broadcast_grads == frozenset(here["slow"])
    assert got.plain_casts_before == frozenset(here["plain_casts"])
    keys = list(device_book._read(device_book.book_path()))
    assert any(f" static {probe.name} CPU bfloat16" in k for k in keys), keys
    assert all(kernels.paddle_build() in k and paddle.version.commit in k and
               f"cuda={paddle.is_compiled_with_cuda()}" in k for k in keys), keys
    _forget_static()


def test_eager_routes_come_from_the_child_and_equal_this_processs(monkeypatch, child_asked):
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
    assert child_asked == [("eager_answers", BF16)]
    here = eager.eager_answers(BF16)  # probed in this process
    assert missing == here["missing"]
    assert got.kernels == frozenset(here["runs"])
    assert got.slow_broadcast_grads == frozenset(here["slow"])
    assert set(here["runs"]) | set(here["missing"]) == set(eager.ROUTES)
    keys = list(device_book._read(device_book.book_path()))
    assert any(f"{paddle.version.commit} cuda={paddle.is_compiled_with_cuda()}" in k
               and " eager bfloat16" in k for k in keys), keys


@pytest.mark.parametrize("kept", [{"runs": ["matmul_v2"], "missing": {}, "slow": []},
                                  {"missing": {}, "slow": []}])  # the former layout
def test_an_eager_route_the_answer_does_not_name_as_running_is_not_used(monkeypatch, kept):
    """What runs is what the probes ran: a route the answer does not name (one a later
    release added, or an answer of the former layout, which named only what failed) is
    never taken as working without being probed."""
    if bf16_class(machine()) == "none":
        pytest.skip("no eager bf16 route is asked on a CPU class without bf16")
    eager.forget()
    monkeypatch.setattr(measure_process, "call", lambda server, fn, *args: kept)
    try:
        assert eager.lowp_kernels(BF16) == frozenset(kept.get("runs", ()))
        assert eager.device_profile(BF16).kernels == frozenset(kept.get("runs", ()))
    finally:
        eager.forget()
