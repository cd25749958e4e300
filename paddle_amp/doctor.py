"""``doctor``: which op of a static program goes wrong under AMP, and the policy that fixes it.

    opt = paddle_amp.decorate(paddle.optimizer.SGD(0.01), policy="O1", emulate=True)
    opt.minimize(loss); exe.run(startup); opt.amp_init(place)
    with paddle_amp.doctor(opt, exe) as dr:
        for feed in batches[:3]:                 # a few of your own steps, unchanged
            exe.run(main, feed=feed, fetch_list=[loss])
    print(dr.report())                           # per op: range, overflow, error vs float32
    dr.recommendation().write("fixed.toml")      # policy= accepts it unchanged

While the ``with`` block runs, ``exe.run`` of this executor (this one object,
nothing global) first hands each feed of the decorated program to the doctor,
which runs the program's forward and backward ops (no optimizer, no
loss-scale update) in a scratch scope on copies of the current persistables,
fetching every op's output, and the same ops with the AMP casts made float32;
the core (``amp_adapters.services.doctor``) turns the values into the report and the
recommendation. Each feed is kept, with the persistables the first step started from,
so the recommendation can train under each candidate fix (``replay``, the trial: a
copy of the program decorated with it and a fresh copy of the optimizer, in a scratch
scope) and recommend the narrowest whose trial is clean on steps held out of its
derivation (``amp_adapters.services.doctor.verify``). On exit every persistable of the program
(parameters, optimizer state, the loss-scale state) is put back bit for bit as it was.

The IR-specific part is in the IR layer (``ProgramIR.doctor_ops``,
``float32_twin``, ``inserted_cast``, ``fetchable``, ``fetch_list``), for the
legacy program IR and PIR: under PIR the ops are seen in the legacy vocabulary
(``ir.pir.doctor.OpView``), so this loop reads both IRs alike.
"""
from __future__ import annotations

import copy
from typing import Any, Optional

import numpy as np
import paddle

from amp_adapters import Policy
from amp_adapters.services.doctor import DoctorReport, Recorder, scale_ceiling
from amp_adapters.services.doctor.bf16 import Bf16Speed
from amp_adapters.services.doctor.session import Session

from . import ir
from .env import from_low
from .layer_paths import path_of
from .report import cast_report


class Doctor(Session):
    """The doctor of one decorated program: examines the steps ``exe`` runs in its block."""

    no_step = "run the decorated program with exe.run(main, feed=...) inside the with block"

    def __init__(self, optimizer: Any, exe: Any, scope: Any = None, max_steps: int = 8) -> None:
        program = getattr(optimizer, "_train_program", None)
        if program is None:
            raise RuntimeError("paddle_amp.doctor: pass the paddle_amp-decorated optimizer "
                               "after minimize() built its program")
        if not optimizer.policy.enabled:
            raise RuntimeError("paddle_amp.doctor: the policy is O0 (float32): nothing to examine")
        self.ir = ir.of(program)
        self._ops = self.ir.doctor_ops()  # (refused here if the IR cannot say which ops)
        self._twin = self.ir.float32_twin(self._ops[0])
        self.optimizer, self.exe, self.program = optimizer, exe, program
        self.scope = scope or paddle.static.global_scope()
        self.policy = optimizer.policy
        self.max_steps = max_steps
        self._recorder = Recorder("paddle", self.policy.dtype, emulated=False,
                                  max_scale=scale_ceiling(self.policy.loss_scale_config))
        self._feeds: list[dict] = []  # each recorded step's feed: what a trial trains on
        self._start: dict[str, np.ndarray] = {}  # the persistables the first step started from
        self._params = frozenset(p.name for p in program.global_block().all_parameters())
        # O2 stores parameters low (amp_init converts them once): not replayed here
        self.can_replay = optimizer._fp32_source is not None and self.policy.level != "O2"
        self.steps = 0

    # -- the with block ----------------------------------------------------------------------

    def __enter__(self) -> "Doctor":
        self._saved = _persistables(self.program, self.scope)
        original = self.exe.run

        def run(program=None, feed=None, *args: Any, **kwargs: Any):
            target = getattr(program, "_program", program)
            if target is self.program and feed and self.steps < self.max_steps:
                self.examine(feed)
            return original(program, feed, *args, **kwargs)

        self.exe.run = run
        return self

    def __exit__(self, *exc: Any) -> None:
        self.exe.__dict__.pop("run", None)
        place = _place(self.exe)
        for name, value in self._saved.items():
            var = self.scope.find_var(name)
            if var is not None:
                var.get_tensor().set(value, place)

    # -- the analysis --------------------------------------------------------------------------

    def examine(self, feed: dict) -> None:
        """Run one feed through the AMP program and its float32 twin, op by op, and record it."""
        scale = float(getattr(self.optimizer.loss_scale(self.scope), "scale", 1.0))
        prog, forward, backward = self._ops
        twin, inserted_cast = self._twin, self.ir.inserted_cast
        names = sorted({n for op in (*forward, *backward)
                        for n in (*op.output_arg_names, *op.input_arg_names)
                        if n not in feed and self.ir.fetchable(prog, n)})
        if self.can_replay:
            if not self._feeds:  # parameters and optimizer state, as the first step found them
                self._start = _persistables(self.program, self.scope)
            self._feeds.append({k: np.array(v, copy=True) for k, v in feed.items()})
        amp = _run(self.exe, prog, feed, names, self.ir.fetch_list(prog, names),
                   self.program, self.scope)
        ref = _run(self.exe, twin, feed, names, self.ir.fetch_list(twin, names),
                   self.program, self.scope)
        decisions = iter(cast_report(self.program).decisions)
        origin: dict[str, str] = {}
        seen_as: dict[str, str] = {}
        made_by: dict[str, str] = {}
        lowered: dict[str, bool] = {}
        rec = self._recorder
        rec.begin_step(scale)
        for op in forward:  # the rewrite's casts: which value each one carries
            if inserted_cast(op):
                src, out = op.input("X")[0], op.output("Out")[0]
                origin[out] = origin.get(src, src)
                seen_as[origin[out]] = out
        for i, op in enumerate(forward):
            if inserted_cast(op):
                continue
            d = next(decisions, None)
            if d is None:  # past the planned ops: the loss scaling's own multiply
                continue
            name = f"{op.type}_{i}"
            for n in op.output_arg_names:
                made_by[n] = name
            lowered[name] = d.precision in ("float16", "bfloat16")
            outs = [n for s in op.output_names if s != "XShape" for n in op.output(s)
                    if n in amp]
            if not outs:
                continue
            raw = outs[0]
            ins = [n for n in op.input_arg_names if n in amp or n in feed]
            rec.forward(name, op.type, d.canonical, d.category, d.precision, d.emulated,
                        output=amp[seen_as.get(raw, raw)], reference=ref[raw], raw=amp[raw],
                        layer=_layer_of(op, self._params, origin, self.program),
                        inputs=[_value(amp, feed, n) for n in ins],
                        input_refs=[_value(ref, feed, origin.get(n, n)) for n in ins])
        if any(d_emulated for d_emulated in (r.emulated for r in rec._ops.values())):
            rec.emulated = True
        first_consumer: dict[str, str] = {}
        for i, op in enumerate(forward):
            if not inserted_cast(op):
                for n in op.input_arg_names:
                    first_consumer.setdefault(origin.get(n, n), f"{op.type}_{i}")
        bwd_ref = []
        for op in backward:
            grads_in = [n[:-len("@GRAD")] for n in op.input_arg_names if n.endswith("@GRAD")]
            fwd = next((origin.get(n, n) for n in grads_in), None)
            owner = made_by.get(fwd) or first_consumer.get(fwd) if fwd else None
            outs = [amp[n] for n in op.output_arg_names if n in amp]
            if owner:
                rec.backward(owner, outs)
                if lowered.get(owner):
                    bwd_ref += [ref[n] / scale for n in op.output_arg_names if n in ref]
        params = [p.name for p in self.program.global_block().all_parameters()
                  if p.trainable and f"{p.name}@GRAD" in amp]
        rec.gradients({p: amp[f"{p}@GRAD"] / scale for p in params},
                      {p: ref[f"{p}@GRAD"] / scale for p in params}, bwd_ref)
        rec.end_step()
        self.steps += 1


    def bf16_kernels(self):
        """The ops with a bfloat16 kernel, forward and backward, on the device the program
        runs on, in its IR (for the doctor's bfloat16 candidate)."""
        from .env import current_device
        from .kernels import lowp_kernels
        return lowp_kernels(current_device(), "bfloat16",
                            ir.of(self.optimizer._fp32_source[0]).probe)

    def bf16_speed(self) -> Bf16Speed:
        """This CPU's bfloat16 class (the core's default), or, on a GPU, not emulated."""
        from .env import current_device
        return Bf16Speed() if current_device() == "GPU" else super().bf16_speed()

    def replay(self, policy: Policy) -> DoctorReport:
        """The trial of ``policy`` (``amp_adapters.services.doctor.verify``): training under it from
        the state the first recorded step started from, over the recorded feeds in order.
        A copy of the program as it was before the rewrite (kept by ``backward``) is
        decorated with ``policy`` and a fresh copy of the user's optimizer (its type and
        settings), in a scratch scope holding the persistables the first step found
        (parameters, and optimizer state where the copy's has the same name; the loss
        scale starts at ``policy``'s, as a new run). Each step is examined as in the user's
        run, then the whole decorated program runs: its overflow check, skip, optimizer
        update and loss-scale update (the core's state machine, as graph ops). Nothing of
        the user's program, scope or optimizer is touched."""
        with ir.of(self.optimizer._fp32_source[0]).replaying():
            return self._trial(policy)

    def _trial(self, policy: Policy) -> DoctorReport:
        from .decorator import OptimizerWithMixedPrecision
        source, loss = self.optimizer._fp32_source
        program, loss = ir.of(source).copy_with(loss)
        startup = paddle.static.Program()
        opt = OptimizerWithMixedPrecision(_fresh(self.optimizer._optimizer), policy,
                                          self.optimizer._use_guard,
                                          self.optimizer._black_varnames)
        # a candidate's layer rule that names no op here (an op without parameters has only
        # its record name) does not apply, and the replay shows it, as MXNet's graph replay
        opt._check_layers = False
        with paddle.static.program_guard(program, startup), paddle.utils.unique_name.guard():
            opt.minimize(loss)
        scope, place = paddle.static.Scope(), _place(self.exe)
        type(self.exe).run(self.exe, startup, scope=scope)
        scale_vars = set(opt._scaling._names().values())  # the candidate's own, from its start
        for name, value in self._start.items():
            if name in self._params:  # created here: the user's startup made them
                scope.var(name).get_tensor().set(value, place)
                continue
            var = scope.find_var(name)
            if var is None or name in scale_vars:
                continue
            try:
                same = np.array(var.get_tensor()).shape == value.shape
            except (RuntimeError, ValueError, TypeError):  # not initialised by the startup
                same = False
            if same:
                var.get_tensor().set(value, place)
        opt.amp_init(place, scope=scope)
        again = Doctor(opt, self.exe, scope=scope, max_steps=len(self._feeds))
        again.can_replay = False
        for feed in self._feeds:
            before = opt.loss_scale(scope)
            again.examine(feed)
            type(self.exe).run(self.exe, program, feed=feed, scope=scope)
            if opt.loss_scale(scope).skipped_steps == before.skipped_steps:
                again._recorder.updated()  # not skipped: the optimizer ran
        return again._recorder.report()


def _fresh(optimizer: Any) -> Any:
    """A copy of a Paddle optimizer with its settings (learning rate, betas, weight decay,
    gradient clip...) and none of its program state (accumulators, the learning-rate var
    of each program, master weights), for a trial to build another program with; the
    user's optimizer is not touched."""
    new = copy.copy(optimizer)
    for key, value in vars(optimizer).items():
        if key in _PROGRAM_STATE and hasattr(value, "clear"):
            fresh = copy.copy(value)
            fresh.clear()
            setattr(new, key, fresh)
        elif isinstance(value, (dict, list, set)):
            setattr(new, key, copy.copy(value))
    new.helper = None
    return new


# what a Paddle optimizer keeps per program it built (2.6 and 3.x spellings)
_PROGRAM_STATE = frozenset({"_accumulators", "_accumulators_holder", "_master_weights",
                            "_learning_rate_map", "_already_create_accumulater",
                            "_already_create_accumulator", "_auxiliary_vars", "_opti_name_list",
                            "_param_dict", "_param_device_map"})


def _layer_of(op: Any, params: frozenset, origin: dict, program: Any = None) -> Optional[str]:
    """The layer a doctor's fix names ``op`` by: the first parameter it reads, through the
    rewrite's casts (``origin``): the path of the layer that owns it (``2``, the same in
    every build: ``layer_paths``), else, in a program built without a Layer tree, its stem
    (``dense2`` for ``dense2.w_0``, the name both IRs keep: ``ProgramIR.instance_names``);
    None (its record name) for an op that reads no parameter."""
    for n in op.input_arg_names:
        n = origin.get(n, n)
        if n in params:
            return path_of(program, n) or (n.rsplit(".", 1)[0] if "." in n else n)
    return None


def doctor(optimizer: Any, exe: Any, scope: Any = None, max_steps: int = 8) -> Doctor:
    """A context manager that examines up to ``max_steps`` of your own steps of the program
    ``optimizer`` (a paddle_amp-decorated optimizer) built, as ``exe`` runs them."""
    return Doctor(optimizer, exe, scope, max_steps)


def _value(vals: dict, feed: dict, name: str) -> np.ndarray:
    return vals[name] if name in vals else np.asarray(feed[name])


def _persistables(program, scope) -> dict[str, np.ndarray]:
    out = {}
    for var in program.list_vars():
        if var.persistable and scope.find_var(var.name) is not None:
            t = scope.find_var(var.name).get_tensor()
            try:
                out[var.name] = np.array(t).copy()
            except (RuntimeError, ValueError, TypeError):  # not initialised: nothing to keep
                continue
    return out


def _place(exe):
    """Where ``exe`` runs (values are put back there)."""
    return getattr(exe, "place", None) or paddle.CPUPlace()


def _run(exe, prog, feed: dict, names: list, fetch: list, program,
         scope) -> dict[str, np.ndarray]:
    """Run ``prog`` on copies of ``program``'s persistables in a scratch scope; every fetched
    value as float32 numpy."""
    scratch = paddle.static.Scope()
    place = _place(exe)
    for name, value in _persistables(program, scope).items():
        scratch.var(name).get_tensor().set(value, place)
    vals = type(exe).run(exe, prog, feed=feed, fetch_list=fetch, scope=scratch, return_numpy=True)
    # a bfloat16 value comes back as its uint16 bit pattern (Paddle has no other uint16)
    return {n: from_low(v, "bfloat16") if np.asarray(v).dtype == np.uint16
            else np.asarray(v, dtype=np.float32) for n, v in zip(names, vals)}
