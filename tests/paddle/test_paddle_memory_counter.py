"""Paddle's tensor counter for the memory measurement (``paddle_amp.memory.HostAllocatorBytes``):
the host allocator's peak, reset where Paddle can (Paddle 3), since start where it cannot."""
import numpy as np
import paddle
from paddle.base import core

from amp_adapters.memory import TensorBytes
from paddle_amp.memory import HostAllocatorBytes

MIB = 1 << 20


def test_the_counter_sees_a_tensor_held_between_start_and_peak():
    counter: TensorBytes = HostAllocatorBytes()
    counter.start()
    t = paddle.to_tensor(np.ones(MIB, "float32"))  # 4 MiB
    got = counter.peak()
    assert got >= 4 * MIB
    del t


def test_the_name_says_whether_the_peak_was_reset():
    counter = HostAllocatorBytes()
    resets = hasattr(core, "host_memory_stat_reset_peak_value")
    assert ("since the process started" in counter.name) != resets
