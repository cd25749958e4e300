"""The measuring child process: a call runs in another process with this one's environment and
path, answers its result (a ``Cost`` included), raises what failed there, survives what a
framework prints, and a child that dies fails one call, names how, and is replaced."""
import copy
import math
import os
import sys
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from amp_adapters.services import measure_process
from amp_adapters.rules.device import Cost
from amp_adapters.services.measure_process import MeasureError
from amp_adapters.services.measure_process import call as call_in
from amp_adapters.rules.isa import ISA_ENV
from amp_adapters.services.speedbook import MeasuringFailed


SERVER = "measure_child_fns"  # this folder's child module


def call(fn, *args):
    return call_in(SERVER, fn, *args)


@pytest.fixture(autouse=True)
def own_children():
    measure_process.close_all()
    yield
    measure_process.close_all()


def test_a_call_runs_in_another_process_which_is_kept():
    child = call(os.getpid)
    assert child != os.getpid()
    assert call(os.getpid) == child  # one child per environment, kept between calls


def test_the_child_has_this_process_environment(monkeypatch):
    monkeypatch.setenv("AMP_ADAPTERS_TEST_MARK", "here")
    assert call(os.getenv, "AMP_ADAPTERS_TEST_MARK") == "here"


def test_a_onednn_limit_set_later_gets_its_own_child(monkeypatch):
    """A child measures under the ISA limits of the moment (what its timings are keyed by)."""
    monkeypatch.delenv(ISA_ENV[1], raising=False)
    first = call(os.getpid)
    # below every class AMP_ADAPTERS_CPU can simulate, so a new limit under one too
    monkeypatch.setenv(ISA_ENV[1], "SSE41")
    assert call(os.getenv, ISA_ENV[1]) == "SSE41"
    assert call(os.getpid) != first


def test_a_cost_comes_back_as_a_cost():
    got = call(Cost, 1.5, 0.01, 2.0, 0.02)
    assert got == Cost(forward=1.5, forward_spread=0.01, train=2.0, train_spread=0.02)


def test_an_exception_there_raises_here_with_its_type_and_message():
    with pytest.raises(MeasureError, match=r"ValueError: math domain error"):
        call(math.sqrt, -1)
    assert call(math.sqrt, 4) == 2.0  # the child lives on


def test_what_the_measured_code_prints_does_not_break_the_answers():
    assert call(print, "a line a framework prints on stdout") is None
    assert call(math.sqrt, 9) == 3.0


@pytest.mark.parametrize("how, said", [(os.abort, "signal SIGABRT"),
                                       (os._exit, "exit code 3")])
def test_a_child_that_dies_fails_the_call_and_the_next_call_gets_a_new_one(how, said):
    before = call(os.getpid)
    with pytest.raises(MeasureError, match=f"the measuring process ended \\({said}\\)"):
        call(how, *([3] if how is os._exit else []))
    assert call(os.getpid) != before


def test_the_last_line_a_dying_child_printed_is_in_the_error():
    call(print, "terminate called after throwing an instance of 'dnnl::error'")
    with pytest.raises(MeasureError, match=r"SIGABRT\): terminate called after throwing"):
        call(os.abort)


def test_a_child_that_does_not_answer_is_ended_and_named(monkeypatch):
    patience = measure_process.ANSWER_TIMEOUT_S
    monkeypatch.setattr(measure_process, "ANSWER_TIMEOUT_S", 0.5)
    with pytest.raises(MeasureError, match=r"did not answer in 0.5 s"):
        call(time.sleep, 30)
    # a new child, given the usual time to start (on a loaded machine more than 0.5 s)
    monkeypatch.setattr(measure_process, "ANSWER_TIMEOUT_S", patience)
    assert call(math.sqrt, 16) == 4.0


@settings(max_examples=20, deadline=None)
@given(st.recursive(st.none() | st.booleans() | st.integers(-2**40, 2**40) |
                    st.text(max_size=20),
                    lambda inner: st.lists(inner, max_size=4) |
                    st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=12))
def test_json_values_make_the_round_trip(value):
    """Arguments and results are JSON values: what goes in comes back (``copy.copy`` there)."""
    assert call(copy.copy, value) == value


def test_the_op_failing_is_an_answer_the_measuring_failing_is_not(monkeypatch):
    """What raised there, or crashed the child (SIGABRT), is the op's answer
    (``MeasureError``); a child that ended otherwise, did not answer or could not start is a
    failure of the measuring (``MeasuringFailed``), which the speed book does not keep as
    "no kernel"."""
    for fn, args in ((math.sqrt, (-1,)), (os.abort, ())):
        with pytest.raises(MeasureError) as op_failed:
            call(fn, *args)
        assert not isinstance(op_failed.value, MeasuringFailed)
    assert "SIGABRT" in str(op_failed.value)
    with pytest.raises(MeasuringFailed, match="exit code 3"):
        call(os._exit, 3)
    monkeypatch.setattr(measure_process, "ANSWER_TIMEOUT_S", 0.5)
    with pytest.raises(MeasuringFailed, match="did not answer"):
        call(time.sleep, 30)
    measure_process.close_all()
    monkeypatch.setattr(sys, "executable", "/nonexistent/python")
    with pytest.raises(MeasuringFailed, match="could not start.*nonexistent"):
        call(os.getpid)


def test_a_thread_setting_changed_later_gets_its_own_child(monkeypatch):
    """A child measures with the thread settings of the moment (what the key names)."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    first = call(os.getpid)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert call(os.getenv, "OMP_NUM_THREADS") == "1"
    assert call(os.getpid) != first
