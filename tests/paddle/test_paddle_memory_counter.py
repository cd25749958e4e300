"""Paddle's tensor counter for the memory measurement (``paddle_amp.memory.HostAllocatorBytes``):
the host allocator's peak, reset where Paddle can (Paddle 3), since start where it cannot."""
import os
import subprocess
import sys

import paddle
from paddle.base import core

from paddle_amp.memory import HostAllocatorBytes

MIB = 1 << 20


def test_the_counter_sees_a_tensor_held_between_start_and_peak():
    """In a fresh process, as the measurement runs it (on Paddle 2.6.2 the peak is the
    process's since it started: in this long-lived one, earlier tests' peaks hide it)."""
    code = ("import paddle\n"
            "from paddle_amp.memory import HostAllocatorBytes\n"
            "counter = HostAllocatorBytes()\n"
            "counter.start()\n"
            f"t = paddle.ones([{MIB}], 'float32')  # 4 MiB from Paddle's own allocator\n"
            "print(counter.peak())\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert int(out.stdout.split()[-1]) >= 4 * MIB


def test_the_name_says_whether_the_peak_was_reset():
    counter = HostAllocatorBytes()
    resets = hasattr(core, "host_memory_stat_reset_peak_value")
    assert ("since the process started" in counter.name) != resets
