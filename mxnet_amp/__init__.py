"""mxnet_amp: a drop-in replacement for ``mxnet.contrib.amp`` driven by ``amp_adapters``.

``import mxnet_amp as amp`` instead of ``from mxnet.contrib import amp``::

    amp.init()                                  # the native lists; init(policy="O1") shared
    amp.init_trainer(trainer)                   # DynamicLossScale by default (none for bf16)
    # O2: init(policy="O2"); amp.cast_params(net) before init_trainer: fp32 masters
    with amp.scale_loss(loss, trainer) as scaled:
        autograd.backward(scaled)
    amp.unscale(trainer)                        # optional, before clipping; once per step
    trainer.step(batch_size)                    # skipped on overflow, on every device
    amp.loss_scale(trainer), amp.last_step_skipped(trainer), amp.state_dict(trainer)
    amp.save_checkpoint(path, net, trainer); step = amp.load_checkpoint(path, net, trainer)
    amp.cast_report(net); amp.convert_hybrid_block(net); amp.reset()

Without ``policy=`` the native default lists (preset ``mxnet-native``).
Differences from the native that matter: the op lists (each replacing the
default list it names, as natively) are checked before anything is patched; under a shared policy
``mx.np``/``mx.npx`` are patched too;
ops without a low-precision kernel on the device stay float32 (or are
emulated) instead of crashing; ``reset()`` undoes ``init``; overflow is
checked on every device with one host sync per step, also with
``update_on_kvstore=True``; the loss scale is configurable, checkpointable and
readable; the new scale is used by the very next step.

The roles (config, kernels, lists, rewrite, scaling, masters, report, checkpoint, glue)
have the same file names in both backends: docs/design.md's Layout has the map.

Files:

    config.py     init()'s native arguments -> Policy
    kernels.py    which ops have a low-precision kernel on a device (probed once)
    speed.py      measured speed: MXNet's speed source (an op low with its casts against
                  float32); the book and the job server are the core's
    speed_child.py  the measuring child process (python -m mxnet_amp.speed_child): the
                  core's job server with this backend's timer loaded
    memory.py     (memory) MXNet's count of its tensor bytes: the storage profiler's counter
    lists/        the native list_* helpers, and the symbol_fp16 / symbol_bf16 lists
    patching.py   (rewrite) init/reset: cast wrappers around MXNet's op functions
    layer_paths.py  where an op sits: a block tree's paths and names, for the layer rules
    stepcasts.py  (rewrite) a parameter, and a recorded activation, cast once per
                  imperative forward, dropped after it
    copies.py     (rewrite) a low array copied to float32 (astype) is one cast into it
    graph.py      (rewrite) symbol graphs: plan every op, rewrite with casts
    scaling.py    init_trainer / scale_loss / unscale: step stages, loss scaling, the skip
    overflow.py   (scaling) the on-device overflow check
    masters.py    O2: cast_params (the core's parameter plan), float32 master weights
    report.py     cast_report of a hybridized block
    checkpoint.py save_checkpoint / load_checkpoint: params, trainer, loss scale, step
    _mx.py        MXNet glue: op registry, dtype of a tensor, casts
    active.py     the policy init() installed, the layer names seen (read without patching)
    traced.py     blocks traced before/under init: reset re-traces, init warns
    convert.py    convert_symbol / convert_model / convert_hybrid_block / _bucketing_module
    amp.py        the native amp.amp module's names
    loss_scaler.py  LossScaler on the core's state machine and guard
    native_fields.py (scaling) the native LossScaler's fields (_loss_scale, _scale_seq_len...)
    doctor.py     doctor(net, loss_fn, trainer): which op goes wrong under AMP, and the fix
"""
from amp_adapters import (DynamicLossScale, NoOpLossScale, OverflowGuardError, Policy,
                          StaticLossScale)

from . import amp, lists, loss_scaler  # noqa: F401  (the native submodules)
from .active import active_policy
from .checkpoint import load_checkpoint, save_checkpoint
from .convert import (convert_bucketing_module, convert_hybrid_block, convert_model,
                      convert_symbol)
from .lists import (list_conditional_fp32_ops, list_fp32_ops, list_loss_output_functions,
                    list_lp16_fp32_ops, list_lp16_ops, list_lp16_use_fp32_params,
                    list_widest_type_cast)
from .loss_scaler import LossScaler
from .masters import cast_params
from .patching import init, reset
from .report import cast_report
from .doctor import doctor
from .scaling import (init_trainer, last_step_skipped, load_state_dict, loss_scale, scale_loss,
                      state_dict, unscale)

__all__ = [
    "init", "reset", "active_policy", "cast_params", "init_trainer", "scale_loss", "unscale",
    "loss_scale", "last_step_skipped", "state_dict", "load_state_dict", "save_checkpoint",
    "load_checkpoint", "convert_symbol", "convert_model",
    "convert_hybrid_block", "cast_report", "list_lp16_ops", "list_fp32_ops",
    "list_lp16_fp32_ops", "list_conditional_fp32_ops", "list_widest_type_cast",
    "list_loss_output_functions", "doctor", "Policy", "DynamicLossScale", "StaticLossScale",
    "NoOpLossScale", "OverflowGuardError",
    # the rest of the native surface: submodules amp, lists, loss_scaler
    "convert_bucketing_module", "list_lp16_use_fp32_params", "LossScaler", "amp", "lists",
    "loss_scaler",
]
