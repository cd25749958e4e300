"""``LegacyProgram``: the ``ProgramIR`` protocol on a legacy-IR program (Paddle 2.6, and 3.x
with ``FLAGS_enable_pir_api=0``), one class composed of its concerns, each in its file:
values and the walk (``values``), writing (``writing``), O2 masters (``masters``), loss
scaling (``scaling``), the doctor (``doctor``) and recomputed casts (``recompute``).
Values are var names.
"""
from __future__ import annotations

from typing import AbstractSet, Optional

from .doctor import Doctor
from .masters import Masters
from .recompute import Recompute
from .scaling import Scaling
from .values import Cursor, Values
from .writing import Writing


class LegacyProgram(Values, Writing, Masters, Scaling, Doctor, Recompute):
    """A legacy ``framework.Program``, through the ``ProgramIR`` protocol."""

    name = "legacy"

    def __init__(self, program) -> None:
        self.program = program
        self.block = program.global_block()
        self._onednn_casts = False
        self._plain_readers: AbstractSet[str] = frozenset()  # (``use_onednn_casts``)
        self.cursor: Optional[Cursor] = None  # the walk's, on the op it yields
        self._startup_block = None  # where the update's constants are filled
        self._read: Optional[set] = None  # (``is_output``)
        self._listed: list = []  # the ops as ``op_uses`` listed them (``recast``)
        self._walk_readers: Optional[tuple] = None  # (``result_uses``)
