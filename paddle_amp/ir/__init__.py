"""The program IR layer: what differs between the legacy program IR and PIR, declared in
``protocol.ProgramIR`` and implemented once per IR (``legacy/``, ``pir/``); ``of(program)``
picks it once per program, by the program's own type. The rewrite and the loss scaling
above are written once over it."""
from __future__ import annotations

import weakref

from ..env import program_ir
from .protocol import CONTROL_FLOW, Probe, ProgramIR, Slot, StateOps
from .legacy import LegacyProgram
from .pir import PirProgram

_OF: "weakref.WeakKeyDictionary[object, ProgramIR]" = weakref.WeakKeyDictionary()


def of(program) -> ProgramIR:
    """``program`` through its IR: a ``PirProgram`` for a ``paddle.pir.Program``, else a
    ``LegacyProgram``; the same object for every call on one program."""
    found = _OF.get(program)
    if found is None:
        found = _OF[program] = (PirProgram if program_ir(program) == "pir"
                                else LegacyProgram)(program)
    return found


def default_probe() -> Probe:
    """The probe asked where no program is at hand (the list objects' kernel sets, ``info``):
    the legacy IR's, whose answers are the native's vocabulary on every Paddle."""
    return LegacyProgram.probe


__all__ = ["CONTROL_FLOW", "LegacyProgram", "PirProgram", "Probe", "ProgramIR", "Slot",
           "StateOps", "default_probe", "of"]
