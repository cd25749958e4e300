"""Eager op names and program op names: one table (``amp_adapters.rules.oplists.eager_to_program``).

Paddle's dynamic graph runs ``matmul`` and ``add`` where a program holds ``matmul_v2`` and
``elementwise_add``. The planner and the op tables speak program names, and users' custom
lists use either (a PaddleDetection config names ``elementwise_add``, a script ``add``), so
both spellings of a listed op mean the same op here.
"""
from __future__ import annotations

from typing import Iterable

from amp_adapters.rules.oplists import eager_to_program


def program_name(eager: str) -> str:
    """The program op name of the eager op ``eager`` (itself when they agree)."""
    return eager_to_program().get(eager, eager)


def both_spellings(names: Iterable[str]) -> frozenset[str]:
    """Every name in ``names`` and, for an eager name, its program name: a custom list given
    in either spelling covers the op it means."""
    return frozenset(n for name in names for n in (name, program_name(name)))
