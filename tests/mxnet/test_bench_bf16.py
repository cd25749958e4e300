"""bench/bf16_cpu: on a CPU without bf16 kernels every MXNet row says it cannot run, and why
(decided by the probe); where the kernels exist the rows are timed by `make bench`, not here."""
import sys
from pathlib import Path

import mxnet as mx
import pytest

from amp_adapters.rules.isa import describe_bf16, machine
from mxnet_amp.kernels import has_kernel

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench import __main__ as bench_main  # noqa: E402
from bench import bf16_cpu  # noqa: E402


def test_the_section_is_registered():
    assert "bf16_cpu" in bench_main.SECTIONS


@pytest.mark.skipif(has_kernel("FullyConnected", mx.cpu(), "bfloat16"),
                    reason="this CPU has bf16 kernels: the rows are timed by make bench")
def test_rows_without_kernels_say_why_and_time_nothing():
    rows = bf16_cpu.mxnet_inference_rows()
    assert len(rows) == len(bf16_cpu.MODELS)
    for row in rows:
        assert "cannot run: no bfloat16" in row and describe_bf16(machine()) in row, row
