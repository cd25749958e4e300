"""``doctor``: which op of an eager-mode model goes wrong under AMP, and the policy that fixes
it, by the layer's path in the model (the core doctor, ``amp_adapters.services.doctor``; this file
only runs the model and hands the values over).

    with amp.doctor(model, loss_fn, optimizer, policy="O1", emulate=True) as dr:
        for x, y in batches[:4]:                 # a few of your own steps, unchanged
            with amp.auto_cast(policy="O1", emulate=True):
                loss = loss_fn(model(x), y)
            ...
    print(dr.report())                           # per op: range, overflow, error vs float32
    dr.recommendation().write("fixed.toml")      # policy= accepts it unchanged

While the ``with`` block runs, each call of ``loss_fn`` (a ``paddle.nn.Layer``) after a call
of ``model`` hands the model's inputs and the labels to the doctor, which runs the model
and the loss twice more under its own regions: under the policy and in float32. It
records what ``paddle_amp.dygraph`` decides (the ops it wraps: GEMMs and convolutions, as
``cast_report``), one record per wrapped op call (``Frame.watched``: a leaf layer's, and a
block's own, such as attention's ``q @ k.T``), named by the path of the Layer that ran it
(``2``, ``encoder.layers.3.ffn``: a fix keeps that layer in float32 by the same path), with
its inputs and output, the gradients (``paddle.grad``: the parameters' own gradients are
not touched) and the backward values into each call (a weight's gradient among them).
The recommendation trains under each candidate fix (``replay``) from the parameters and
optimizer state the first recorded step started from, with the user's optimizer, over
the recorded batches in order, and recommends the narrowest whose trial is clean on
held-out steps (``amp_adapters.services.doctor.verify``). On exit the parameters, the
optimizer state and the scaler are put back as they were.

The other ops of an eager forward run as Paddle runs them (float32 on a CPU) and are not
recorded: a value that goes bad there first is seen in the next wrapped op's inputs, or
in the gradients.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

from amp_adapters import AmpConfigError, Policy
from amp_adapters.services.doctor import DoctorReport, Recorder, StepRecord, scale_ceiling
from amp_adapters.services.doctor.session import Session
from amp_adapters.services.doctor.verify import after_step
from amp_adapters.rules.layers import check_matched, layer_paths

from . import dispatch
from . import layer_paths as paths
from .config import policy_of
from .layer_paths import detached

_CREATED = ("_already_create_accumulater", "_already_create_accumulator")  # 2.6, 3.x


@dataclass
class _Call:
    """One call of a wrapped op: which (the path of the Layer running it, its how-many-th
    call there), that path, its decision (None: the region planned nothing: float32), its
    inputs (a Linear's weight among them: its gradient is among the call's backward
    values, as a program's backward op outputs it) and output (tensors of the run)."""

    key: tuple
    path: Optional[str]
    decision: Any
    inputs: list
    output: Any


class Doctor(Session):
    """The doctor of one eager model and its loss: examines the steps run in its block."""

    no_step = ("call loss_fn(model(x), label) inside the with block (or "
               "examine(inputs, labels))")
    can_replay = True

    def __init__(self, model: Any, loss_fn: Any, optimizer: Any = None, *, policy: Any = None,
                 emulate: Any = False, scaler: Any = None, max_steps: int = 8) -> None:
        import paddle
        for what, layer in (("model", model), ("loss_fn", loss_fn)):
            if not isinstance(layer, paddle.nn.Layer):
                raise TypeError(f"paddle_amp.dygraph.doctor: {what} must be a paddle.nn.Layer "
                                f"(its calls are watched), got {type(layer).__name__}")
        chosen = policy_of(policy=policy, emulate=emulate)
        if not chosen.enabled:
            raise RuntimeError("paddle_amp.dygraph.doctor: the policy is O0 (float32): "
                               "nothing to examine")
        if optimizer is not None and not isinstance(optimizer, paddle.optimizer.Optimizer):
            raise AmpConfigError(f"paddle_amp.dygraph.doctor: optimizer must be the "
                                 f"paddle.optimizer.Optimizer your loop steps (its trials "
                                 f"train with it) or None, got {type(optimizer).__name__}")
        from .scaling import AmpScaler
        if scaler is not None and not isinstance(scaler, AmpScaler):
            raise AmpConfigError(f"paddle_amp.dygraph.doctor: scaler must be the "
                                 f"paddle_amp.dygraph GradScaler your loop scales with (whose "
                                 f"scale the steps run at) or None, got "
                                 f"{type(scaler).__module__}.{type(scaler).__name__}")
        if isinstance(max_steps, bool) or not isinstance(max_steps, int) or max_steps < 1:
            raise AmpConfigError(f"paddle_amp.dygraph.doctor: max_steps must be a positive "
                                 f"int (how many of your steps it examines), got {max_steps!r}")
        # a layer rule names a layer of this model by its path (what the doctor runs from):
        # one that names none would apply to nothing, and the doctor would examine a policy
        # other than the one written
        check_matched(chosen.layer_patterns("paddle"),
                      layer_paths(model, lambda layer: layer.named_children()).values(),
                      "the model the doctor examines")
        self.model, self.loss_fn, self.optimizer, self.scaler = model, loss_fn, optimizer, scaler
        self.policy, self.max_steps, self.steps = chosen, max_steps, 0
        self._recorder = Recorder("paddle", chosen.dtype, emulated=False,
                                  max_scale=scale_ceiling(chosen.loss_scale_config))
        self._batches: list[tuple] = []  # (inputs, labels) copies, per recorded step
        self._start: Optional[tuple] = None
        self._pending: Optional[tuple] = None
        self._busy = False
        self._handles: list = []

    # -- the with block ----------------------------------------------------------------------

    def __enter__(self) -> "Doctor":
        self._saved = _snapshot(self.model, self.optimizer)
        self._saved_scaler = copy.deepcopy(self.scaler.state_dict()) if self.scaler else None
        self._handles = [self.model.register_forward_pre_hook(self._on_model),
                         self.loss_fn.register_forward_pre_hook(self._on_loss)]
        return self

    def __exit__(self, *exc: Any) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []
        _load(self.model, self.optimizer, self._saved)
        if self.scaler is not None:
            self.scaler.load_state_dict(self._saved_scaler)

    def _on_model(self, layer: Any, inputs: tuple) -> None:
        if not self._busy:
            self._pending = inputs

    def _on_loss(self, layer: Any, inputs: tuple) -> None:
        if self._busy or self._pending is None or self.steps >= self.max_steps:
            return
        data, self._pending = self._pending, None
        self.examine(data, inputs[1:])

    # -- examining ---------------------------------------------------------------------------

    def examine(self, inputs: tuple, labels: tuple, scale: Optional[float] = None) -> None:
        """Run one batch through the model and the loss under the policy and in float32,
        and record it (the hooks call this; call it yourself outside a training step). The
        batch is kept (copies) for ``replay``; the first one notes the start state."""
        if scale is None:
            scale = self._scale()
        if self._start is None:
            self._start = _snapshot(self.model, self.optimizer)
        batch = (tuple(_copy(x) for x in inputs), tuple(_copy(y) for y in labels))
        self._batches.append(batch)
        self._record(self._recorder, self.policy, *batch, scale)
        self.steps += 1

    def _scale(self) -> float:
        if self.scaler is not None and self.scaler.is_use_dynamic_loss_scaling():
            return float(self.scaler.loss_scale()[1].scale)
        return float(getattr(self.policy.loss_scale, "scale", 1.0))

    def _record(self, rec: Recorder, policy: Policy, inputs: tuple, labels: tuple,
                scale: float) -> tuple[dict, StepRecord]:
        """One step into ``rec``; returns the AMP run's unscaled parameter gradients (numpy:
        what a trial updates with) and the step's record."""
        amp_all, amp_grads, amp_back = self._run(policy, inputs, labels, scale)
        ref_all, ref_grads, ref_back = self._run(Policy.preset("O0"), inputs, labels, scale)
        amp_calls = [c for c in amp_all if c.decision is not None]
        amp_back = [b for c, b in zip(amp_all, amp_back) if c.decision is not None]
        same = {c.key: (c, b) for c, b in zip(ref_all, ref_back)}  # the same call in float32
        ref_calls = [same[c.key][0] for c in amp_calls]
        ref_back = [same[c.key][1] for c in amp_calls]
        rec.emulated = rec.emulated or any(c.decision.emulated for c in amp_calls)
        rec.begin_step(scale)
        names, seen = [], {}
        for i, (a, r) in enumerate(zip(amp_calls, ref_calls)):
            d = a.decision
            base = a.path or f"{d.op}_{i}"
            seen[base] = seen.get(base, 0) + 1
            name = base if seen[base] == 1 else f"{base}:{seen[base]}"
            names.append(name)
            rec.forward(name, d.op, d.canonical, d.category, d.precision, d.emulated,
                        output=_np(a.output), reference=_np(r.output),
                        inputs=[_np(x) for x in a.inputs], input_refs=[_np(x) for x in r.inputs],
                        layer=a.path or None)
        for i in reversed(range(len(names))):
            if amp_back[i]:
                rec.backward(names[i], amp_back[i])
        lowered = [c.decision.precision in ("float16", "bfloat16") for c in amp_calls]
        unscaled = {n: g / scale for n, g in amp_grads.items()}
        rec.gradients(unscaled, {n: g / scale for n, g in ref_grads.items()},
                      [g / scale for i, gs in enumerate(ref_back) if i < len(lowered)
                       and lowered[i] for g in gs])
        return unscaled, rec.end_step()

    def _run(self, policy: Policy, inputs: tuple, labels: tuple, scale: float) -> tuple:
        """The model and the loss on one batch under ``policy``, in a region of the doctor's
        own: ([_Call] of every wrapped op call, in call order, each keyed by the path of the
        Layer running it and its how-many-th call there, {parameter name: scaled
        gradient}, [per call: the backward values into its inputs, a weight's gradient
        among them])."""
        import paddle
        log: list = []
        self._busy = True
        frame = dispatch.push(policy, log=log, training=True)
        frame.watched = []  # every wrapped call: its decision, inputs, result, Layer path
        frame.governs = True  # the model's own regions run under the policy examined
        try:
            paths.enter()  # (the Layer path of each call, whatever the policy's rules)
        except BaseException:
            dispatch.pop(frame)
            self._busy = False
            raise
        try:
            with detached(), paddle.enable_grad():
                xs = [_leaf(x) for x in inputs]
                loss = self.loss_fn(self.model(*xs), *labels)
            calls, counts = [], {}
            for decision, given, out, path in frame.watched:
                n = counts[path] = counts.get(path, 0) + 1
                calls.append(_Call((path, n), path, decision,
                                   [x for x in given if isinstance(x, paddle.Tensor)], out))
            params = [p for p in self.model.parameters() if not p.stop_gradient]
            wants = [[x for x in c.inputs if not x.stop_gradient] for c in calls]
            asked = {id(p): p for p in params}
            for x in (x for w in wants for x in w):
                asked.setdefault(id(x), x)
            targets = list(asked.values())
            grads = paddle.grad([loss * scale], targets,
                                allow_unused=True)
        finally:
            paths.leave()
            dispatch.pop(frame)
            self._busy = False
        by_id = {id(t): g for t, g in zip(targets, grads)}
        by_param = {p.name: _np(by_id[id(p)]) for p in params if by_id[id(p)] is not None}
        back = [[_np(by_id[id(x)]) for x in w if by_id[id(x)] is not None] for w in wants]
        return calls, by_param, back

    def bf16_kernels(self) -> frozenset:
        """The ops with a bfloat16 route here in eager mode, forward and backward
        (``kernels.lowp_kernels``: the device truth gates it, a probe runs it), by the
        program names the report records (``matmul_v2``): the bfloat16 candidate's
        kernels. Its speed is the core's default (``Session.bf16_speed``: this CPU's
        class; where oneDNN emulates bf16 the candidate is not offered)."""
        from .kernels import lowp_kernels
        return lowp_kernels("bfloat16")

    # -- the trial ---------------------------------------------------------------------------

    def replay(self, policy: Policy) -> DoctorReport:
        """The trial of ``policy`` (``amp_adapters.services.doctor.verify``): training under it from
        the parameters and optimizer state the first recorded step started from, over the
        recorded batches in order, at the scale ``policy``'s loss scale reaches (from its
        initial scale, as a new run); unless the core skips a step (``after_step``), the
        user's optimizer updates the parameters with the step's unscaled gradients. The
        model and the optimizer are put back after."""
        rec = Recorder("paddle", policy.dtype, emulated=False,
                       max_scale=scale_ceiling(policy.loss_scale_config))
        saved = _snapshot(self.model, self.optimizer)
        _load(self.model, self.optimizer, self._start)
        loss_scale = policy.loss_scale
        try:
            for inputs, labels in self._batches:
                grads, done = self._record(rec, policy, inputs, labels, loss_scale.scale)
                loss_scale, apply = after_step(loss_scale, done.overflow)
                if apply and self.optimizer is not None:
                    _step(self.model, self.optimizer, grads)
                    rec.updated()
        finally:
            _load(self.model, self.optimizer, saved)
        return rec.report()


def doctor(model: Any, loss_fn: Any, optimizer: Any = None, *, policy: Any = None,
           emulate: Any = False, scaler: Any = None, max_steps: int = 8) -> Doctor:
    """A ``Doctor`` for ``model`` and ``loss_fn`` (``paddle.nn.Layer``s) under ``policy``
    (a preset, a ``Policy``, a TOML path; default: ``paddle.amp``'s own decisions, as
    ``auto_cast``) and ``emulate``; ``optimizer``: the one the trials update with (without
    it a trial applies no update and verifies nothing); ``scaler``: the ``GradScaler``
    whose scale the recorded steps run at (else the policy's initial scale)."""
    return Doctor(model, loss_fn, optimizer, policy=policy, emulate=emulate, scaler=scaler,
                  max_steps=max_steps)


# -- state ------------------------------------------------------------------------------------

def _copy(x: Any) -> Any:
    import paddle
    return paddle.to_tensor(x.numpy()) if isinstance(x, paddle.Tensor) else copy.deepcopy(x)


def _leaf(x: Any) -> Any:
    """A batch input as a fresh tensor (its own graph: the user's is not touched)."""
    import paddle
    return paddle.to_tensor(x.numpy()) if isinstance(x, paddle.Tensor) else x


def _np(x: Any) -> np.ndarray:
    return np.array(x.numpy(), copy=True)


def _snapshot(model: Any, optimizer: Any) -> tuple:
    """(parameter values, optimizer accumulators by (kind, parameter name)), as numpy."""
    params = {p.name: _np(p) for p in model.parameters()}
    accs = {}
    for kind, by_param in (getattr(optimizer, "_accumulators", None) or {}).items():
        for name, t in by_param.items():
            accs[(kind, name)] = _np(t)
    return params, accs


def _load(model: Any, optimizer: Any, state: tuple) -> None:
    """Put ``state`` (``_snapshot``) back: parameters and accumulators by value; an
    accumulator created since is dropped (the optimizer creates it again when it steps)."""
    params, accs = state
    for p in model.parameters():
        if p.name in params:
            p.set_value(params[p.name])
    for kind, by_param in (getattr(optimizer, "_accumulators", None) or {}).items():
        for name in list(by_param):
            if (kind, name) in accs:
                by_param[name].set_value(accs[(kind, name)])
            else:
                del by_param[name]
                for attr in _CREATED:
                    made = getattr(optimizer, attr, None)
                    if isinstance(made, set):
                        made.discard(name)


def _step(model: Any, optimizer: Any, grads: dict) -> None:
    """One optimizer step with ``grads`` ({parameter name: unscaled gradient}) as the
    parameters' gradients (set by a backward of sum(p * g): exactly g)."""
    import paddle
    params = [p for p in model.parameters() if p.name in grads]
    optimizer.clear_grad()
    total = sum((p * paddle.to_tensor(grads[p.name])).sum() for p in params)
    total.backward()
    optimizer.step()
    optimizer.clear_grad()
