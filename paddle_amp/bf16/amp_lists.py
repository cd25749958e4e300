"""``paddle.static.amp.bf16.amp_lists``: the bf16 list object and default sets (core data)."""
from amp_adapters.oplists import native_lists

from ..fp16_lists import (black_list as black_list_fp16,  # noqa: F401
                          gray_list as gray_list_fp16, white_list as white_list_fp16)
from ..lists import AutoMixedPrecisionListsBF16, _unsupported  # noqa: F401

_bf16 = native_lists("paddle", "bfloat16-lists")
BF16_WHITE_LIST = set(_bf16.lower)
bf16_list = BF16_WHITE_LIST
fp32_list = set(_bf16.fp32)
gray_list = set(_bf16.promote)
bf16_initializer_list = set(_bf16.initializers)
unsupported_list = _unsupported("bfloat16") - bf16_list - gray_list
