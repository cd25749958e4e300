"""quiet_frameworks: framework log noise off for our command and examples, never the user's
own settings, and never a warning about the user's model."""
import os
import warnings

from amp_adapters.quiet import NOISE_ENV, quiet_frameworks


def test_sets_the_noise_variables_but_keeps_the_users(monkeypatch):
    monkeypatch.delenv("GLOG_minloglevel", raising=False)
    monkeypatch.setenv("FLAGS_call_stack_level", "2")  # the user asked for C++ stacks
    with warnings.catch_warnings():
        quiet_frameworks()
    assert os.environ["GLOG_minloglevel"] == NOISE_ENV["GLOG_minloglevel"]
    assert os.environ["FLAGS_call_stack_level"] == "2"


def test_ignores_the_frameworks_housekeeping_warnings_only():
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        quiet_frameworks()
        warnings.warn("No ccache found. Please be aware that recompiling ...")
        warnings.warn("Cannot decide type for the following arguments. Consider ...")
        warnings.warn("something about your model")
    assert [str(w.message) for w in seen] == ["something about your model"]
