"""amp_adapters: one automatic-mixed-precision policy for MXNet/Gluon and Paddle.

The framework-free core: op lists as data, the cast planner, the loss-scale
state machine and reports. It imports neither framework; ``mxnet_amp`` and
``paddle_amp`` translate its decisions into each framework's graph.

Files:

    policy.py     Policy: dtype, level, op-list overrides, loss scale, emulate; presets, files
    dtypes.py     the dtype vocabulary: names, low dtypes, aliases, widest-wins order
    oplists/      op lists as data (canonical vocabulary -> each framework's op names)
    planner.py    categorize / plan_op: the cast decision for one op
    device.py     DeviceProfile: what a device runs low, on which route, and how fast
    speedbook.py  measured speed kept: saved profiles, the per-machine cache, measuring
    timing.py     side-by-side timing: interleaved pairs, median ratio and spread
    measure_process.py  measurements in a kept child process (the planning process untouched)
    memory.py     a step's peak memory: a fresh process per run, VmHWM, median of three
    batch_fit.py  the largest batch in a memory budget: a line through measured peaks
    isa.py        what oneDNN uses for bf16 here: CPU flags capped by the ISA limit
    speed_report.py  info --measure / profile: per-op measured speed, the saved profile
    params.py     plan_params: which parameters O2 stores in the low dtype
    loss_scale/   the loss-scale rule, once: LossScaleConfig, LossScaleState, update over
                  the ArrayOps vocabulary (NumpyOps here), check_guard, strict state dicts
    scaler.py     DynamicLossScale / StaticLossScale / NoOpLossScale: config + state views
    policyfile.py reading and checking a policy file's structure (before anything is built)
    configcheck.py the one form of a config error; tables, unknown keys, lists of names
    toml_duplicates.py which key a policy file gives twice, and the line of each giving
    checkpoint.py atomic, verified checkpoint folders (the backends' save/load_checkpoint)
    report.py     CastReport: decisions per op and the graph's casts; print(report) is the table
    fallback.py   what a backend says about ops without a low-precision kernel here
    native_speed.py  the one line when the native's decisions are slower than float32 here
    quiet.py      framework log noise off, for our command and examples
    errors.py     the config and checkpoint errors
    cli.py        ``amp-adapters lists|explain|diff`` (other subcommands come by entry point)
    native_diff.py  where the shared O1 and each native default disagree, and why
    layers.py     per-layer precision: op instances kept fp32 or run low, by name pattern
    doctor/       the numerics doctor's core: range stats, findings, the recommended policy TOML
"""
import os as _os

from . import isa as _isa
from .dtypes import LOW_DTYPES, dtype_name
from .errors import (AmpConfigError, CheckpointError, ConflictingOpError, NotSupportedError,
                     OverflowGuardError, UnknownChoiceError, UnknownOpError)
from .layers import LayerLists, UnmatchedLayerWarning
from .params import ParamPlan, ParamUse, plan_params
from .planner import (UNKNOWN, Category, OpDecision, attrs_read, categorize, effective_lists,
                      output_fp32, plan_op, widest)
from .policy import DTYPES, LEVELS, PRESETS, OpLists, Policy, resolve_policy
from .loss_scale import LossScaleConfig, LossScaleState
from .report import CastReport, compare, kernel_differences, policy_disagreements
from .scaler import (DynamicLossScale, LossScale, NoOpLossScale, StaticLossScale,
                     loss_scale_from_config, loss_scale_from_parts, loss_scale_from_state_dict)

# AMP_ADAPTERS_CPU=avx2|avx512_core: run as that CPU class (isa.simulated): oneDNN limited to
# match in this process, for a framework whose oneDNN has not started yet, and its children
_os.environ.update(_isa.onednn_env())
if _isa.simulated() and {"mxnet", "paddle"} & set(__import__("sys").modules):
    import warnings as _warnings
    _warnings.warn("amp_adapters: AMP_ADAPTERS_CPU is set but a framework was imported "
                   "first: its oneDNN may already run beyond the simulated class in this "
                   "process (import amp_adapters first, or set DNNL_MAX_CPU_ISA and "
                   "ONEDNN_MAX_CPU_ISA yourself); measuring children are limited", stacklevel=2)

__version__ = "0.2.0"  # the one place: setup.cfg reads it (version = attr: ...)

__all__ = [
    "LOW_DTYPES", "dtype_name",
    "AmpConfigError", "CheckpointError", "ConflictingOpError", "OverflowGuardError",
    "UnknownChoiceError", "UnknownOpError", "ParamPlan", "ParamUse", "plan_params", "UNKNOWN",
    "Category", "OpDecision", "attrs_read", "categorize", "effective_lists", "output_fp32",
    "plan_op", "widest", "DTYPES", "LEVELS", "PRESETS", "OpLists", "Policy", "CastReport", "compare",
    "kernel_differences", "policy_disagreements",
    "DynamicLossScale", "LossScale", "NoOpLossScale", "StaticLossScale",
    "loss_scale_from_config", "loss_scale_from_state_dict", "loss_scale_from_parts",
    "LossScaleConfig", "LossScaleState", "__version__",
    "NotSupportedError", "resolve_policy", "LayerLists", "UnmatchedLayerWarning",
]
