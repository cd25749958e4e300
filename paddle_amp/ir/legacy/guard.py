"""The guards on the legacy IR: each op keeps the name scope it was built in
(``op_namescope``), so an op built inside ``fp16_guard`` or ``bf16_guard`` (ours or the
native's) carries that guard's scope; nothing to record."""
from __future__ import annotations

from ..protocol import GUARD_SCOPES


def in_guard(op) -> bool:
    """Whether the legacy ``op`` was built inside a guard's name scope."""
    scope = op.attr("op_namescope") or ""
    return any(pattern in scope for pattern in GUARD_SCOPES)
