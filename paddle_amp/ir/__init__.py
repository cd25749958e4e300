"""The program IR layer: what differs between the legacy program IR and PIR, declared in
``protocol.ProgramIR`` (by concern: values and walk, writing, masters, scaling, doctor) and
implemented once per IR (``legacy/``, ``pir/``, the same files in each); ``of(program)``
picks it once per program, by the program's own type. The rewrite and the loss scaling
above are written once over it. Paddle 2.6.2 builds legacy programs, Paddle 3.x PIR
programs unless ``FLAGS_enable_pir_api=0``: a program's IR is its own type (``kind``),
never a flag; this folder is the only place that knows PIR's Python types."""
from __future__ import annotations

import os
import weakref

import paddle
from paddle.base import framework

from .protocol import (BF16_GUARD_SCOPE, CONTROL_FLOW, FP16_GUARD_SCOPE, GUARD_SCOPES,
                       DoctorIR, MastersIR, Probe, ProgramIR, ScalingIR, Slot, StateOps,
                       ValuesIR, WritingIR)
from .legacy import LegacyProgram
from .pir import PirProgram

_OF: "weakref.WeakKeyDictionary[object, ProgramIR]" = weakref.WeakKeyDictionary()


def of(program) -> ProgramIR:
    """``program`` through its IR: a ``PirProgram`` for a ``paddle.pir.Program``, else a
    ``LegacyProgram``; the same object for every call on one program."""
    found = _OF.get(program)
    if found is None:
        found = _OF[program] = (PirProgram if kind(program) == "pir"
                                else LegacyProgram)(program)
    return found


def _pir(name: str) -> tuple:
    pir = getattr(paddle, "pir", None)
    return (getattr(pir, name),) if hasattr(pir, name) else ()


def kind(program) -> str:
    """'pir' for a PIR program (Paddle 3's default), else 'legacy'."""
    return "pir" if isinstance(program, _pir("Program")) else "legacy"


def program_types() -> tuple:
    """The Python types of a static program in the IRs this Paddle has."""
    return (framework.Program, *_pir("Program"))


def value_types() -> tuple:
    """The Python types of a static program's tensor (a legacy Variable, a PIR Value)."""
    return (framework.Variable, *_pir("Value"))


def probe_named(name: str) -> Probe:
    """The probe of the IR called ``name`` (``Probe.name``: "legacy" or "pir")."""
    probes = {p.name: p for p in (LegacyProgram.probe, PirProgram.probe)}
    if name not in probes:
        raise ValueError(f"no program IR named {name!r}; expected one of {sorted(probes)}")
    return probes[name]


def inherited_flag() -> str:
    """``FLAGS_enable_pir_api`` as a child process inherits it (the environment; "" unset):
    the IR a measuring child builds in by default, fixed at its import, so part of the key
    of what it answers (``kernels._answers``)."""
    return os.environ.get("FLAGS_enable_pir_api", "")


def default_probe() -> Probe:
    """The probe asked where no program is at hand (the list objects' kernel sets, ``info``):
    the legacy IR's, whose answers are the native's vocabulary on every Paddle."""
    return LegacyProgram.probe


__all__ = ["BF16_GUARD_SCOPE", "CONTROL_FLOW", "DoctorIR", "FP16_GUARD_SCOPE", "GUARD_SCOPES",
           "LegacyProgram", "MastersIR", "PirProgram", "Probe", "ProgramIR", "ScalingIR", "Slot",
           "StateOps", "ValuesIR", "WritingIR", "default_probe", "inherited_flag", "kind", "of",
           "probe_named", "program_types", "value_types"]
