"""Cast reports: every op of a model with its decision, diffable across frameworks.

A backend builds a ``CastReport`` from the ``OpDecision``s it applied. Two
frameworks' reports for the same model under the same policy must agree on
the canonical columns; ``compare`` lists where they do not, and names the
canonical ops that one framework's model does not have. Ops are compared by
``precision`` (an emulated fp16 op counts as fp16), so a CPU that runs an op
in real fp16 and one that emulates it agree, while an op that fell back to
fp32 does not agree with one that ran in fp16.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from .planner import OpDecision


@dataclass(frozen=True)
class CastReport:
    """The decisions applied to one model, in graph order."""

    framework: str
    decisions: tuple[OpDecision, ...]

    @property
    def num_casts(self) -> int:
        """Casts the plan asks for (before a backend collapses duplicates)."""
        return sum(d.num_casts for d in self.decisions)

    def precisions(self) -> dict[str, frozenset[Optional[str]]]:
        """{canonical op: the precisions its instances got}; ops without one are left out."""
        out: dict[str, set[Optional[str]]] = {}
        for d in self.decisions:
            if d.canonical is not None:
                out.setdefault(d.canonical, set()).add(d.precision)
        return {k: frozenset(v) for k, v in out.items()}

    def format(self) -> str:
        """A fixed-width table: op, canonical op, category, input dtypes, run dtype, casts."""
        rows = [("op", "canonical", "category", "inputs", "runs in", "casts")]
        for d in self.decisions:
            run = (d.run_dtype or "-") + (f" (emulated {d.low_dtype})" if d.emulated else "")
            rows.append((d.op, d.canonical or "-", d.category,
                         ",".join(x or "-" for x in d.input_dtypes), run, str(d.num_casts)))
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
        lines.insert(1, "  ".join("-" * w for w in widths))
        return f"{self.framework}: {len(self.decisions)} ops, {self.num_casts} casts\n" + \
            "\n".join(lines)


def compare(a: CastReport, b: CastReport) -> list[str]:
    """Disagreements between two reports on the canonical columns (empty: they agree).

    A canonical op present in only one report is listed as absent from the
    other, so a missing op is never mistaken for agreement.
    """
    ra, rb = a.precisions(), b.precisions()
    out = []
    for op in sorted(set(ra) | set(rb)):
        if op not in rb:
            out.append(f"{op}: in {a.framework} only (runs in {sorted(map(str, ra[op]))}); "
                       f"{b.framework}'s model has no such op")
        elif op not in ra:
            out.append(f"{op}: in {b.framework} only (runs in {sorted(map(str, rb[op]))}); "
                       f"{a.framework}'s model has no such op")
        elif ra[op] != rb[op]:
            out.append(f"{op}: {a.framework} runs it in {sorted(map(str, ra[op]))}, "
                       f"{b.framework} in {sorted(map(str, rb[op]))}")
    return out
