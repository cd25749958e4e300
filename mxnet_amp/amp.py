"""``mxnet.contrib.amp.amp``: the native module's public names, at the same path."""
from . import lists  # noqa: F401
from .convert import (convert_bucketing_module, convert_hybrid_block,  # noqa: F401
                      convert_model, convert_symbol)
from .lists import (list_conditional_fp32_ops, list_fp32_ops,  # noqa: F401
                    list_loss_output_functions, list_lp16_fp32_ops, list_lp16_ops,
                    list_lp16_use_fp32_params, list_widest_type_cast)
from .loss_scaler import LossScaler  # noqa: F401
from .patching import init  # noqa: F401
from .scaling import init_trainer, scale_loss, unscale  # noqa: F401

__all__ = ["init", "init_trainer", "scale_loss", "unscale", "convert_model",
           "convert_hybrid_block", "list_lp16_ops", "list_fp32_ops", "list_lp16_fp32_ops",
           "list_conditional_fp32_ops", "list_widest_type_cast", "list_loss_output_functions",
           "list_lp16_use_fp32_params", "convert_symbol"]
