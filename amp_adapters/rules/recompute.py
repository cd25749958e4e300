"""Which of the forward pass's casts the backward casts again instead of keeping.

A GEMM lowered under O1 reads a low copy of its float32 input, and its gradient reads that
copy again: the copy lives from the forward to the backward. Where the float32 input lives
that long anyway (a ReLU's output, which ReLU's gradient reads), the step keeps both: in a
4-layer MLP at batch 8192, 32 MiB of bf16 copies beside the float32 activations, the peak
1.08x float32's (bench/RESULTS.md, issue 40). Casting again in the backward, just before the
first gradient op that reads the copy, keeps only what was kept anyway: the same values
(a cast is deterministic), one more cast per step, and the copy's bytes no longer held across
the step.

The rule, over a program's ops in execution order (``OpUse``: what each reads and writes by
key, whether it is in the backward, and for a cast the rewrite inserted its source and
result): a forward cast ``src -> dst`` is recast before ``at``, the first backward op that
reads ``dst``, when

- ``src`` is read at ``at`` or after (by any op): it is alive there anyway, so casting it
  again extends no lifetime;
- nothing writes ``src`` or ``dst`` between the cast and the last backward read of ``dst``
  (the recast sees the value the cast saw, and the rewired readers the value they read);
- no forward op reads ``dst`` after ``at`` (a program that builds a gradient, then more of
  its forward: the copy lives on for it anyway);
- ``src`` is not itself a cast's result (a chain such as emulation's round trip: recasting
  both links would leave the first one's source dead at the second's).

Everything else stays as it is: a cast whose source the backward would not keep (a
LayerNorm's output, which its gradient does not read) keeps its low copy, which is smaller.
Framework-free: each program IR lists its ops as ``OpUse`` and writes the ``Recast`` back.
Eager mode has no program to read: there the same rule is taken per GEMM, the source known
kept when its producer's gradient node saves its output (``paddle_amp/dygraph/recast.py``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import AbstractSet, Hashable, Optional, Sequence


@dataclass(frozen=True)
class OpUse:
    """One op of a program as the rule sees it: the values it ``reads`` and ``writes`` (by the
    IR's key, its nested blocks' included), whether it is in the ``backward``, and for a cast
    the rewrite inserted (``cast``): (its source, its result)."""

    reads: AbstractSet[Hashable]
    writes: AbstractSet[Hashable]
    backward: bool = False
    cast: Optional[tuple[Hashable, Hashable]] = None


@dataclass(frozen=True)
class Recast:
    """The forward cast at position ``cast`` (its result ``dst``), cast again just before the
    op at position ``at``; the backward ops at ``readers`` read the new cast instead.
    ``after``: a value that op reads which the backward wrote (the last one written before
    it), or None: an executor that runs each op as soon as its inputs are ready (the legacy
    IR's) would run the new cast at once, in the forward, unless it also waits for that."""

    cast: int
    dst: Hashable
    at: int
    readers: tuple[int, ...]
    after: Optional[Hashable] = None


def recasts(ops: Sequence[OpUse]) -> tuple[Recast, ...]:
    """The forward casts of ``ops`` (a program in execution order) that the backward casts
    again rather than keeping their result (the module's rule), in program order."""
    readers: dict[Hashable, list[int]] = {}
    writers: dict[Hashable, list[int]] = {}
    for i, op in enumerate(ops):
        for key in op.reads:
            readers.setdefault(key, []).append(i)
        for key in op.writes:
            writers.setdefault(key, []).append(i)
    made = {op.cast[1] for op in ops if op.cast is not None}
    out = []
    for i, op in enumerate(ops):
        if op.cast is None or op.backward or op.cast[0] in made:
            continue  # (a cast of a cast's result, emulation's round trip: left as it is)
        src, dst = op.cast
        late = tuple(j for j in readers.get(dst, ()) if j > i and ops[j].backward)
        if not late:
            continue
        at, last = late[0], late[-1]
        if any(j > at and not ops[j].backward for j in readers.get(dst, ())):
            continue  # a forward op after the backward's first read still reads the copy
        if not any(j >= at for j in readers.get(src, ())):
            continue  # the source dies before the backward reads the copy
        if any(i < j <= last for j in writers.get(src, ())) or \
                any(j != i and j <= last for j in writers.get(dst, ())):
            continue  # a value written again in between: not the one the cast saw
        made_by = {key: max((j for j in writers.get(key, ()) if j < at and ops[j].backward),
                            default=-1) for key in ops[at].reads}
        after = max(made_by, key=made_by.get) if made_by and max(made_by.values()) >= 0 \
            else None
        out.append(Recast(i, dst, at, late, after))
    return tuple(out)
