"""amp_adapters: one automatic-mixed-precision policy for MXNet/Gluon and Paddle.

The framework-free core: op lists as data, the cast planner, the loss-scale
state machine and reports. It imports neither framework; ``mxnet_amp`` and
``paddle_amp`` translate its decisions into each framework's graph.
"""
from .errors import (AmpConfigError, CheckpointError, ConflictingOpError, OverflowGuardError,
                     UnknownChoiceError, UnknownOpError)
from .planner import Category, OpDecision, categorize, effective_lists, plan_op, widest
from .policy import DTYPES, LEVELS, PRESETS, OpLists, Policy
from .report import CastReport, compare
from .scaler import (DynamicLossScale, LossScale, NoOpLossScale, StaticLossScale,
                     loss_scale_from_config, loss_scale_from_state_dict)

__version__ = "0.1.0"

__all__ = [
    "AmpConfigError", "CheckpointError", "ConflictingOpError", "OverflowGuardError", "UnknownChoiceError",
    "UnknownOpError", "Category", "OpDecision", "categorize", "effective_lists", "plan_op",
    "widest", "DTYPES", "LEVELS", "PRESETS", "OpLists", "Policy", "CastReport", "compare",
    "DynamicLossScale", "LossScale", "NoOpLossScale", "StaticLossScale",
    "loss_scale_from_config", "loss_scale_from_state_dict", "__version__",
]
