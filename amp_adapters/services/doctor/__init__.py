"""The numerics doctor's framework-free half: range statistics, the report, the recommendation.

A backend (``mxnet_amp.doctor``, ``paddle_amp.doctor``) runs a few of the user's
steps twice per batch, through the AMP graph and through the same graph with
its AMP casts taken out (float32), op by op, and hands the core numpy arrays.
Everything decided from those arrays lives here, once, so both frameworks
report the same findings for the same model:

    stats.py      range of a tensor in a target dtype (max |x|, overflow, flush to
                  zero/subnormal), relative error, gradient flush at a loss scale
    report.py     OpRecord / StepRecord / DoctorReport, the findings, the terminal table
    candidates.py the candidate fixes, narrowest first
    bf16.py       whether the bfloat16 candidate may lower an op (speed, emulation)
    verify.py     what "verified" means: derived from the first steps, trained under on
                  all of them with optimizer updates, the later ones held out
    recommend.py  the recommendation: a policy TOML that ``policy=`` accepts unchanged
    session.py    Session: the report and the recommendation every backend's doctor gives
"""
from .recommend import Recommendation, policy_toml, recommend
from .report import DoctorReport, Finding, OpRecord, Recorder, StepRecord, scale_ceiling
from .stats import (DTYPE_LIMITS, DtypeLimits, Range, flush_fraction, range_stats, relative_error,
                    scale_for_gradients)

__all__ = ["DTYPE_LIMITS", "DtypeLimits", "DoctorReport", "Finding", "OpRecord",
           "Range", "Recommendation", "Recorder", "StepRecord", "flush_fraction", "policy_toml",
           "range_stats", "recommend", "relative_error", "scale_ceiling", "scale_for_gradients"]
