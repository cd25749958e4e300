"""Cast reports of rewritten programs: the decisions applied, and the casts of a program's
forward pass counted in the program (the one that runs)."""
from __future__ import annotations

import dataclasses
import weakref
from typing import Optional

from amp_adapters import CastReport
from amp_adapters.report import GraphCasts

from .env import dtype_name
from .rewrite import is_forward


def program_casts(program) -> Optional[GraphCasts]:
    """Forward ``cast`` ops of a legacy ``program``'s global block, emulation's round trips
    counted apart (the backward pass adds one gradient cast per forward cast: not counted).

    None for a PIR program, whose ops carry no forward/backward role: its report keeps the
    planned count until its rewrite counts the casts it inserts."""
    if ".pir" in type(program).__module__:
        return None
    block = program.global_block()
    return GraphCasts.count(
        (op.input("X")[0], op.output("Out")[0],
         dtype_name(block._var_recursive(op.output("Out")[0])))
        for op in block.ops if op.type == "cast" and is_forward(op))


# The reports of rewritten programs, for ``cast_report``; a program's entry dies with it.
_REPORTS: "weakref.WeakKeyDictionary[object, CastReport]" = weakref.WeakKeyDictionary()


def record(program, report: CastReport) -> None:
    """Keep ``report`` as the decisions applied to ``program`` (by a rewrite)."""
    _REPORTS[program] = report


def cast_report(program) -> CastReport:
    """The cast decisions applied to ``program`` (after ``minimize``/``backward``), with the
    forward casts counted in the program as it is now (``program_casts``)."""
    try:
        report = _REPORTS[program]
    except KeyError:
        raise ValueError("this program was not rewritten by paddle_amp: call minimize() or "
                         "backward() of a paddle_amp-decorated optimizer on it first") from None
    return dataclasses.replace(report, graph_casts=program_casts(program))
