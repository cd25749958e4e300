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

The roles both backends share (config, kernels, lists, rewrite, scaling...) are
mapped once, in docs/design.md's Layout.

Files:

    config.py     decorate()'s native arguments (both overloads) -> Policy + loss scale
    kernels.py    which ops have a low-precision kernel on the device used: the recipes and
                  the device profile, run by the probe of the program's IR (in ir/)
    speed.py      measured speed (policy "auto"): the static programs' speed source per IR
                  (the job per op and shape class, its timer); the book: the core's
    speed_child.py  the measuring child process (python -m paddle_amp.speed_child): the
                  core's job server with the static and dygraph timers loaded
    memory.py     (memory) Paddle's count of its tensor bytes: the host allocator's peak
    onednn_log.py (kernels) oneDNN's verbose log of one block: which implementation ran
    lists.py      AutoMixedPrecisionLists (and BF16): live sets -> OpLists
    env.py        Paddle glue: static check, the program's IR, dtype names, device
    guard.py      fp16_guard / bf16_guard: the native name scopes, on both IRs (entering one,
                  the native's too, enters the program's ProgramIR.guarding: PIR records)
    layer_paths.py  the layer path owning each parameter (Layer calls in static mode note
                  it): what a layer rule and the doctor name an op by
    ir/           the program IR layer: the ProgramIR protocol, one implementation per IR
                  (its legacy and pir folders: casts, state vars, unscale, all-reduce, the
                  skip table; pir/opnames: PIR op and operand names -> the legacy names
                  the op tables use), picked once per program (ir.of)
    rewrite.py    the program rewrite, once over ir/: plan every forward op, insert casts
    scaling.py    loss scaling, once over ir/: unscale, reduce, culprits, skip, update
    state.py      (scaling) the loss-scale state in a scope: read, write all or nothing, guard
    doctor.py     doctor(optimizer, exe): which op goes wrong under AMP, and the fix
    dygraph/      paddle.amp (Paddle's dynamic graph) on a CPU: the third runtime of the policy
    masters.py    O2: low-precision parameters and their (emulated) float32 masters
    report.py     cast_report of a rewritten program, its forward casts counted in it
    decorator.py  decorate() and OptimizerWithMixedPrecision: the optimizer wrapper
    checkpoint.py save_checkpoint / load_checkpoint of a decorated program: persistables, step
    casting.py    cast_model_to_fp16 / cast_parameters_to_fp16, graph helpers
    fp16_lists.py fp16_utils.py bf16/ amp_nn.py debugging.py function_overload.py
                  the native submodules at the same paths
"""
from amp_adapters import CastReport, OverflowGuardError, Policy

from . import layer_paths  # noqa: F401 (Layer calls in static mode note their paths)
from . import amp_nn, bf16, debugging, decorator, fp16_lists, fp16_utils  # noqa: F401
from . import function_overload  # noqa: F401
from .casting import cast_model_to_fp16, cast_parameters_to_fp16
from .decorator import OptimizerWithMixedPrecision, decorate
from .doctor import doctor
from .guard import fp16_guard
from .lists import AutoMixedPrecisionLists
from .report import cast_report

CustomOpLists = AutoMixedPrecisionLists  # the native alias

__all__ = ["AutoMixedPrecisionLists", "CastReport", "CustomOpLists", "OptimizerWithMixedPrecision",
           "OverflowGuardError", "Policy", "cast_model_to_fp16", "cast_parameters_to_fp16",
           "cast_report", "decorate", "doctor", "fp16_guard"]
