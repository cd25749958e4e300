"""``paddle.static.amp.fp16_lists``: the list object and the default sets, from the core data.

The module sets are the installed native's defaults (``native_lists``, the
data of the ``paddle-native`` preset), as fresh copies: edit a list object's
sets, not these.
"""
from amp_adapters.rules.oplists import native_lists

from .lists import (AutoMixedPrecisionLists, CustomOpLists,  # noqa: F401
                    check_amp_dtype)
from .casting import dtype_of as _dtype_of

_fp16 = native_lists("paddle", "float16")
FP16_WHITE_LIST = set(native_lists("paddle", "bfloat16").lower)  # float16 adds two fused ops
EXTRA_BLACK_LIST = set(_fp16.o2_fp32 or ())
FP16_BLACK_LIST = set(_fp16.fp32 - EXTRA_BLACK_LIST)
white_list = FP16_WHITE_LIST
black_list = FP16_BLACK_LIST
gray_list = set(_fp16.promote)


def get_low_precision_dtypestr(dtype) -> str:
    """'float16' or 'bfloat16' for a string, VarType or paddle dtype (else the native error)."""
    return check_amp_dtype(_dtype_of(dtype))


def get_low_precision_vartype(dtype):
    """The legacy-IR VarType of ``dtype`` (FP16 or BF16)."""
    from .env import VARTYPE_OF
    if not isinstance(dtype, str):
        return VARTYPE_OF[get_low_precision_dtypestr(dtype)]
    return VARTYPE_OF[check_amp_dtype(dtype)]
