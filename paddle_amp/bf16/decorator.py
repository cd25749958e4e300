"""``paddle.static.amp.bf16.decorator``: ``decorate_bf16`` on paddle_amp's optimizer."""
from amp_adapters.rules.errors import check_flag

from ..decorator import OptimizerWithMixedPrecision, decorate  # noqa: F401
from ..lists import AutoMixedPrecisionListsBF16
from .amp_utils import (cast_model_to_bf16, cast_parameters_to_bf16,  # noqa: F401
                        rewrite_program_bf16)


def decorate_bf16(optimizer, amp_lists=None, use_pure_bf16=False, use_bf16_guard=None):
    """The native ``decorate_bf16``: bf16 O1 (or pure bf16, O2, with ``use_pure_bf16``) under
    ``amp_lists`` (an ``AutoMixedPrecisionListsBF16``); no loss scaling, as natively."""
    check_flag("use_pure_bf16", use_pure_bf16)
    if use_bf16_guard is not None:
        check_flag("use_bf16_guard", use_bf16_guard)
    if amp_lists is None:
        amp_lists = AutoMixedPrecisionListsBF16()
    guard = bool(use_pure_bf16) if use_bf16_guard is None else bool(use_bf16_guard)
    return decorate(optimizer, amp_lists, level="O2" if use_pure_bf16 else "O1",
                    dtype="bfloat16", use_amp_guard=guard)
