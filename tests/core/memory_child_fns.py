"""A measuring process for tests/core/test_memory.py: numpy workloads (no framework) served by
``amp_adapters.services.memory.main`` (run as ``python -m memory_child_fns NAME ARGS``)."""
import os

import numpy as np

from amp_adapters.services.memory import Workload, main

MIB = 1 << 20


class Counted:
    """A tensor counter that knows what the step allocates (``TensorBytes``), and whether it
    was started before the step it counts."""

    name = "the test's own count"

    def __init__(self):
        self.started = False
        self.live = 0

    def start(self):
        self.started = True

    def peak(self):
        return self.live if self.started else None


def allocates(mib):
    """A step that fills ``mib`` MiB and frees it."""
    def step():
        a = np.ones(mib * MIB // 8)
        a.sum()
    return Workload(step)


def counted(mib):
    """``allocates(mib)`` with a tensor counter that saw the step's array."""
    counter = Counted()

    def step():
        a = np.ones(mib * MIB // 8)
        counter.live = max(counter.live, a.nbytes) if counter.started else 0
    return Workload(step, tensors=counter)


def leaves_a_file():
    """A workload that leaves a file in the temporary directory, as MXNet's profiler does."""
    import tempfile
    with open(os.path.join(tempfile.gettempdir(), "left-behind.json"), "w") as f:
        f.write("{}")
    return allocates(1)


def raises():
    raise ValueError("this model does not build")


def not_a_workload():
    return 42


def knows_its_bytes(n):
    """A workload that states a figure of its own (what O2's parameter plan stores)."""
    return Workload(lambda: None, facts={"o2_param_bytes": n})


if __name__ == "__main__":
    main(allocates, counted, leaves_a_file, raises, not_a_workload, knows_its_bytes)
