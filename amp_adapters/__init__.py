"""amp_adapters: one automatic-mixed-precision policy for MXNet/Gluon and Paddle.

The framework-free core: op lists as data, the cast planner, the loss-scale
state machine and reports. It imports neither framework; ``mxnet_amp`` and
``paddle_amp`` translate its decisions into each framework's graph.

Files:

    rules/        the policy kernel: policy, lists, planner, device, loss-scale rule
    services/     its services: speed, memory, reports, checkpoints, doctor, command
    _version.py   __version__, the one place (setup.cfg and the command read it)
"""
import os as _os

from ._version import __version__
from .rules import isa as _isa
from .rules.device import DeviceProfile, ShapeClass
from .rules.dtypes import LOW_DTYPES, dtype_name
from .rules.errors import (AmpConfigError, CheckpointError, ConflictingOpError, NotSupportedError,
                           OverflowGuardError, UnknownChoiceError, UnknownOpError)
from .rules.layers import LayerLists, UnmatchedLayerWarning
from .rules.loss_scale import LossScaleConfig, LossScaleState
from .rules.params import ParamPlan, ParamUse, plan_params
from .rules.planner import (UNKNOWN, Category, OpCall, OpDecision, attrs_read, categorize,
                            effective_lists, output_fp32, plan_op, widest)
from .rules.policy import (DTYPES, LEVELS, PRESETS, OpLists, Policy, resolve_policy,
                           with_custom_lists)
from .rules.scaler import (DynamicLossScale, LossScale, NoOpLossScale, StaticLossScale,
                           loss_scale_from_config, loss_scale_from_parts,
                           loss_scale_from_state_dict)
from .services.report import CastReport, compare, kernel_differences, policy_disagreements

# AMP_ADAPTERS_CPU=avx2|avx512_core: run as that CPU class (isa.simulated): oneDNN limited to
# match in this process, for a framework whose oneDNN has not started yet, and its children
_os.environ.update(_isa.onednn_env())
if _isa.simulated() and {"mxnet", "paddle"} & set(__import__("sys").modules):
    import warnings as _warnings
    _warnings.warn("amp_adapters: AMP_ADAPTERS_CPU is set but a framework was imported "
                   "first: its oneDNN may already run beyond the simulated class in this "
                   "process (import amp_adapters first, or set DNNL_MAX_CPU_ISA and "
                   "ONEDNN_MAX_CPU_ISA yourself); measuring children are limited", stacklevel=2)


__all__ = [
    "LOW_DTYPES", "dtype_name",
    "AmpConfigError", "CheckpointError", "ConflictingOpError", "OverflowGuardError",
    "UnknownChoiceError", "UnknownOpError", "ParamPlan", "ParamUse", "plan_params", "UNKNOWN",
    "Category", "OpCall", "OpDecision", "attrs_read", "categorize", "effective_lists",
    "output_fp32",
    "plan_op", "widest", "DTYPES", "LEVELS", "PRESETS", "OpLists", "Policy", "CastReport",
    "compare",
    "kernel_differences", "policy_disagreements",
    "DynamicLossScale", "LossScale", "NoOpLossScale", "StaticLossScale",
    "loss_scale_from_config", "loss_scale_from_state_dict", "loss_scale_from_parts",
    "LossScaleConfig", "LossScaleState", "__version__",
    "NotSupportedError", "resolve_policy", "LayerLists", "UnmatchedLayerWarning",
    "DeviceProfile", "ShapeClass", "with_custom_lists",
]
