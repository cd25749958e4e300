"""``paddle.static.amp.bf16``: bfloat16 lists, guard, program casts and ``decorate_bf16``."""
from . import amp_lists, amp_utils, decorator  # noqa: F401
from .amp_lists import AutoMixedPrecisionListsBF16  # noqa: F401
from .amp_utils import (bf16_guard, cast_model_to_bf16, cast_parameters_to_bf16,  # noqa: F401
                        convert_float_to_uint16, rewrite_program_bf16)
from .decorator import decorate_bf16  # noqa: F401
