"""Cast reports of rewritten programs: the decisions applied, and the casts of a program's
forward pass counted in the program (the one that runs)."""
from __future__ import annotations

import dataclasses
import weakref

from amp_adapters import CastReport

from . import ir


# The reports of rewritten programs, for ``cast_report``; a program's entry dies with it.
_REPORTS: "weakref.WeakKeyDictionary[object, CastReport]" = weakref.WeakKeyDictionary()


def record(program, report: CastReport) -> None:
    """Keep ``report`` as the decisions applied to ``program`` (by a rewrite)."""
    _REPORTS[program] = report


def cast_report(program) -> CastReport:
    """The cast decisions applied to ``program`` (after ``minimize``/``backward``), with the
    forward casts counted in the program as it is now (the IR's ``graph_casts``)."""
    try:
        report = _REPORTS[program]
    except KeyError:
        raise ValueError("this program was not rewritten by paddle_amp: call minimize() or "
                         "backward() of a paddle_amp-decorated optimizer on it first") from None
    return dataclasses.replace(report, graph_casts=ir.of(program).graph_casts())
