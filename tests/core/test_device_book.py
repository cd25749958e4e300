"""``amp_adapters.services.device_book``: a backend's kernel answers asked in its measuring
child once per machine, framework build and project version, kept on disk, and exact (asked
here, with a warning, where the child gives no answer). The child is the core's own ``measure_process.call``, replaced here by
a recorder that answers as the question would (no framework involved)."""
import json
import string

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from amp_adapters.services import device_book, measure_process, speedbook

pytestmark = pytest.mark.usefixtures("own_speed_cache")  # (the root conftest)


def kernels_here(dtype):
    """A question's own answer (what a backend's child would run)."""
    return {"kernels": sorted({"matmul_v2", "relu"} if dtype == "bfloat16" else {"cast"})}


@pytest.fixture
def asked(monkeypatch):
    """The questions sent to the measuring child, answered as ``fn`` answers."""
    sent = []

    def call(server, fn, *args):
        sent.append((server, fn.__name__, args))
        return fn(*args)
    monkeypatch.setattr(measure_process, "call", call)
    return sent


def ask(dtype="bfloat16", version="1.0"):
    return device_book.answer("fw", version, f"kernels {dtype}", "fw.child", kernels_here,
                              dtype)


def test_an_answer_is_asked_in_the_child_once_per_machine_and_version_then_read(asked):
    assert ask() == kernels_here("bfloat16")
    assert ask() == kernels_here("bfloat16")  # from the disk
    assert asked == [("fw.child", "kernels_here", ("bfloat16",))]
    assert ask(version="2.0") == kernels_here("bfloat16")  # another version: asked again
    assert ask("float16") == kernels_here("float16")
    assert len(asked) == 3
    kept = json.loads(device_book.book_path().read_text())
    assert kept["answers"][device_book.key_of("fw", "1.0", "kernels bfloat16")] == \
        kernels_here("bfloat16")


def test_another_project_version_asks_again(asked, monkeypatch):
    """The answers come from this project's probes (its code): a release asks again."""
    ask()
    monkeypatch.setattr(device_book, "__version__", "99.0.0")
    assert ask() == kernels_here("bfloat16")
    assert len(asked) == 2


def test_a_file_of_the_former_format_is_asked_again(asked):
    """Format 1 keyed the framework's version only: its answers may be another build's or
    another release's of this project, so they are not read."""
    path = device_book.book_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"format": 1, "machine": {}, "answers": {
        "fw 1.0 kernels bfloat16": {"kernels": ["stale"]}}}))
    assert ask() == kernels_here("bfloat16")
    assert len(asked) == 1


def test_each_simulated_cpu_class_has_its_own_answers(asked, monkeypatch):
    """Keyed as the speed book is: the class (and its oneDNN limits) is the machine's."""
    monkeypatch.setenv("AMP_ADAPTERS_CPU", "avx2")
    avx2 = device_book.book_path()
    ask()
    monkeypatch.setenv("AMP_ADAPTERS_CPU", "avx512_core")
    assert device_book.book_path() != avx2
    ask()
    assert len(asked) == 2


def test_a_child_without_an_answer_leaves_the_question_to_this_process(monkeypatch, caplog):
    """It died or could not start: asked here, exactly, with a warning once per process
    naming why (what the question loads then stays resident here); it raised there: it
    raises here."""
    monkeypatch.setattr(speedbook, "_warned", set())

    def dead(server, fn, *args):
        raise measure_process.ChildFailed("the measuring process ended (signal SIGKILL)")
    monkeypatch.setattr(measure_process, "call", dead)
    with caplog.at_level("WARNING", logger="amp_adapters"):
        assert ask() == kernels_here("bfloat16")
        assert ask("float16") == kernels_here("float16")
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warned) == 1, warned
    assert "the measuring process gave no answer" in warned[0]
    assert "signal SIGKILL" in warned[0] and "stays resident here" in warned[0]

    def refused(dtype):
        raise ValueError(f"no such dtype {dtype}")

    def raised_there(server, fn, *args):
        raise measure_process.MeasureError("ValueError: no such dtype x")
    monkeypatch.setattr(measure_process, "call", raised_there)
    with pytest.raises(ValueError, match="no such dtype x"):
        device_book.answer("fw", "1.0", "bad", "fw.child", refused, "x")


def test_an_unwritable_directory_still_answers(asked, monkeypatch, tmp_path, caplog):
    """The answer is kept for this process only, and a warning says where and what to do."""
    monkeypatch.setattr(speedbook, "_warned", set())
    blocked = tmp_path / "file"
    blocked.write_text("")
    monkeypatch.setenv("AMP_ADAPTERS_CACHE", str(blocked / "cache"))  # under a file
    with caplog.at_level("WARNING", logger="amp_adapters"):
        assert ask() == kernels_here("bfloat16")
    assert f"cannot keep the device answers in {blocked / 'cache'}" in caplog.text
    assert "set AMP_ADAPTERS_CACHE to a writable directory" in caplog.text


@settings(max_examples=30, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.one_of(st.text(string.printable, max_size=40),
                 st.recursive(st.none() | st.integers() | st.text(max_size=5),
                              lambda c: st.lists(c, max_size=3)
                              | st.dictionaries(st.sampled_from(["format", "answers", "x"]), c,
                                                max_size=3), max_leaves=6).map(json.dumps)))
def test_a_broken_file_is_asked_again_and_rewritten(asked, text):
    path = device_book.book_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    assert ask() == kernels_here("bfloat16")
    assert json.loads(path.read_text())["answers"][
        device_book.key_of("fw", "1.0", "kernels bfloat16")] == kernels_here("bfloat16")


def test_a_measuring_child_answers_itself_and_never_waits_on_its_parents_lock(monkeypatch):
    """In the child (``measure_process.serve``), a question that reaches the book again is
    answered there: its parent holds the file's lock while it waits for the child."""
    monkeypatch.setattr(measure_process, "serving", True)
    monkeypatch.setattr(measure_process, "call", lambda *a: pytest.fail("asked a child"))
    assert ask() == kernels_here("bfloat16")
    assert not device_book.book_path().exists()  # nothing kept by a child
