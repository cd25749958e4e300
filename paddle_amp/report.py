"""The casts of a program's forward pass, counted in the program (the one that runs)."""
from __future__ import annotations

from typing import Optional

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
