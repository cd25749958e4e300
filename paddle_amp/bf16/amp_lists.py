"""``paddle.static.amp.bf16.amp_lists``: the bf16 list object and default sets (core data)."""
from amp_adapters.rules.oplists import native_lists

from ..fp16_lists import (black_list as black_list_fp16,  # noqa: F401
                          gray_list as gray_list_fp16, white_list as white_list_fp16)
from ..lists import AutoMixedPrecisionListsBF16, _unsupported  # noqa: F401

_bf16 = native_lists("paddle", "bfloat16-lists")
BF16_WHITE_LIST = set(_bf16.lower)
bf16_list = BF16_WHITE_LIST
fp32_list = set(_bf16.fp32)
gray_list = set(_bf16.promote)
bf16_initializer_list = set(_bf16.initializers)


def __getattr__(name):
    """``unsupported_list``: the ops without a bf16 kernel on the device in use, computed when
    first read (natively at import, for the CPU)."""
    if name == "unsupported_list":
        return _unsupported("bfloat16") - bf16_list - gray_list
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
