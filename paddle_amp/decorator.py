"""``decorate``: the native ``paddle.static.amp.decorate``, driven by the core policy.

The returned optimizer picks the program's IR once (``ir.of``), rewrites the
program (``rewrite.Rewriter``), scales the loss, and replaces the native
unscale/update with ``scaling.LossScaling``: a true skip on overflow for every
optimizer, and the core's state machine. What the native arguments mean (the
policy, the loss scale) is ``config.py``'s answer.
"""
from __future__ import annotations

import dataclasses
import logging
import weakref
from typing import Optional

import numpy as np
import paddle
from paddle.base import core, framework

from amp_adapters import CastReport, DeviceProfile, LossScale, ParamPlan, Policy
from amp_adapters.rules.errors import check_flag
from amp_adapters.rules.recompute import recasts

from .amp_nn import check_finite_and_unscale, update_loss_scaling  # noqa: F401 (native names)
from .casting import cast_model_to_fp16, cast_parameters_to_fp16  # noqa: F401 (native names)
from . import checkpoint, ir as program_ir
from .config import resolve_decorate
from .env import current_device, expected_place, require_static
from .fp16_utils import update_role_var_grad  # noqa: F401 (a native name)
from .function_overload import FunctionType, overload  # noqa: F401 (native names)
from .lists import AutoMixedPrecisionLists, check_amp_dtype, check_lists  # noqa: F401
from .masters import EMULATED_LABEL, NATIVE_LABEL, MasterWeights
from .report import cast_report, record
from .rewrite import Rewriter
from .scaling import LossScaling, resolve_ring_id
from .speed import note_native_speed, profile

logger = logging.getLogger("paddle_amp")

# The decorated optimizer that built each program: a second one on the same program is refused.
_BUILT: "weakref.WeakKeyDictionary[framework.Program, object]" = weakref.WeakKeyDictionary()


class OptimizerWithMixedPrecision:
    """The decorated optimizer: the native methods, plus loss-scale state and the guard.

    Build with ``minimize(loss)`` (or ``backward`` + ``apply_gradients``), run the
    startup program, call ``amp_init(place)``, then run steps. ``check_guard()``
    after a step raises ``OverflowGuardError`` after ``max_consecutive_skips``
    overflows in a row (one small host read; call it every step or every few).
    """

    def __init__(self, optimizer, policy: Policy, use_guard: bool, black_varnames,
                 found_inf_ring_id=None, master_grad: bool = False):
        self._optimizer = optimizer
        self._use_master_grad = master_grad
        self.policy = policy
        self._use_guard = use_guard
        self._black_varnames = frozenset(black_varnames)
        self._found_inf_ring_id = found_inf_ring_id
        self._scaling: Optional[LossScaling] = None  # once built, in the program's IR
        self._rewriter: Optional[Rewriter] = None
        self._low_params: frozenset[str] = frozenset()
        self._param_plan: Optional[ParamPlan] = None
        self._masters: Optional[MasterWeights] = None  # emulated masters (None: native or O1)
        self._train_program = None
        self._startup_program = None
        self._check_layers = True  # a layer rule naming no op raises (the doctor's replay: no)
        self._fp32_source = None  # (the program before the rewrite, its loss): doctor replays
        self._scaled_loss = None
        self._place = None

    def __getattr__(self, name):  # the wrapped optimizer's other methods (set_lr, state_dict...)
        return getattr(self.__dict__["_optimizer"], name)

    # -- building ---------------------------------------------------------------------------

    def _new_rewriter(self, ir) -> Rewriter:
        """A rewriter on the kernels of this device for a program in ``ir``, for training."""
        if not self.policy.enabled:
            return Rewriter(self.policy, DeviceProfile(frozenset()),
                            self._use_guard, self._black_varnames)
        device = current_device()
        note_native_speed(self.policy, ir.probe, training=True)
        return Rewriter(self.policy, profile(self.policy, device, ir.probe, True),
                        self._use_guard, self._black_varnames)

    def backward(self, loss, startup_program=None, parameter_list=None, no_grad_set=None,
                 callbacks=None):
        """Rewrite ``loss``'s program, scale the loss, append the backward pass.

        Returns the (param, scaled grad) list, as the native does."""
        require_static("paddle_amp backward()")
        if self._train_program is not None:
            raise RuntimeError("this decorated optimizer already built a program; decorate a "
                               "new optimizer for another program")
        program = _check_loss(loss, parameter_list, no_grad_set)  # before anything changes
        other = _BUILT.get(program)
        if other is not None:
            same = other._optimizer is self._optimizer
            raise RuntimeError(
                f"this program was already built by another paddle_amp-decorated optimizer"
                f"{' wrapping the same ' + type(self._optimizer).__name__ if same else ''}: a "
                f"second one would rewrite it again and apply a second update every step; "
                f"use one decorated optimizer per program")
        ir = program_ir.of(program)  # the program's IR, picked once for the rewrite and scaling
        rewriter = dataclasses.replace(self._new_rewriter(ir), loss=loss)
        if self._check_layers:  # a layer rule naming no op: raised, nothing changed
            rewriter.check_layers(program)
        self._rewriter = rewriter
        self._scaling = LossScaling(ir, self.policy.loss_scale, self._found_inf_ring_id)
        if self.policy.enabled:  # a copy the doctor replays candidate fixes on (its desc only)
            self._fp32_source = ir.copy_with(loss)
        with paddle.static.program_guard(program, startup_program):
            if self.policy.enabled:
                self._plan_low_params(program)
                record(program, self._rewriter.rewrite(program, check=False))  # checked above
            self._scaling.create_vars()
            if ir.dtype(loss) != "float32":
                loss = loss.astype("float32")
            self._scaled_loss = self._scaling.scale_loss(loss)
            ir.end_forward()  # what the cast report counts (PIR ops carry no role)
            params_grads = self._optimizer.backward(self._scaled_loss, startup_program,
                                                    parameter_list, no_grad_set, callbacks)
            if self.policy.enabled:  # a low copy the backward reads is cast again there
                ir.recast(recasts(ir.op_uses()))  # rather than kept, where its source lives
            ir.end_backward(params_grads)  # what the doctor examines
            if self._masters is not None:
                params_grads = self._masters.swap_in(ir, params_grads)
        self._train_program, self._startup_program = program, startup_program  # built
        _BUILT[program] = self
        return params_grads

    def _plan_low_params(self, program) -> None:
        """O2: store the planned parameters low, with native or EMULATED float32 masters."""
        plan = self._param_plan = self._rewriter.param_plan(program)  # either IR: the core's
        low, kernels = plan.low, self._rewriter.kernels
        has_kernel = kernels is None or self._optimizer.type in kernels
        native = current_device() == "GPU" and has_kernel
        if low and not native:
            if getattr(self._optimizer, "_multi_precision", True) is False:
                logger.info("O2 with master_weight=False: %s has no %s kernel here, so the "
                            "parameters stay float32", self._optimizer.type, self.policy.dtype)
                return
            self._masters = MasterWeights(self.policy.dtype, low)
            self._optimizer._multi_precision = False  # its masters are ours, in float32
        self._low_params = low
        self._rewriter.set_low_params(program, low)

    @property
    def master_update(self) -> Optional[str]:
        """How O2's float32 master weights are updated here (None: no low parameters)."""
        if not self._low_params:
            return None
        label = (EMULATED_LABEL if self._masters is not None else NATIVE_LABEL)
        return label.format(dtype=self.policy.dtype)

    def param_plan(self) -> ParamPlan:
        """The storage dtype the core chose for every parameter, and why (O2; else float32)."""
        if self._param_plan is None:
            raise RuntimeError("call minimize() (or backward()) before param_plan()")
        return self._param_plan

    def apply_gradients(self, params_grads):
        """Unscale, check, update on finite steps only, and advance the loss-scale state."""
        if self._train_program is None:
            raise RuntimeError("call backward() (or minimize()) before apply_gradients()")
        if self._use_master_grad:
            params_grads = self._master_grads(params_grads)
        ops = self._scaling.apply(params_grads, self._optimizer)
        if self._masters is not None:
            self._masters.copy_back(program_ir.of(self._train_program))
            param_of = {m: p for p, m in self._masters.master_of.items()}  # guard: user's names
            self._scaling.param_names = tuple(param_of.get(n, n)
                                              for n in self._scaling.param_names)
        return ops

    def _master_grads(self, params_grads):
        """master_grad=True: each low-precision gradient cast to an fp32 var (the master
        gradient) that unscaling, the check, clipping and the update then read."""
        out = []
        with self._train_program._optimized_guard([]):
            for p, g in params_grads:
                if g is not None and g.dtype in (core.VarDesc.VarType.FP16,
                                                 core.VarDesc.VarType.BF16):
                    g = g.astype("float32")
                out.append((p, g))
        if hasattr(self._optimizer, "_master_grad"):
            self._optimizer._master_grad = True  # its kernels take fp32 grads for low params
        return out

    def apply_optimize(self, loss, startup_program, params_grads):
        """``apply_gradients`` under ``loss``'s program, as the native does."""
        with paddle.static.program_guard(loss.block.program, startup_program):
            return self.apply_gradients(params_grads)

    def minimize(self, loss, startup_program=None, parameter_list=None, no_grad_set=None):
        """``backward`` then ``apply_optimize``; returns (optimize ops, params_grads)."""
        params_grads = self.backward(loss, startup_program, parameter_list, no_grad_set)
        return self.apply_optimize(loss, startup_program, params_grads), params_grads

    # -- running ----------------------------------------------------------------------------

    def amp_init(self, place, scope=None, test_program=None, use_fp16_test=False,
                 rewrite_master_weight=False, use_bf16_test=False):
        """After the startup program: convert O2's low-precision parameters in ``scope``.

        ``test_program`` (a separate eval program, built without this optimizer) is
        rewritten under the same policy for O2 (its parameters are now low precision)
        or when ``use_fp16_test`` (``use_bf16_test``: the bf16 decorator's name for it, its
        fourth parameter there); a ``clone(for_test=True)`` of the decorated program needs
        nothing. ``rewrite_master_weight``: each float32 master starts from its parameter's
        low-precision value, as natively, instead of the float32 one."""
        use_fp16_test = check_flag("use_fp16_test", use_fp16_test) or \
            check_flag("use_bf16_test", use_bf16_test)
        check_flag("rewrite_master_weight", rewrite_master_weight)
        if self._train_program is None:
            raise RuntimeError("call minimize() before amp_init()")
        self._place = place
        scope = scope or paddle.static.global_scope()
        missing = sorted(n for n in self._low_params if scope.find_var(n) is None)
        if missing:  # checked before anything is converted: no half-converted scope
            raise RuntimeError(f"parameters {missing} are not in the scope: run the startup "
                               f"program before amp_init()")
        (self._masters or MasterWeights(self.policy.dtype, self._low_params)).init_scope(
            scope, place, rewrite_master_weight)  # converts each parameter once, not twice
        derived = test_program is not None and self._is_clone(test_program)
        if test_program is not None and not derived and (
                self.policy.level == "O2" or use_fp16_test):
            # the same kernels, fresh notices; no gradient here, so no slow one to keep off,
            # and measured speed is the forward's
            device = profile(self.policy, current_device(), program_ir.of(test_program).probe,
                             False)
            rewriter = dataclasses.replace(self._rewriter, device=device, loss=None)
            with paddle.static.program_guard(test_program):
                rewriter.set_low_params(test_program, self._low_params)
                # its layer rules were checked on the training program; the test program
                # is its forward, which may lack a training-only op a rule names
                record(test_program, rewriter.rewrite(test_program, check=False))

    def _is_clone(self, test_program) -> bool:
        """Whether ``test_program`` is a clone of the decorated program (rewritten already):
        it holds the loss-scale var (every decorated program has one, bf16's too)."""
        return program_ir.of(test_program).holds_var(self._scaling.vars["scale"].name)

    def _built(self, what: str) -> LossScaling:
        if self._scaling is None or not self._scaling.vars:
            raise RuntimeError(f"call minimize() (or backward()) before {what}()")
        return self._scaling

    def get_loss_scaling(self):
        """The loss-scale var (fetch it to see the scale each step)."""
        return self._built("get_loss_scaling").vars["scale"]

    @property
    def found_inf_ring_id(self) -> Optional[int]:
        """The ring ``found_inf`` is all-reduced over (None: not reduced), once built."""
        return None if self._scaling is None else self._scaling.ring_id

    def get_scaled_loss(self):
        """The scaled loss var (loss * scale)."""
        return self._scaled_loss

    def cast_report(self) -> CastReport:
        """The cast decisions applied to the training program."""
        return cast_report(self._train_program)

    def loss_scale(self, scope=None) -> LossScale:
        """The current loss-scale state (scale, good/bad/total/skipped steps) from ``scope``."""
        return self._built("loss_scale").read(scope or paddle.static.global_scope())

    def state_dict(self, scope=None) -> dict:
        """The loss-scale state as a plain dict (``amp_adapters`` format, JSON-serialisable)."""
        return self.loss_scale(scope).state_dict()

    def load_state_dict(self, state_dict: dict, scope=None) -> None:
        """Restore a ``state_dict()`` into ``scope`` (after the startup program / load).

        Strict (format version, exact keys, types, values; its recorded config must equal
        this program's, whose constants are in its ops): any problem is an
        ``AmpConfigError`` naming the key and value, and no var of the scope is written."""
        self._built("load_state_dict").write(scope or paddle.static.global_scope(), state_dict,
                            self._place or expected_place())

    def save_checkpoint(self, path, program, scope=None, step: Optional[int] = None):
        """Save ``program``'s persistables from ``scope`` (parameters, optimizer state, the
        loss-scale state) and ``step`` as the newest checkpoint in the folder ``path``.

        Atomic: the previous checkpoint stays valid until this one is complete (see
        ``amp_adapters.services.checkpoint``). ``step`` defaults to the loss scale's
        ``total_steps``. Returns ``path`` as a ``Path``."""
        scaling, scope = self._built("save_checkpoint"), scope or paddle.static.global_scope()
        checkpoint.check_saveable(program, self._train_program, scope)
        return checkpoint.save(path, program, scope, self.policy, scaling.read(scope),
                               type(self._optimizer).__name__, step)

    def load_checkpoint(self, path, program, scope=None, *, check_policy: bool = True) -> int:
        """Restore the newest checkpoint of ``path`` into ``scope`` (after the startup
        program); returns its step. Verified first (checksums, the policy, the optimizer
        type, every persistable's name, shape and dtype): a torn, truncated or mismatched
        checkpoint is a ``CheckpointError`` and the scope is left unchanged."""
        self._built("load_checkpoint")
        return checkpoint.load(path, program, self._train_program,
                               scope or paddle.static.global_scope(), self.policy,
                               type(self._optimizer).__name__,
                               self._place or expected_place(),
                               check_policy=check_policy)

    def check_guard(self, scope=None) -> None:
        """Raise ``OverflowGuardError`` naming the parameters with non-finite gradients after
        ``max_consecutive_skips`` overflow steps in a row, when the scale has collapsed to 0
        or a denormal, or (if configured) on too many skips in a window; else return. One
        host read (the core's ``loss_scale.check_guard``)."""
        self._built("check_guard").check_guard(scope or paddle.static.global_scope())


def _check_loss(loss, parameter_list, no_grad_set):
    """``loss``'s program, after checking that ``backward`` can build on it: a Variable (a
    PIR value) of one element from which the backward reaches at least one trainable
    parameter (``ir.reached_params``). Either IR; changes nothing."""
    if not isinstance(loss, program_ir.value_types()):
        raise TypeError(f"loss must be a paddle static Variable (the output of the "
                        f"program's loss op), got {type(loss).__name__} {loss!r:.60}")
    program = loss.block.program
    ir = program_ir.of(program)
    what = f"loss {loss.name!r}" if ir.name == "legacy" else "the loss"
    if np.prod(loss.shape) != 1:
        raise ValueError(f"{what} has shape {list(loss.shape)}, not one element; "
                         f"reduce it first (e.g. paddle.mean(loss))")
    skip = {v if isinstance(v, str) else v.name for v in (no_grad_set or ())}
    allowed = None if parameter_list is None else {
        p if isinstance(p, str) else p.name for p in parameter_list}
    trainable = [name for name in ir.reached_params(loss)
                 if name not in skip and (allowed is None or name in allowed)]
    if not trainable:
        raise ValueError(f"{what} depends on no trainable parameter (given "
                         f"parameter_list and no_grad_set, through values that carry a "
                         f"gradient), so there is nothing to update; check that the loss is "
                         f"computed from the model's output and no stop_gradient cuts it off")
    return program


def decorate(optimizer, amp_lists=None, level="O1", dtype="float16", master_weight=None,
             master_grad=False, init_loss_scaling=None, incr_every_n_steps=None,
             decr_every_n_nan_or_inf=None, incr_ratio=None, decr_ratio=None,
             use_dynamic_loss_scaling=None, use_amp_guard=None, use_promote=False, *,
             use_pure_fp16=None, use_fp16_guard=None, use_bf16=None,
             policy=None, emulate: bool = False, found_inf_ring_id=None):
    """Decorate ``optimizer`` for mixed-precision training of a static program (either IR).

    Takes both native argument sets: the new one (``level`` O0/O1/O2/OD,
    ``dtype``, ``master_weight``, ``master_grad``, ``use_amp_guard``,
    ``use_promote``; defaults 2**16, 2000, 1, 2.0, 0.5) and the old fluid fp16
    overload (``use_pure_fp16``, ``use_fp16_guard``, ``use_bf16``; defaults
    2**15, 1000, 2, 2.0, 0.8; by keyword). Without ``policy=`` the decisions are
    the installed native's (preset ``paddle-native`` plus ``amp_lists``, whose
    sets are read now, in-place edits included). ``use_promote=True``: an op in
    no list runs in its widest input dtype instead of fp32 (the core's promote
    rule). ``master_grad=True`` (O2): gradients of low-precision parameters are
    cast to fp32 before unscaling, clipping and the update. The loss-scaling
    arguments map onto ``DynamicLossScale.from_paddle``
    (``use_dynamic_loss_scaling=False``: a static scale, overflow steps still
    skipped). ``policy`` (a Policy, a preset name such as ``"O1"`` or a TOML
    path; ``amp_adapters.resolve_policy``) wins over level, dtype and the
    scaling arguments (``amp_lists``' custom lists go on top of it, as in ``auto_cast``);
    ``policy="auto"`` runs the low dtype of the current device
    (``paddle.set_device``: float16 on a GPU, bfloat16 on a CPU), the ops only where
    measured faster. ``emulate=True`` rounds through fp16 where the device has
    no fp16 kernel.

    The arguments -> policy translation is ``config.resolve_decorate``.

    ``found_inf_ring_id`` (data parallel): the overflow flag is all-reduced (max)
    over this collective ring, in the graph, right after the check, so every worker
    takes the same skip decision and scale step (one 4-byte collective a step, no
    host sync). ``None`` (default): ring 0 when there are several workers; an int:
    that ring; ``False``: off (see ``scaling.resolve_ring_id``). ``check_guard``
    then raises on every worker at the same step, naming that worker's culprits.
    """
    require_static("paddle_amp.decorate")
    if found_inf_ring_id is not None:
        resolve_ring_id(found_inf_ring_id)  # TypeError now rather than at minimize()
    if not isinstance(optimizer, paddle.optimizer.Optimizer):
        raise TypeError(f"decorate() needs a paddle.optimizer.Optimizer, got "
                        f"{type(optimizer).__name__}")
    config = resolve_decorate(
        amp_lists, level, dtype, master_grad, init_loss_scaling, incr_every_n_steps,
        decr_every_n_nan_or_inf, incr_ratio, decr_ratio, use_dynamic_loss_scaling,
        use_amp_guard, use_promote, use_pure_fp16=use_pure_fp16, use_fp16_guard=use_fp16_guard,
        use_bf16=use_bf16, policy=policy, emulate=emulate)
    if config.policy.level == "O2" and hasattr(optimizer, "_multi_precision"):
        optimizer._multi_precision = master_weight is not False
    return OptimizerWithMixedPrecision(optimizer, config.policy, config.use_guard,
                                       config.black_varnames, found_inf_ring_id,
                                       master_grad=config.master_grad)
