"""The speed source, declared once in the core (``amp_adapters.services.speed_source``): a runtime
supplies what to time (a ``Job``) and its timer module; the book, the lookup under measured
speed and the measuring child are the core's, the same for every runtime.

A pure-Python source stands in for a framework here (its timer is this folder's module,
run in the real measuring child); tests/consistency/test_speed_sources.py checks the three
runtimes' sources against the same protocol."""
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import pytest
from hypothesis import given, settings, strategies as st

from amp_adapters import Policy
from amp_adapters.services import measure_process, speed_source
from amp_adapters.rules.device import Cost, ShapeClass
from amp_adapters.services.speed_source import Job, SpeedSource

ROOT = Path(__file__).resolve().parents[2]


pytestmark = pytest.mark.usefixtures("own_speed_cache")  # (the root conftest)


@dataclass(frozen=True)
class Toy:
    """A source that times ``gemm`` at two-operand shapes (``speed_toy_timer`` answers)."""

    dtype: str = "bfloat16"
    framework: str = "toy"
    version: str = "1.0"
    timer: str = "speed_toy_timer"
    child: str = "speed_toy_child"
    gpu: Optional[str] = None

    def job(self, op, shape, training):
        if op != "gemm" or len(shape.operands) != 2:
            return None
        return Job(op, shape, training, self.dtype, {"k": shape.operands[0][-1]})




dims = st.one_of(st.none(), st.integers(1, 4096))
shapes = st.lists(st.one_of(st.none(), st.lists(dims, max_size=4).map(tuple)), max_size=3)


@given(st.text(min_size=1, max_size=12), shapes, st.one_of(st.none(), st.integers(0, 5)),
       st.booleans(), st.sampled_from(["bfloat16", "float16"]),
       st.dictionaries(st.text(max_size=5), st.integers() | st.booleans() | st.none(),
                       max_size=3))
def test_a_job_crosses_to_the_child_as_itself(op, operands, rank, training, dtype, how):
    import json
    job = Job(op, ShapeClass.of(operands, rank), training, dtype, how)
    assert Job.from_json(json.loads(json.dumps(job.to_json()))) == job


def test_a_toy_source_satisfies_the_protocol_and_a_half_made_one_does_not():
    assert isinstance(Toy(), SpeedSource)

    @dataclass(frozen=True)
    class NoTimer:
        dtype: str = "bfloat16"
        framework: str = "x"
        version: str = "1"
        gpu: Optional[str] = None

        def job(self, op, shape, training):
            return None
    assert not isinstance(NoTimer(), SpeedSource)


def test_the_core_times_a_sources_job_in_its_child_and_keeps_it_in_the_book():
    measure_process.close_all()
    book = speed_source.book(Toy())
    shape = ShapeClass.of([(64, 32), (32, 16)], 2)
    got = book.lookup("gemm", shape, True)
    assert got == Cost(forward=0.5, forward_spread=0.0, train=32.0, train_spread=0.0)
    children = [k for k, c in measure_process._children.items()
                if k[1] == "speed_toy_child" and c.proc.pid != os.getpid()]
    assert len(children) == 1
    # the key is the core's: this source's framework, version and dtype
    assert ("toy", "1.0", "bfloat16+train", "gemm", "64x32;32x16>2") in book.entries()
    assert speed_source.book(Toy()) is book  # one book per source in a process
    measure_process.close_all()


def test_only_what_the_source_can_time_is_looked_up():
    asked = []
    made = speed_source.book(Toy())
    made.measure = lambda *a: asked.append(a) or Cost(0.5, 0.01)
    costs = speed_source.costs(Toy(), Policy.preset("auto"), False)
    assert costs("relu", ShapeClass.of([(4, 4)], 2)) is None  # no job: not asked
    assert costs("gemm", ShapeClass.of([(4, 4), (4, 4)], 2)) == Cost(0.5, 0.01)
    assert [a[0] for a in asked] == ["gemm"]
    assert speed_source.costs(Toy(), Policy.preset("auto"), False) is costs  # kept: equal
    assert speed_source.costs(Toy(), Policy.preset("O1-bf16"), False) is None  # fixed speed


def test_no_runtime_builds_its_own_book_or_calls_its_child():
    """A rule lives in one place: the backends supply sources; none makes a ``SpeedBook`` or
    calls a measuring child itself, and each child module serves the core's job timer (and,
    after it, the kernel questions the core's ``device_book`` asks there)."""
    found = []
    for pkg in ("mxnet_amp", "paddle_amp"):
        for path in (ROOT / pkg).rglob("*.py"):
            text = path.read_text()
            for pattern in (r"\bSpeedBook\(", r"measure_process import call", r"\bcall\(\""):
                if re.search(pattern, text):
                    found.append(f"{path.relative_to(ROOT)}: {pattern}")
            if re.search(r"\bserve\(", text) and (
                    not re.search(r"serve\(time_job[,)]", text) or
                    "from amp_adapters.services.speed_source import time_job" not in text):
                found.append(f"{path.relative_to(ROOT)}: serves its own functions")
    assert found == []


def test_a_profile_gets_the_cores_costs_only_where_the_policy_measures():
    """Where the policy does not measure the source is not even made (a source may ask the
    framework for its device: a GPU's name)."""
    from amp_adapters.rules.device import DeviceProfile
    device = DeviceProfile(frozenset({"gemm"}), training=True)
    assert speed_source.profile(device, Policy.preset("O1-bf16"),
                                lambda: pytest.fail("a source made for fixed speed")) is device
    got = speed_source.profile(device, Policy.preset("auto"), Toy)
    assert got.kernels == device.kernels and got.training
    assert got.costs is speed_source.costs(Toy(), Policy.preset("auto"), True)
    assert speed_source.profile(device, Policy.preset("auto"), Toy) == got  # kept: equal


DIMS = st.lists(st.integers(1, 4), min_size=2, max_size=4)


@settings(max_examples=200, deadline=None)
@given(DIMS, DIMS)
def test_gemm_transposes_are_those_a_matmul_multiplies(a, b):
    """The one shape-class-to-GEMM rule (every runtime's timer reads its transposes from it):
    an answer is a pair of transposes numpy's matmul multiplies, and where it answers None
    no pair does."""
    import numpy as np

    def multiplies(ta, tb):
        x, y = np.zeros(a), np.zeros(b)
        try:
            np.matmul(np.swapaxes(x, -1, -2) if ta else x, np.swapaxes(y, -1, -2) if tb else y)
        except ValueError:
            return False
        return True
    got = speed_source.gemm_transposes(tuple(a), tuple(b))
    pairs = [(ta, tb) for ta in (False, True) for tb in (False, True)]
    if got is None:
        assert not any(multiplies(*p) for p in pairs)
    else:
        assert multiplies(*got) and got == next(p for p in pairs if multiplies(*p))


def test_cost_of_times_the_forward_then_the_training_step_in_one_budget(monkeypatch):
    """How every timer times a job, once: the forward ratio, and for training the forward
    and backward one, each within ``BUDGET_S`` (``ratio_of`` answers as data here)."""
    asked = []
    monkeypatch.setattr(speed_source, "ratio_of", lambda low, base, budget_s: (
        asked.append((low(), base(), budget_s)) or (0.5 + 0.1 * len(asked), 0.01)))

    def runs(name):
        return lambda backward: lambda: (name, backward)
    assert speed_source.cost_of(runs("low"), runs("base"), False) == Cost(0.6, 0.01)
    assert speed_source.cost_of(runs("low"), runs("base"), True) == Cost(0.7, 0.01, 0.8, 0.01)
    b = speed_source.BUDGET_S
    assert asked == [(("low", False), ("base", False), b), (("low", False), ("base", False), b),
                     (("low", True), ("base", True), b)]
