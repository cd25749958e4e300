"""The doctor's report: per op and per step records, the findings, the terminal table.

A backend feeds a ``Recorder`` while it walks its graph (forward ops in
execution order, then backward ops, then the parameter gradients) and gets a
``DoctorReport``: the same records and the same findings from MXNet and
Paddle for the same model, keyed by canonical op names.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Mapping, Optional, Sequence

import numpy as np

from ...rules.dtypes import SHORT_NAMES
from ...rules.loss_scale.config import DEFAULT_MAX_SCALE, LossScaleConfig
from .stats import (Range, flush_fraction, limits, peak, range_stats, relative_error,
                    significant)

# An op adds a precision problem when its output's error against float32 exceeds this and
# is ten times its inputs' error (it is not just carrying an upstream error along).
ERROR_THRESHOLD = 1e-2
# A gradient underflows when more than this fraction of its non-zero values flush to zero.
FLUSH_THRESHOLD = 0.01


def scale_ceiling(config: LossScaleConfig) -> float:
    """The highest loss scale the doctor may propose for underflowing gradients under a
    policy's loss-scale ``config`` (a ``Recorder``'s ``max_scale``): a dynamic scale's
    ``max_scale``, which it never grows past; a static scale, or none, has no ceiling of its
    own, so a dynamic scale's default one (``DEFAULT_MAX_SCALE``)."""
    return config.max_scale if config.kind == "dynamic" else DEFAULT_MAX_SCALE


@dataclass(frozen=True)
class OpRecord:
    """One forward op, over the doctor's steps: its range, its error against float32."""

    index: int                     # execution order in the forward pass
    name: str                      # the framework's name of this op instance (node / var)
    op: str                        # the framework op type
    canonical: Optional[str]
    category: str
    precision: Optional[str]       # the dtype whose numerics it has (emulated counts as low)
    emulated: bool
    outputs: tuple[Range, ...]     # per step: its output seen from the low dtype
    inputs: tuple[tuple[Range, ...], ...]  # per step: each floating input
    errors: tuple[float, ...]      # per step: relative error of its output against float32
    added: tuple[float, ...]       # per step: that error minus its inputs' largest error
    nonfinite: tuple[bool, ...]    # per step: its output (as consumers see it) is not finite
    layer: Optional[str] = None    # the layer name a policy's layer rule keeps it by (the
                                   # backend's: a Gluon block, a Paddle layer); None: ``name``

    @property
    def layer_name(self) -> str:
        """The name ``Policy.<framework>_layers`` names this instance by."""
        return self.layer or self.name

    @property
    def lowered(self) -> bool:
        return self.precision in ("float16", "bfloat16")

    def worst(self) -> tuple[float, float, float, float, float]:
        """(max |out|, overflow, flush, error, added) over the steps; max |out| is inf (nan)
        when some step's output had an inf (a nan)."""
        def top(xs):
            vals = [x for x in xs if not math.isnan(x)]
            return max(vals) if vals else 0.0
        return (peak([r.max_abs for r in self.outputs]), top([r.overflow for r in self.outputs]),
                top([r.flush_zero for r in self.outputs]), top(self.errors), top(self.added))


@dataclass(frozen=True)
class StepRecord:
    """One step: the loss scale it ran at, and where it first went non-finite."""

    step: int
    scale: float
    overflow: bool
    first_forward: Optional[str]      # name of the first forward op with a non-finite output
    first_backward: Optional[str]     # name of the forward op whose backward went first
    nonfinite_params: tuple[str, ...]
    grad_flush: Mapping[str, float]   # param -> fraction of its gradient that flushes at scale
    grad_zero: Mapping[str, float]    # param -> fraction of its significant float32 gradient
                                      # values (stats.significant) that are 0 in the AMP run
    backward_max: float = 0.0         # max |x| of the unscaled float32 backward values the
                                      # low dtype also holds (times the scale: what overflows)
    needed_scale: Optional[float] = None  # the scale its float32 gradients need not to flush
                                          # in float16 (None: none does, or not float16)
    updated: bool = False             # an optimizer update followed it (a doctor's trial)


@dataclass(frozen=True)
class Finding:
    """One thing to change, and why: ``action`` 'fp32' (move the op), 'loss_scale' (start at
    ``value``), 'bfloat16' (range, not precision: suggested, not applied) or None (report)."""

    kind: str                # overflow | backward_overflow | underflow | precision
    name: str                # op instance or parameter
    op: Optional[str]
    canonical: Optional[str]
    action: Optional[str]
    reason: str
    value: Optional[float] = None


@dataclass(frozen=True)
class DoctorReport:
    """What a backend's doctor saw (``report()``): the run (``framework``, ``dtype``,
    ``emulated``), one ``OpRecord`` per forward op in execution order (``ops``) and one
    ``StepRecord`` per step (``steps``). ``print`` it for the table; ``findings()`` is what
    to change."""

    framework: str
    dtype: str
    emulated: bool
    ops: tuple[OpRecord, ...]
    steps: tuple[StepRecord, ...]
    max_scale: float = DEFAULT_MAX_SCALE

    def op_named(self, name: str) -> OpRecord:
        """The record of the op instance ``name`` (as the report names it); else KeyError."""
        for r in self.ops:
            if r.name == name:
                return r
        raise KeyError(f"no op named {name!r} in the doctor's report")

    def window(self, start: int, stop: Optional[int] = None) -> "DoctorReport":
        """The report of steps ``start`` to ``stop`` (exclusive) only: each op's per-step
        records and the steps cut alike, the scale the gradients need taken from the last
        one (what the doctor derives a fix from, and what it verifies one on)."""
        cut = slice(start, stop)
        steps = self.steps[cut]
        ops = tuple(replace(r, outputs=r.outputs[cut], inputs=r.inputs[cut],
                            errors=r.errors[cut], added=r.added[cut],
                            nonfinite=r.nonfinite[cut]) for r in self.ops)
        return replace(self, ops=ops, steps=steps,
                       _needed_scale=steps[-1].needed_scale if steps else None)

    @property
    def overflow_steps(self) -> int:
        """How many of the steps had a non-finite value."""
        return sum(s.overflow for s in self.steps)

    def findings(self) -> list[Finding]:
        """What to change, most urgent first: forward overflow (the first op in execution order
        that went non-finite), backward overflow, gradient underflow, precision."""
        from .stats import scale_for_gradients  # noqa: F401 (module-level import cycle-free)
        out: list[Finding] = []
        seen: set[str] = set()
        low = limits(self.dtype)
        short = SHORT_NAMES[self.dtype]
        for s in self.steps:
            if s.first_forward and s.first_forward not in seen:
                seen.add(s.first_forward)
                r = self.op_named(s.first_forward)
                top, over = r.worst()[:2]
                if r.lowered:
                    size = ("is nan" if math.isnan(top) else
                            f"reaches |x| = {top:.4g} > {short} max {low.max:.6g}")
                    why = (f"overflow: {r.op} output {size} ({over:.1%} of values overflow), "
                           f"first non-finite op "
                           f"of step {s.step}; fp32 holds it (bfloat16 would too: range, not "
                           f"precision)")
                    out.append(Finding("overflow", r.name, r.op, r.canonical, "fp32", why))
                else:
                    why = (f"overflow: first non-finite op of step {s.step}, but it already "
                           f"runs in {r.precision}: its inputs carry the problem")
                    out.append(Finding("overflow", r.name, r.op, r.canonical, None, why))
        for s in self.steps:
            if s.first_backward and s.first_backward not in seen and not s.first_forward:
                seen.add(s.first_backward)
                r = self.op_named(s.first_backward)
                why = (f"backward overflow: the gradient of {r.op} is the first non-finite "
                       f"backward value of step {s.step} (scale {s.scale:g})")
                out.append(Finding("backward_overflow", r.name, r.op, r.canonical,
                                   "fp32" if r.lowered else None, why))
        out += self._underflow()
        for r in self.ops:
            err, added = r.worst()[3:]
            if r.name in seen or not r.lowered or not (added > ERROR_THRESHOLD):
                continue
            seen.add(r.name)
            why = (f"precision: {r.op} in {short} adds a relative error of {added:.2g} "
                   f"(output {err:.2g} vs float32; its inputs carry less than a tenth of it)")
            out.append(Finding("precision", r.name, r.op, r.canonical, "fp32", why))
        return out

    def _underflow(self) -> list[Finding]:
        if not self.steps or self.dtype != "float16":
            return []
        last = self.steps[-1]
        bad = {p: f for p, f in last.grad_flush.items() if f > FLUSH_THRESHOLD}
        if not bad:
            return []
        names = ", ".join(f"{p} ({f:.0%})" for p, f in sorted(bad.items()))
        needed = self._needed_scale
        if needed is not None:
            why = (f"underflow: at loss scale {last.scale:g} these gradients flush to zero in "
                   f"fp16: {names}; at {needed:g} at most {FLUSH_THRESHOLD:.0%} do")
            return [Finding("underflow", ",".join(sorted(bad)), None, None, "loss_scale", why,
                            needed)]
        why = (f"underflow: at loss scale {last.scale:g} these gradients flush to zero in fp16: "
               f"{names}, and no scale up to {self.max_scale:g} keeps them: a range problem, "
               f"bfloat16 keeps float32's range")
        return [Finding("underflow", ",".join(sorted(bad)), None, None, "bfloat16", why)]

    # set by the Recorder: the scale the last step's fp32 gradients need (None: none does)
    _needed_scale: Optional[float] = field(default=None, repr=False)

    def __str__(self) -> str:
        return self.format()

    @property
    def mode(self) -> str:
        """How the low dtype ran: on real kernels, EMULATED, or not at all (no op lowered)."""
        short = SHORT_NAMES[self.dtype]
        if not any(r.lowered for r in self.ops):
            return f"{short} policy, but no op runs in {short}"
        return f"{short} EMULATED" if self.emulated else f"{short} on real kernels"

    @property
    def idle(self) -> Optional[str]:
        """None if some op runs in the low dtype; else the plain statement that none does:
        the policy changes nothing for this model (a fix that moved every low op to fp32
        reports no overflow, and must not look like a fix that kept AMP)."""
        if any(r.lowered for r in self.ops):
            return None
        short = SHORT_NAMES[self.dtype]
        return (f"NOTE: no op of this model runs in {short} under this policy: it all runs in "
                f"float32, so mixed precision does nothing here (no speed-up, no memory "
                f"saved). If this policy is a fix, it moved every op that ran low to fp32: "
                f"AMP is off for this model")

    def format(self) -> str:
        """The report as a terminal table: the run, the steps, the ops, the findings."""
        short = SHORT_NAMES[self.dtype]
        how = (f" (computed in fp32 on values rounded through {short} at op boundaries: no "
               f"{short} kernel here)" if self.emulated and any(r.lowered for r in self.ops)
               else "")
        lines = [f"amp-adapters doctor: {self.framework}, {len(self.steps)} step(s), "
                 f"{self.mode}{how}",
                 *([self.idle] if self.idle else []),
                 f"overflow steps: {self.overflow_steps} of {len(self.steps)}"]
        for s in self.steps:
            what = "OVERFLOW" if s.overflow else "finite"
            extra = ""
            if s.first_forward:
                extra += f"; first non-finite forward op: {s.first_forward}"
            if s.first_backward:
                extra += f"; first non-finite backward: grad of {s.first_backward}"
            if s.nonfinite_params:
                extra += f"; non-finite gradients: {', '.join(s.nonfinite_params)}"
            lines.append(f"  step {s.step}: loss scale {s.scale:g}, {what}{extra}")
        rows = [("#", "op", "canonical", "runs in", "max|out|", f"ovf {short}",
                 f"flush {short}", "rel.err", "added")]
        for r in self.ops:
            top, over, flush, err, added = r.worst()
            run = (r.precision or "-") + (" (emul.)" if r.emulated else "")
            rows.append((str(r.index), f"{r.name} ({r.op})", r.canonical or "-", run,
                         _g(top, ".3g"), f"{over:.1%}", f"{flush:.1%}", _g(err), _g(added)))
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
        table = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows]
        table.insert(1, "  ".join("-" * w for w in widths))
        lines += ["", "forward ops (worst over the steps; rel.err against the same batch in "
                      "fp32):", *("  " + t for t in table)]
        if self.steps and self.steps[-1].grad_flush:
            s = self.steps[-1]
            lines += ["", f"gradients at loss scale {s.scale:g} (fraction of non-zero values "
                          f"that flush to zero in {short}):"]
            for p, f in sorted(s.grad_flush.items()):
                lines.append(f"  {p}: {f:.1%}")
        found = self.findings()
        lines += ["", "findings:" if found else "findings: none (nothing to change)" if
                  not self.idle else f"findings: none, but no op runs in {short} (see the "
                  f"NOTE above)"]
        for i, f in enumerate(found, 1):
            act = {"fp32": f"move {f.canonical or f.op!r} to fp32",
                   "loss_scale": f"start the loss scale at {f.value or 0:g}",
                   "bfloat16": "consider dtype = bfloat16", None: "no change"}[f.action]
            lines.append(f"  {i}. {f.name}: {act}\n     {f.reason}")
        return "\n".join(lines)


def _g(x: float, spec: str = ".2g") -> str:
    return "inf" if math.isinf(x) else "nan" if math.isnan(x) else format(x, spec)


@dataclass
class _OpAcc:
    index: int
    name: str
    op: str
    canonical: Optional[str]
    category: str
    precision: Optional[str]
    emulated: bool
    layer: Optional[str] = None
    outputs: list = field(default_factory=list)
    inputs: list = field(default_factory=list)
    errors: list = field(default_factory=list)
    added: list = field(default_factory=list)
    nonfinite: list = field(default_factory=list)


class Recorder:
    """Collects what a backend sees, step by step, into a ``DoctorReport``.

    Per step: ``begin_step(scale)``; ``forward(...)`` per op in execution order;
    ``backward(forward_name, outputs)`` per backward op in execution order;
    ``gradients(amp, fp32)``; ``end_step()``.
    """

    def __init__(self, framework: str, dtype: str, emulated: bool,
                 max_scale: float = DEFAULT_MAX_SCALE) -> None:
        self.framework, self.dtype, self.emulated, self.max_scale = (framework, dtype, emulated,
                                                                     max_scale)
        self._ops: dict[str, _OpAcc] = {}
        self._steps: list[StepRecord] = []
        self._last_fp32_grads: list[np.ndarray] = []

    def begin_step(self, scale: float) -> None:
        self._scale = float(scale)
        self._first_fwd: Optional[str] = None
        self._first_bwd: Optional[str] = None
        self._step_params: tuple[str, ...] = ()
        self._flush: dict[str, float] = {}
        self._zero: dict[str, float] = {}
        self._backward_max = 0.0
        self._last_fp32_grads = []

    def forward(self, name: str, op: str, canonical: Optional[str], category: str,
                precision: Optional[str], emulated: bool, output: np.ndarray,
                reference: np.ndarray, inputs: Sequence[np.ndarray] = (),
                input_refs: Sequence[np.ndarray] = (), raw: Optional[np.ndarray] = None,
                layer: Optional[str] = None) -> None:
        """One forward op: ``output`` as its consumers see it in the AMP run (``raw``: before
        emulation's rounding, default ``output``), ``reference`` the same in float32;
        ``inputs``/``input_refs`` its floating inputs in both runs; ``layer``: the name a
        layer rule keeps this instance by (default: ``name``)."""
        acc = self._ops.get(name)
        if acc is None:
            acc = self._ops[name] = _OpAcc(len(self._ops), name, op, canonical, category,
                                           precision, emulated, layer)
        acc.outputs.append(range_stats(output if raw is None else raw, self.dtype))
        acc.inputs.append(tuple(range_stats(x, self.dtype) for x in inputs))
        err = relative_error(output, reference)
        in_err = max((relative_error(x, r) for x, r in zip(inputs, input_refs)), default=0.0)
        acc.errors.append(err)
        added = err - in_err if not math.isinf(in_err) else 0.0
        acc.added.append(added if err > 10 * in_err else 0.0)
        bad = not np.isfinite(np.asarray(output)).all()
        acc.nonfinite.append(bad)
        if bad and self._first_fwd is None:
            self._first_fwd = name

    def backward(self, forward_name: str, outputs: Sequence[np.ndarray]) -> None:
        """One backward op (of forward op ``forward_name``), in execution order."""
        if self._first_bwd is None and not all(np.isfinite(np.asarray(o)).all()
                                               for o in outputs):
            self._first_bwd = forward_name

    def gradients(self, amp: Mapping[str, np.ndarray], fp32: Mapping[str, np.ndarray],
                  backward: Sequence[np.ndarray] = ()) -> None:
        """Every parameter's gradient, unscaled, in the AMP run and in float32; ``backward``:
        the float32 run's other backward values (unscaled), which a low-precision backward
        also rounds: the loss scale is chosen to keep them too."""
        self._step_params = tuple(sorted(p for p, g in amp.items() if not np.isfinite(g).all()))
        for p, g in fp32.items():
            self._flush[p] = flush_fraction(g, self._scale, self.dtype)
            a, ref = np.asarray(amp[p]).ravel(), np.asarray(g).ravel()
            sig = np.abs(ref) >= (significant(ref, self.dtype).min(initial=np.inf))
            self._zero[p] = float(((a == 0) & sig).sum() / max(int(sig.sum()), 1))
        self._last_fp32_grads = [np.asarray(g) for g in (*fp32.values(), *backward)]
        finite = [np.abs(a[np.isfinite(a)]) for a in map(np.asarray, backward)]
        self._backward_max = max((float(a.max()) for a in finite if a.size), default=0.0)

    def end_step(self) -> StepRecord:
        """Close the step; its record (``overflow``: the step a scaler skips)."""
        from .stats import scale_for_gradients
        overflow = bool(self._step_params) or self._first_fwd is not None or \
            self._first_bwd is not None
        needed = (scale_for_gradients(self._last_fp32_grads, self.dtype, self.max_scale,
                                      FLUSH_THRESHOLD)
                  if self._last_fp32_grads and self.dtype == "float16" else None)
        self._steps.append(StepRecord(len(self._steps), self._scale, overflow, self._first_fwd,
                                      self._first_bwd, self._step_params, dict(self._flush),
                                      dict(self._zero), self._backward_max, needed))
        return self._steps[-1]

    def updated(self) -> None:
        """The last step was followed by an optimizer update (a doctor's trial says so)."""
        self._steps[-1] = replace(self._steps[-1], updated=True)

    def report(self) -> DoctorReport:
        ops = tuple(OpRecord(a.index, a.name, a.op, a.canonical, a.category, a.precision,
                             a.emulated, tuple(a.outputs), tuple(a.inputs), tuple(a.errors),
                             tuple(a.added), tuple(a.nonfinite), a.layer)
                    for a in self._ops.values())
        needed = self._steps[-1].needed_scale if self._steps else None
        return DoctorReport(self.framework, self.dtype, self.emulated, ops, tuple(self._steps),
                            self.max_scale, needed)
