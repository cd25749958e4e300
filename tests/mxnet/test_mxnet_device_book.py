"""MXNet's kernel questions (which ops run in bf16/fp16 on the CPU, forward and backward, and
whether the fused multi-precision update does) are asked in the measuring child and kept on
disk (``amp_adapters.services.device_book``): the process that trains runs no probe, whose
oneDNN primitives and freed memory would stay resident there (issue 40: +15 MiB in every
step's peak), and the answers are the ones the probes give here.

Here, running a probe in this process fails; the answers must come anyway, from the child
(one question for the batch, one for an op outside it), and equal what this process finds
when it is let probe."""
import mxnet as mx
import pytest

from amp_adapters.services import device_book, measure_process
from mxnet_amp import kernels

pytestmark = pytest.mark.usefixtures("own_speed_cache")  # (the root conftest): a fresh book
BF16 = "bfloat16"
OUTSIDE = "elemwise_add"  # a generic op a policy may ask about: no recipe, not lowered natively


@pytest.fixture
def fresh_answers():
    """This process's answers dropped before and after (a warm cache answers without asking)."""
    kernels.forget()
    yield
    kernels.forget()


def _refused(*args, **kw):
    pytest.fail("a kernel probe ran in the training process")


def test_kernel_answers_come_from_the_child_and_equal_this_processs(monkeypatch, child_asked,
                                                                    fresh_answers):
    assert OUTSIDE not in kernels.batch_ops(BF16)
    cpu = mx.cpu()
    with monkeypatch.context() as m:
        m.setattr(kernels, "_runs", _refused)
        got = {op: (kernels.has_kernel(op, cpu, BF16), kernels.has_kernel(op, cpu, BF16, True))
               for op in kernels.batch_ops(BF16)}
        table = kernels.lowp_kernels("CPU", BF16)
        mp_update = kernels.has_mp_update(cpu, BF16)
        outside = (kernels.has_kernel(OUTSIDE, cpu, BF16),
                   kernels.has_kernel(OUTSIDE, cpu, BF16, backward=True))
    # one question for the whole batch (has_mp_update's answer in it), one for the op outside
    assert child_asked == [("kernel_answers", BF16), ("kernel_answers", BF16, [OUTSIDE])]
    here = kernels.kernel_answers(BF16)  # probed in this process
    assert got == {op: (here["forward"][op], here["backward"][op]) for op in here["forward"]}
    assert table == frozenset(op for op, ok in here["backward"].items() if ok)
    assert mp_update == here["mp_update"]
    alone = kernels.kernel_answers(BF16, [OUTSIDE])
    assert outside == (alone["forward"][OUTSIDE], alone["backward"][OUTSIDE])
    keys = list(device_book._read(device_book.book_path()))
    assert sorted(keys) == sorted(device_book.key_of("mxnet", kernels.mxnet_build(), q) for q in
                                  (f"kernels cpu {BF16}", f"kernels cpu {BF16} op {OUTSIDE}"))
    assert mx.__version__ in kernels.mxnet_build()
    assert f"cuda={mx.runtime.Features().is_enabled('CUDA')}" in kernels.mxnet_build()


def test_a_second_process_reads_the_book_and_asks_nothing(monkeypatch, child_asked,
                                                         fresh_answers):
    """Once kept, the answers are read from disk: no child, no probe (a process asks once)."""
    kernels.has_kernel("Convolution", mx.cpu(), BF16, backward=True)
    assert child_asked == [("kernel_answers", BF16)]
    want = kernels.kernel_answers(BF16, ["Convolution"])["backward"]["Convolution"]  # here
    kernels.forget()  # as a new process: only the book is left
    with monkeypatch.context() as m:
        m.setattr(kernels, "_runs", _refused)
        m.setattr(measure_process, "call", lambda *a: pytest.fail("the child was asked again"))
        assert kernels.has_kernel("Convolution", mx.cpu(), BF16, backward=True) == want


def test_an_op_a_kept_batch_does_not_name_is_probed_not_assumed(monkeypatch, fresh_answers):
    """A kept answer of another batch (a recipe added since) leaves the op unanswered: it is
    asked on its own, never taken as running (or not) without a probe."""
    asked = []

    def kept(server, fn, *args):
        asked.append(args)
        return {"forward": {}, "backward": {}, "mp_update": False} if len(args) == 1 else \
            kernels.kernel_answers(*args)
    monkeypatch.setattr(measure_process, "call", kept)
    want = kernels.kernel_answers(BF16, ["FullyConnected"])["backward"]["FullyConnected"]
    assert kernels.has_kernel("FullyConnected", mx.cpu(), BF16, backward=True) == want
    assert asked == [(BF16,), (BF16, ["FullyConnected"])]


def test_where_the_child_gives_no_answer_it_is_asked_here_with_a_warning(monkeypatch,
                                                                         fresh_answers):
    def dead(server, fn, *args):
        raise measure_process.ChildFailed("the measuring child could not start (test)")
    monkeypatch.setattr(measure_process, "call", dead)
    warned = []
    monkeypatch.setattr(device_book, "warn_once", lambda key, msg: warned.append(msg))
    got = kernels.has_kernel("FullyConnected", mx.cpu(), BF16, backward=True)
    assert got == kernels.kernel_answers(BF16, ["FullyConnected"])["backward"]["FullyConnected"]
    assert len(warned) == 1 and "gave no answer" in warned[0], warned
