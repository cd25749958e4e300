"""MXNet's tensor counter for the memory measurement (``mxnet_amp.memory.ProfilerBytes``): it
counts the storage a bracket allocates, from the profiler's own statistics."""
import mxnet as mx

from amp_adapters.services.memory import TensorBytes
from mxnet_amp.memory import ProfilerBytes, peak_from_stats

MIB = 1 << 20


def test_the_counter_sees_an_array_allocated_between_start_and_peak(tmp_path):
    counter: TensorBytes = ProfilerBytes(str(tmp_path / "trace.json"))
    counter.start()
    a = mx.nd.ones((MIB,))  # 4 MiB of float32
    a.wait_to_read()
    got = counter.peak()
    assert got is not None and got >= 4 * MIB
    assert "cpu/0" in counter.name


def test_the_profiler_is_off_after_the_bracket(tmp_path):
    counter = ProfilerBytes(str(tmp_path / "trace.json"))
    counter.start()
    counter.peak()
    assert mx.profiler.dumps(reset=True).count("cpu/0") == 0
    mx.nd.ones((MIB,)).wait_to_read()
    assert "cpu/0" not in mx.profiler.dumps(reset=True)


def test_the_counter_is_read_from_the_aggregate_in_kilobytes():
    stats = ("Memory Statistics\n=================\nName   Total Count  Min  Max  Avg\n"
             "  Memory: cpu/0                           4           0.0000        8388.6084"
             "        4194.3042\n")
    assert peak_from_stats(stats) == 8388608
    assert peak_from_stats("Profile Statistics:\n") is None
