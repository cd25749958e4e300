"""``paddle.static.amp.fp16_utils``: whole-program casts and the program-walking helpers.

``cast_model_to_fp16`` / ``cast_parameters_to_fp16`` decide through the core
planner (``casting``); ``find_*`` and ``map_block`` are plain graph utilities.
The native rewrite's internal steps (which decide precision themselves) are not
exposed: calling one raises ``NotSupportedError`` saying what to use.
"""
from paddle.base import core

from amp_adapters.rules.errors import unsupported

from .casting import (cast_model_to_fp16, cast_parameters_to_fp16,  # noqa: F401
                      find_op_index, find_true_post_op, find_true_prev_op, map_block)
from .fp16_lists import black_list, get_low_precision_dtypestr  # noqa: F401
from .lists import AutoMixedPrecisionLists  # noqa: F401
from .guard import fp16_guard  # noqa: F401

FLOAT_TYPES = {core.VarDesc.VarType.FP32, core.VarDesc.VarType.FP64}
SUPPORT_FLOAT_TYPES = {core.VarDesc.VarType.FP32, core.VarDesc.VarType.FP64,
                       core.VarDesc.VarType.FP16, core.VarDesc.VarType.BF16}

_WHY = "it is a step of the native rewrite, which decides precision itself; paddle_amp's " \
       "decisions come from the core planner"
_USE = "cast_model_to_fp16(program, amp_lists, level=...) or amp_adapters.plan_op/categorize"
AmpOptions = unsupported("paddle.static.amp.fp16_utils.AmpOptions", _WHY, _USE)
prepare_op_amp_options = unsupported("paddle.static.amp.fp16_utils.prepare_op_amp_options",
                                     _WHY, "paddle_amp.fp16_guard() and cast_model_to_fp16")
op_need_keep_fp32 = unsupported("paddle.static.amp.fp16_utils.op_need_keep_fp32", _WHY, _USE)
get_promote_dtype = unsupported("paddle.static.amp.fp16_utils.get_promote_dtype", _WHY, _USE)
get_amp_dst_dtype = unsupported("paddle.static.amp.fp16_utils.get_amp_dst_dtype", _WHY, _USE)
set_param_dtype = unsupported("paddle.static.amp.fp16_utils.set_param_dtype", _WHY, _USE)
set_var_dst_dtype = unsupported("paddle.static.amp.fp16_utils.set_var_dst_dtype", _WHY, _USE)
process_op_input_and_outputs = unsupported(
    "paddle.static.amp.fp16_utils.process_op_input_and_outputs", _WHY, _USE)
update_role_var_grad = unsupported(
    "paddle.static.amp.fp16_utils.update_role_var_grad",
    "it patches the op roles of the native O2 rewrite, which paddle_amp does not produce",
    "paddle_amp.decorate(...).minimize(loss)")
