"""Cast reports: every op of a model with its decision, diffable across frameworks.

A backend builds a ``CastReport`` from the ``OpDecision``s it applied and the
casts it counted in the graph that runs (``GraphCasts``: emulation's round
trips included, and counted apart), so the report, the demo's table and the
program agree; ``print(report)`` is the table with each op's reason. Two
frameworks' reports for the same model under the same policy must agree on
the canonical columns; ``compare`` lists where they do not, and names the
canonical ops that one framework's model does not have. Ops are compared by
``precision`` (an emulated fp16 op counts as fp16), so a CPU that runs an op
in real fp16 and one that emulates it agree, while an op that fell back to
fp32 does not agree with one that ran in fp16. Where the two devices' kernels
differ (``kernel_differences``), ``policy_disagreements`` keeps what the policy
still answers for.
"""
from __future__ import annotations

from dataclasses import dataclass
import math
from typing import Any, Callable, Iterable, Optional, Sequence

from ..rules.dtypes import LOW_DTYPES
from ..rules.planner import OpDecision


ITEMSIZE = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8}


def cast_bytes(shape: Optional[Sequence[Optional[int]]], dtype: Optional[str]) -> Optional[int]:
    """The bytes a cast's output of ``shape`` in ``dtype`` takes; None when a dimension is
    not known (None, or the -1/0 a framework writes for a batch not yet fed) or the dtype is
    decided at run time."""
    if shape is None or dtype not in ITEMSIZE or any(d is None or d <= 0 for d in shape):
        return None
    return ITEMSIZE[dtype] * math.prod(shape)


@dataclass(frozen=True)
class GraphCasts:
    """The cast nodes of a graph's forward pass, as the backend found them in the graph; and,
    where the backend knows their shapes, the bytes they write per step (``nbytes``: the casts
    of a known size; ``unsized``: how many others, whose size waits for the batch)."""

    total: int
    round_trips: int  # of ``total``: emulation's casts to the low dtype and straight back
    nbytes: Optional[int] = None  # None: the backend gave no sizes
    unsized: int = 0
    # forward copies the backward casts again rather than keeping them from the forward
    # (``rules.recompute``), and what those casts write per step (None: a size not known)
    recast: int = 0
    recast_bytes: Optional[int] = 0

    @classmethod
    def count(cls, casts: Iterable[tuple], recast: Iterable[Optional[int]] = ()
              ) -> "GraphCasts":
        """From ``(input, output, to_dtype)`` of every cast node (``to_dtype`` None when it is
        decided at run time), or ``(input, output, to_dtype, nbytes)`` with the bytes of its
        output (None: not known). A cast to float32 of a cast's output in a low dtype is a
        round trip: both count as emulation's. ``recast``: the bytes of each cast the
        backward makes again (None: not known)."""
        recast = list(recast)
        again = {"recast": len(recast), "recast_bytes": None if None in recast
                 else sum(recast)}
        casts = list(casts)
        low_outputs = {out for _, out, to, *_ in casts if to in LOW_DTYPES}
        back = {inp for inp, _, to, *_ in casts if to == "float32" and inp in low_outputs}
        rounding = sum((to == "float32" and inp in low_outputs) or
                       (to in LOW_DTYPES and out in back) for inp, out, to, *_ in casts)
        sizes = [c[3] for c in casts if len(c) > 3]
        if not sizes:
            return cls(len(casts), rounding, **again)
        return cls(len(casts), rounding, sum(b for b in sizes if b is not None),
                   sum(b is None for b in sizes), **again)

    def bytes_line(self) -> str:
        """What the casts write per step, for a summary: '' when not counted."""
        again = ""
        if self.recast:
            size = "" if self.recast_bytes is None else f", {_mib(self.recast_bytes)}"
            again = (f"; {self.recast} of their copies cast again in the backward rather "
                     f"than kept from the forward{size}")
        if self.nbytes is None:
            return again
        known = f"{_mib(self.nbytes)} written by them per step"
        if self.unsized == self.total:
            return "; their size waits for the batch" + again
        return f"; {known}" + (f" (and {self.unsized} whose size waits for the batch)"
                               if self.unsized else "") + again


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.2f} MiB" if n >= 1 << 14 else f"{n} bytes"


@dataclass(frozen=True)
class CastReport:
    """The decisions applied to one model, in graph order, and the casts in its graph.

    ``graph_casts`` is None for a report built from decisions alone (no graph).
    """

    framework: str
    decisions: tuple[OpDecision, ...]
    graph_casts: Optional[GraphCasts] = None

    @property
    def planned_casts(self) -> int:
        """Casts the plan asks for (before a backend collapses duplicates; no round trips)."""
        return sum(d.num_casts for d in self.decisions)

    @property
    def num_casts(self) -> int:
        """Cast nodes in the forward graph when counted there, else the planned casts."""
        return self.graph_casts.total if self.graph_casts else self.planned_casts

    def __str__(self) -> str:
        return self.format()

    def precisions(self) -> dict[str, frozenset[Optional[str]]]:
        """{canonical op: the precisions its instances got}; ops without one are left out."""
        return self._by_canonical(lambda d: d.precision)

    def categories(self) -> dict[str, frozenset[str]]:
        """{canonical op: the categories its instances fell in}."""
        return self._by_canonical(lambda d: d.category)

    def executions(self) -> dict[str, frozenset[str]]:
        """{canonical op: how its instances planned low ran} (``OpDecision.execution``: a
        real kernel, emulated, fell back, or planned for no device); other ops left out."""
        out = self._by_canonical(lambda d: d.execution)
        return {k: v - {None} for k, v in out.items() if v - {None}}

    def _by_canonical(self, field: Callable[[OpDecision], Any]) -> dict[str, frozenset]:
        out: dict[str, set] = {}
        for d in self.decisions:
            if d.canonical is not None:
                out.setdefault(d.canonical, set()).add(field(d))
        return {k: frozenset(v) for k, v in out.items()}

    def summary(self) -> str:
        """The first line: ops, and casts as counted (from the graph, or planned)."""
        head = f"{self.framework}: {len(self.decisions)} ops, {self.num_casts} casts"
        g = self.graph_casts
        if g is None:
            return head + " planned"
        low = next((d.low_dtype for d in self.decisions if d.emulated), "the low dtype")
        trips = f" ({g.round_trips} of them emulation's round trips through {low})"
        return head + " in the forward graph" + (trips if g.round_trips else "") + \
            g.bytes_line()

    def format(self) -> str:
        """The table: op, canonical op, category, input dtypes, run dtype (and whether on a
        real kernel, emulated, or for lack of a kernel), planned casts, why."""
        rows = [("op", "canonical", "category", "inputs", "runs in", "casts", "why")]
        for d in self.decisions:
            run = (d.run_dtype or "-") + _how(d)
            rows.append((d.op, d.canonical or "-", d.category,
                         ",".join(x or "-" for x in d.input_dtypes), run, str(d.num_casts),
                         d.reason))
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
        lines = ["  ".join([c.ljust(w) for c, w in zip(r, widths)] + [r[-1]]).rstrip()
                 for r in rows]
        lines.insert(1, "  ".join(["-" * w for w in widths] + ["---"]))
        return self.summary() + "\n" + "\n".join(lines)


def _how(d: OpDecision) -> str:
    """How an op planned low ran, for the "runs in" cell (``OpDecision.execution``): on a
    real kernel of this device, emulated, in float32 for lack of a usable kernel, or in
    float32 where its kernel is slower here (``OpDecision.refusal``: by a rule of the
    profile, or measured), or kept float32 where measured speed has no timing for it;
    nothing when no device was asked (a device-free plan) or the op was not planned low."""
    if d.execution == "fell back" and d.kernel_refused:
        return " (kept float32)" if d.refusal == "unmeasured" else " (slower here)"
    return {"kernel": " (real kernel)", "emulated": f" (emulated {d.low_dtype})",
            "fell back": f" (no usable {d.low_dtype} kernel)"}.get(d.execution or "", "")


def compare(a: CastReport, b: CastReport) -> list[str]:
    """Disagreements between two reports on the canonical columns (empty: they agree).

    A canonical op present in only one report is listed as absent from the
    other, so a missing op is never mistaken for agreement.
    """
    return [line for _, line in _differences(a, b)]


def _differences(a: CastReport, b: CastReport) -> list[tuple[str, str]]:
    ra, rb = a.precisions(), b.precisions()
    out = []
    for op in sorted(set(ra) | set(rb)):
        if op not in rb:
            out.append((op, f"{op}: in {a.framework} only (runs in {sorted(map(str, ra[op]))}); "
                            f"{b.framework}'s model has no such op"))
        elif op not in ra:
            out.append((op, f"{op}: in {b.framework} only (runs in {sorted(map(str, rb[op]))}); "
                            f"{a.framework}'s model has no such op"))
        elif ra[op] != rb[op]:
            out.append((op, f"{op}: {a.framework} runs it in {sorted(map(str, ra[op]))}, "
                            f"{b.framework} in {sorted(map(str, rb[op]))}"))
    return out


def kernel_differences(a: CastReport, b: CastReport) -> list[str]:
    """Where the two devices' kernels differ, not the policy: canonical ops both reports plan
    low that run on a real kernel in one and not in the other (emulated, or float32 for lack
    of a usable kernel); and ops one report plans low and runs without a real kernel while
    the other, which runs real kernels, has no such op (it does that work inside another:
    MXNet's FullyConnected adds its bias, which Paddle's bias add does on its own)."""
    ea, eb = a.executions(), b.executions()
    out = [f"{op}: {a.framework} runs it {'/'.join(sorted(ea[op]))}, "
           f"{b.framework} {'/'.join(sorted(eb[op]))}"
           for op in sorted(set(ea) & set(eb))
           if ("kernel" in ea[op]) != ("kernel" in eb[op])]
    for x, ex, y, ey in ((a, ea, b, eb), (b, eb, a, ea)):
        if any("kernel" in how for how in ey.values()):
            out += [f"{op}: {x.framework} runs it {'/'.join(sorted(ex[op]))}; "
                    f"{y.framework}'s model has no such op"
                    for op in sorted(set(ex) - set(y.precisions()))
                    if ex[op] <= {"fell back", "emulated"}]
    return out


def policy_disagreements(a: CastReport, b: CastReport) -> list[str]:
    """The disagreements of ``compare`` on ops both models have that the policy answers for.

    All of them where the two devices run the same ops on real kernels. Where they do not
    (``kernel_differences``: a bf16 GEMM on a real kernel in one framework, emulated in the
    other), an op that follows or promotes its inputs sees the dtypes its producers ran in
    (after a real bf16 GEMM bf16, after an emulated one float32), so only the ops whose
    category fixes their precision whatever their inputs (lower, fp32) must agree.
    """
    both = set(a.precisions()) & set(b.precisions())
    fixed = {"lower", "fp32"}
    ca, cb = a.categories(), b.categories()
    kernels_differ = bool(kernel_differences(a, b))
    return [line for op, line in _differences(a, b) if op in both and (
        not kernels_differ or (ca[op] | cb[op]) <= fixed)]
