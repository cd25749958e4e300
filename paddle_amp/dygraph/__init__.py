"""paddle_amp.dygraph: ``paddle.amp`` (Paddle's dynamic-graph AMP) as a drop-in that runs
mixed precision on a CPU, on the project's one policy.

    from paddle_amp import dygraph as amp      # instead of: from paddle import amp
    scaler = amp.GradScaler(init_loss_scaling=1024)
    with amp.auto_cast(dtype="bfloat16"):      # bf16 on oneDNN where this CPU runs it
        loss = model(x)
    scaler.scale(loss).backward()
    scaler.minimize(optimizer, scaled)

Files (one role each; a role the other backends have bears their name: config, lists,
kernels, speed, layer_paths, scaling, masters, checkpoint, report, doctor; docs/design.md's
role table maps the three):

    config.py        auto_cast's arguments (and policy=, emulate=) -> one checked Policy
    lists.py         the native list API -> OpLists: paddle.amp's own dygraph white/black
                     lists, read from the installed one, and the custom lists over them
    names.py         eager op names <-> program op names (one table, in amp_adapters.rules.oplists)
    kernels.py       what this CPU runs low in eager mode (lowp_kernels, device_profile):
                     the oneDNN route, its probe
    speed.py         policy="auto": eager mode's speed source (the core's book and child)
    dispatch.py      the per-op cast: a region opened and closed (push, pop), the wrappers
                     installed while one decides
    frames.py        the regions' state: a Frame per region, each thread's stack, the
                     wrappers' fast-path flags
    wrappers.py      paddle._C_ops's GEMM/conv entry points and Tensor @ inside a region:
                     the fast path, else planned and run as decided
    recast.py        a bf16 GEMM's low copy of a float32 activation the backward keeps
                     anyway (a ReLU's output): cast again in the backward, not kept
    layer_paths.py   the path of the Layer running an op, for a policy's layer rules
    legacy.py        a region in a legacy program being built: its ops written at exit
    jit.py           to_static: programs keyed by the region state; a legacy trace in one
    auto_cast.py     auto_cast / amp_guard (the native's module name; paddle_amp/guard.py is
                     the static fp16_guard, another role)
    scaling.py       GradScaler / AmpScaler on the core loss-scale state machine
    support.py       is_bfloat16_supported / is_float16_supported: this CPU's truth
    decorator.py     decorate / amp_decorate (O1; O2: the plan, the cast, masters, hooks)
    params.py        O2: each parameter's readers by its layer -> the core's plan_params
    masters.py       O2: float32 master weights kept by the optimizer (the native's format)
    checkpoint.py    save_checkpoint / load_checkpoint: model, optimizer, loss scale, atomic
                     (a load is a transaction: put back on any error)
    report.py        cast_report(layer, *inputs, policy=...): the CastReport of one forward
    doctor.py        doctor(model, loss_fn, optimizer): the core doctor on an eager model
    query.py         is_autocast_enabled / get_autocast_dtype: what the active region does

The native's tools and data (debugging, accuracy_compare, amp_lists, white_list,
black_list, OptimizerState) are the native's own; grad_scaler is scaling.py.
"""
from __future__ import annotations

from paddle.amp import accuracy_compare, amp_lists, debugging  # tools and data, as they are
from paddle.amp.amp_lists import black_list, white_list
from paddle.amp.grad_scaler import OptimizerState
from paddle.base import core

from . import scaling as grad_scaler
from .checkpoint import load_checkpoint, save_checkpoint
from .decorator import amp_decorate, decorate
from .doctor import doctor
from .auto_cast import amp_guard, auto_cast, autocast
from .query import (get_autocast_cpu_dtype, get_autocast_dtype, get_autocast_gpu_dtype,
                    is_autocast_enabled)
from .report import cast_report
from .scaling import AmpScaler, GradScaler
from .support import is_bfloat16_supported, is_float16_supported
from . import jit as _jit

_jit.install()  # to_static's programs keyed by the region state (before any is traced)

__all__ = ["auto_cast", "amp_guard", "autocast", "decorate", "amp_decorate", "GradScaler",
           "AmpScaler", "is_bfloat16_supported", "is_float16_supported",
           "is_autocast_enabled", "get_autocast_dtype", "get_autocast_cpu_dtype",
           "get_autocast_gpu_dtype", "cast_report", "save_checkpoint", "load_checkpoint",
           "doctor"]
