"""Which Paddle ops have a low-precision kernel on the device actually used.

The native AMP always asks about GPU kernels, so on a CPU build it counts
nearly every op as unsupported and inserts no cast. Here the device is the one
the program will run on (``core.op_supported_infos``), with two corrections so
that a planned op really runs: a kernel that exists only for oneDNN layouts
(``mul`` in bf16 on CPU) does not count, since the executor does not pick it
for a plain program (nor does a kernel only for the STRIDED layout:
``flatten_contiguous_range`` in fp16 on CPU); and an op counts only if its gradient op (when it has
one) has the kernel too, so training does not crash in the backward pass.
``cast`` is always usable: every build casts between fp32 and fp16/bf16.
"""
from __future__ import annotations

import functools
import re

from paddle.base import core

from .env import VARTYPE_OF


@functools.lru_cache(maxsize=None)
def lowp_kernels(device: str, dtype: str) -> frozenset[str]:
    """Op names with a ``dtype`` kernel on ``device`` ('CPU' or 'GPU'), forward and backward."""
    all_ops, supported, _ = core.op_supported_infos(device, VARTYPE_OF[dtype])
    supported = set(supported) & _non_onednn(device, dtype)
    all_ops = set(all_ops)
    usable = {op for op in supported
              if f"{op}_grad" not in all_ops or f"{op}_grad" in supported}
    return frozenset(usable | {"cast"})


def _non_onednn(device: str, dtype: str) -> set[str]:
    """Ops registering a ``dtype`` kernel on ``device`` other than a oneDNN or STRIDED one."""
    place = "cpu" if device == "CPU" else "gpu"
    key = re.compile(rf"data_type\[[\w:]*\b{dtype}\].*place\[Place\({place}")
    return {op for op, kernels in core._get_all_register_op_kernels("all").items()
            if any(key.search(k) and "library_type[MKLDNN]" not in k
                   and "data_layout[STRIDED]" not in k for k in kernels)}
