"""``found_inf`` across data-parallel workers: one in-graph all-reduce (max) per step.

When each worker checks its *local* gradients (the check runs before the
gradient all-reduce), one worker's inf would make only that worker skip and
back off, and the workers' parameters and scales would drift apart. So
``found_inf`` is all-reduced right after ``check_finite_and_unscale`` and
before everything that reads it: every worker then takes the same decision and
keeps a bit-identical scale state.
"""
from __future__ import annotations

import os
from typing import Optional

import numpy as np
import paddle
from paddle.base import framework

from .env import VarType
from .legacy_ops import BlockOps


def resolve_ring_id(setting) -> Optional[int]:
    """The ring to all-reduce ``found_inf`` over, or None for no reduction.

    ``None`` (auto): ring 0 when this process is one of several data-parallel
    workers (``paddle.distributed.get_world_size() > 1`` or ``PADDLE_TRAINERS_NUM > 1``,
    as ``python -m paddle.distributed.launch`` sets), else no reduction. ``False``: never.
    ``True``: ring 0. An int >= 0: that ring (it must be initialised when the program runs).
    """
    if setting is None:
        try:
            world = int(paddle.distributed.get_world_size())
        except Exception:  # noqa: BLE001 - a build without the distributed env: use the env var
            world = 1
        world = max(world, int(os.environ.get("PADDLE_TRAINERS_NUM", "1") or 1))
        return 0 if world > 1 else None
    if setting is False:
        return None
    if setting is True:
        return 0
    if isinstance(setting, (int, np.integer)) and setting >= 0:
        return int(setting)
    raise TypeError(f"found_inf_ring_id must be None (auto), False (off), True or a ring id "
                    f"(int >= 0), got {setting!r}")


def reduce_found_inf(block, found_inf, ring_id: int):
    """``found_inf`` (bool[1]) OR-ed over every worker of ``ring_id``: a new bool[1] var.

    One in-graph all-reduce (max) of an int32 cast of the flag (the CPU/gloo kernels
    have no bool), appended to ``block``: no host sync, 4 bytes per step. The op is
    ``c_allreduce_max`` where registered (Paddle 2.6), else ``all_reduce`` with
    ``reduce_type`` 1 = max (Paddle 3.x, which dropped ``c_allreduce_*``); like any
    collective it needs the ring's communicator (NCCL on GPU, gloo on CPU) at run time.
    """
    ops = BlockOps(block)
    as_int = ops.cast(found_inf, VarType.INT32)
    if "c_allreduce_max" in framework.OpProtoHolder.instance().op_proto_map:
        block.append_op(type="c_allreduce_max", inputs={"X": [as_int]}, outputs={"Out": [as_int]},
                        attrs={"ring_id": ring_id, "use_calc_stream": True})
    else:
        block.append_op(type="all_reduce", inputs={"x": [as_int]}, outputs={"out": [as_int]},
                        attrs={"ring_id": ring_id, "reduce_type": 1})
    return ops.cast(as_int, VarType.BOOL)
