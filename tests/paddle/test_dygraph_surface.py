"""Every public name of the installed paddle.amp is in paddle_amp.dygraph (a drop-in never
answers a native name with AttributeError), and the state queries answer for our region."""

import paddle

from paddle_amp import dygraph as amp
from paddle_helpers import native_surface

_surface = native_surface()
missing, signature_gaps, method_gaps = (_surface.missing, _surface.signature_gaps,
                                       _surface.method_gaps)


def test_every_public_name_of_paddle_amp_is_there():
    assert missing("paddle.amp", "paddle", "paddle_amp.dygraph") == []


def test_the_state_queries_answer_for_the_active_region():
    assert not amp.is_autocast_enabled() and amp.get_autocast_dtype() == "float16"
    with amp.auto_cast(dtype="bfloat16"):
        assert amp.is_autocast_enabled() and amp.get_autocast_dtype() == "bfloat16"
        assert amp.get_autocast_cpu_dtype() == "bfloat16"
        with amp.autocast("cpu", enabled=False):
            assert not amp.is_autocast_enabled()
    assert not amp.is_autocast_enabled()
    if hasattr(paddle.amp, "is_autocast_enabled"):  # Paddle 3: the native's state untouched
        with amp.auto_cast(dtype="bfloat16"):
            assert paddle.amp.is_autocast_enabled() is False


def test_the_signatures_and_scaler_methods_are_the_natives():
    assert signature_gaps("paddle.amp", "paddle", "paddle_amp.dygraph") == []
    assert method_gaps(paddle.amp.GradScaler, amp.GradScaler) == []
    assert method_gaps(paddle.amp.AmpScaler, amp.AmpScaler) == []
