"""paddle_amp: ``paddle.static.amp.decorate`` for static programs, on the shared core.

Every precision decision comes from ``amp_adapters.plan_op`` and every
loss-scale move equals ``DynamicLossScale.adjust``; this package only
translates them into program ops. Works on Paddle 2.6.2 (legacy program IR)
and Paddle 3.x in either IR: PIR (the default) or the legacy IR
(``FLAGS_enable_pir_api=0``), chosen by the program's own IR.

    opt = paddle_amp.decorate(paddle.optimizer.Adam(1e-3))   # native lists; policy="O1": shared
    opt.minimize(loss)
    exe.run(startup); opt.amp_init(place)
    for batch in data:
        exe.run(main, feed=batch)
        opt.check_guard()        # OverflowGuardError after max_consecutive_skips overflows
    opt.loss_scale()             # DynamicLossScale(scale=..., good_steps=..., skipped_steps=...)

Roles (the same file names in both backends; README.md's Layout has the full map):

    role        mxnet_amp           paddle_amp
    config      config              config
    kernels     kernels             kernels
    lists       lists (package)     lists
    rewrite     patching, graph     rewrite, pir_rewrite
    scaling     scaling, overflow   scaling, skip, state, collective, legacy_ops,
                                    pir_scaling, pir_ops
    masters     masters             masters
    report      report              report
    checkpoint  checkpoint          checkpoint
    glue        _mx                 env

Files:

    config.py     decorate()'s native arguments (both overloads) -> Policy + loss scale
    kernels.py    which ops have a low-precision kernel on the device used
    lists.py      AutoMixedPrecisionLists (and BF16): live sets -> OpLists
    rewrite.py    program rewrite: plan every forward op, insert its casts
    pir_rewrite.py  (rewrite) the same on PIR programs (combine and attribute operands)
    scaling.py    loss scaling as program ops: the check and the core's update emitted
    skip.py       (scaling) the true skip: optimizer ops under ``if not found_inf``
    state.py      (scaling) the loss-scale state in a scope: read, write all or nothing, guard
    collective.py (scaling) found_inf all-reduced over data-parallel workers
    legacy_ops.py (scaling) BlockOps: the core's ArrayOps vocabulary as legacy-IR ops
    pir_scaling.py  (scaling) loss scaling as PIR ops: the true skip via pd_op.if
    pir_ops.py    (scaling) the core's update vocabulary (ArrayOps) as PIR ops
    doctor.py     doctor(optimizer, exe): which op goes wrong under AMP, and the fix
    masters.py    O2: low-precision parameters and their (emulated) float32 masters
    report.py     cast_report of a rewritten program, its forward casts counted in it
    env.py        Paddle glue: static check, the program's IR, dtype names, device
    decorator.py  decorate() and OptimizerWithMixedPrecision: the optimizer wrapper
    checkpoint.py the wrapper's save_checkpoint / load_checkpoint: persistables, step
    casting.py    cast_model_to_fp16 / cast_parameters_to_fp16, graph helpers
    opnames.py    PIR op and operand names -> the legacy names the op tables use
    pir_guard.py  fp16_guard on both IRs (PIR: records the ops built inside)
    fp16_lists.py fp16_utils.py bf16/ amp_nn.py debugging.py function_overload.py
                  the native submodules at the same paths
"""
from amp_adapters import CastReport, OverflowGuardError, Policy

from .decorator import OptimizerWithMixedPrecision, decorate
from .report import cast_report
from .lists import AutoMixedPrecisionLists
from .pir_guard import fp16_guard
from .doctor import doctor

CustomOpLists = AutoMixedPrecisionLists  # the native alias

# The rest of the native surface (issue 14): the submodules and the top-level casts.
from . import amp_nn, bf16, debugging, decorator, fp16_lists, fp16_utils  # noqa: E402,F401
from . import function_overload  # noqa: E402,F401
from .casting import cast_model_to_fp16, cast_parameters_to_fp16  # noqa: E402

__all__ = ["AutoMixedPrecisionLists", "CastReport", "CustomOpLists", "OptimizerWithMixedPrecision",
           "OverflowGuardError", "Policy", "cast_report", "decorate", "doctor", "fp16_guard"]
__all__ += ["cast_model_to_fp16", "cast_parameters_to_fp16"]
