"""``PirProgram``: the ``ProgramIR`` protocol on a Paddle 3 PIR program, one class composed of
its concerns, each in its file: values and the walk (``values``), writing (``writing``), O2
masters (``masters``), loss scaling (``scaling``), the doctor (``doctor``) and recomputed
casts (``recompute``). PIR names
and operand names are given in the legacy vocabulary (``opnames``), so the core decides the
same for both IRs.
"""
from __future__ import annotations

from typing import Optional

from .doctor import Doctor
from .masters import Masters
from .recompute import Recompute
from .scaling import Scaling
from .values import Values
from .writing import Writing


class PirProgram(Values, Writing, Masters, Scaling, Doctor, Recompute):
    """A ``paddle.pir.Program``, through the ``ProgramIR`` protocol."""

    name = "pir"

    def __init__(self, program) -> None:
        self.program = program
        self._guarded: frozenset[int] = frozenset()
        self._forward: Optional[frozenset[int]] = None  # op ids, once the backward is built
        self._inserted: set[int] = set()  # the ids of the cast ops the rewrite inserted
        self._namings: dict = {}  # the doctor's: id(program) -> (program, Naming)
        self._grad_names: dict = {}
        self._grads: dict = {}  # grad value id -> parameter name, once the backward is built
        self._inserted_at: set[int] = set()
        self._top: Optional[frozenset[int]] = None  # (``result_uses``)
        self._listed: list = []  # the ops as ``op_uses`` listed them (``recast``)
        self._recasts: set[int] = set()  # the ids of the casts ``recast`` inserted
