"""quiet_frameworks: framework log noise off for our command and examples, never the user's
own settings, and never a warning about the user's model."""
import os
import warnings

from amp_adapters.services.quiet import NOISE_ENV, quiet_frameworks


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


def test_our_info_lines_are_off_unless_a_level_was_set(monkeypatch):
    """Paddle 3 gives the root logger an INFO handler at import: our INFO lines would show,
    timestamped, where on Paddle 2.6 they do not. A level the user set stays."""
    import logging
    from amp_adapters.services.quiet import OUR_LOGGERS
    for name in OUR_LOGGERS:
        monkeypatch.setattr(logging.getLogger(name), "level", logging.NOTSET)
    monkeypatch.setattr(logging.getLogger("mxnet_amp"), "level", logging.DEBUG)
    with warnings.catch_warnings():
        quiet_frameworks()
    assert logging.getLogger("paddle_amp").level == logging.WARNING
    assert logging.getLogger("amp_adapters").level == logging.WARNING
    assert logging.getLogger("mxnet_amp").level == logging.DEBUG
    assert not logging.getLogger("paddle_amp.rewrite").isEnabledFor(logging.INFO)


def test_paddle3_pir_backward_place_warning_is_housekeeping():
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        quiet_frameworks()
        warnings.warn("Tensor do not have 'place' interface for pir graph mode, try not to "
                      "use it. None will be returned.", UserWarning)
    assert seen == []
