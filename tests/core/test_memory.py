"""The memory measurement itself, with numpy workloads only (no framework figure is asserted):
a step that allocates more peaks higher, the high-water mark is reset before the step (and
without ``clear_refs`` the peak is the process's ``ru_maxrss``, and says so), the framework's
counter brackets one more step, each figure is the median of its runs, and the measuring
process runs with fixed threads and allocator."""
import os

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from amp_adapters.services import memory
from amp_adapters.services.memory import (MemoryMeasureFailed, StepMemory, Workload, fixed_env,
                                          measure, measure_here, measure_once, median, reset_peak)
from amp_adapters.rules.isa import THREAD_ENV

import memory_child_fns as fns

SERVER = "memory_child_fns"  # this folder's measuring process
MIB = 1 << 20


def test_a_step_that_allocates_more_peaks_higher_by_what_it_allocates():
    small = measure_once(SERVER, fns.allocates, 8)
    large = measure_once(SERVER, fns.allocates, 72)
    assert small.peak_source == large.peak_source
    # the 64 MiB more the large step fills, within the pages a process touches around it
    assert 56 * MIB <= large.transient - small.transient <= 72 * MIB
    assert 56 * MIB <= large.peak - small.peak <= 72 * MIB
    assert large.transient == large.peak - large.before


@pytest.mark.skipif(not reset_peak(), reason="/proc/self/clear_refs cannot be written here")
def test_the_high_water_mark_is_reset_before_the_measured_step():
    """An earlier, larger allocation of the process is not the step's peak."""
    earlier = np.ones(256 * MIB // 8)
    del earlier
    got = measure_here(fns.allocates(8))
    assert got.peak_source == "VmHWM"
    assert got.transient < 64 * MIB


def test_without_clear_refs_the_peak_is_ru_maxrss_and_says_so(tmp_path):
    earlier = np.ones(256 * MIB // 8)
    del earlier
    got = measure_here(fns.allocates(8), clear_refs=str(tmp_path / "no" / "clear_refs"))
    assert got.peak_source == "ru_maxrss"
    assert got.transient >= 200 * MIB  # the process's highest since it started: an upper bound


def test_the_framework_counter_is_started_before_a_step_of_its_own():
    got = measure_once(SERVER, fns.counted, 16)
    assert got.tensor_peak == 16 * MIB
    assert got.tensor_source == "the test's own count"
    assert measure_once(SERVER, fns.allocates, 16).tensor_peak is None


def test_a_measuring_process_has_a_temporary_directory_of_its_own(tmp_path, monkeypatch):
    """What a framework leaves in the temporary directory at exit (MXNet's profiler trace)
    is removed with the process's own directory."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    measure_once(SERVER, fns.leaves_a_file)
    assert not list(tmp_path.iterdir())


def test_measure_is_the_median_of_fresh_processes():
    got = measure(SERVER, fns.allocates, 8, runs=3)
    assert got.runs == 3
    with pytest.raises(ValueError, match="runs must be at least 1"):
        measure(SERVER, fns.allocates, 8, runs=0)


def test_a_workload_that_fails_to_build_fails_the_measurement_with_its_error():
    with pytest.raises(MemoryMeasureFailed, match="ValueError: this model does not build"):
        measure_once(SERVER, fns.raises)
    with pytest.raises(MemoryMeasureFailed, match="not a Workload"):
        measure_once(SERVER, fns.not_a_workload)


def test_the_measuring_process_has_fixed_threads_and_allocator(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "7")
    monkeypatch.setenv("MALLOC_ARENA_MAX", "8")
    env = fixed_env(threads=2)
    assert env["OMP_NUM_THREADS"] == env["MXNET_CPU_WORKER_NTHREADS"] == "2"
    assert env["MALLOC_MMAP_THRESHOLD_"] == memory.ALLOCATOR["MALLOC_MMAP_THRESHOLD_"]
    assert env["MALLOC_ARENA_MAX"] == "1"
    assert "MXNET_ENGINE_TYPE" not in env or env["MXNET_ENGINE_TYPE"] == \
        os.environ.get("MXNET_ENGINE_TYPE")
    assert "PYTHONPATH" in env  # the measuring process imports what this one does
    assert fixed_env({"DNNL_MAX_CPU_ISA": "AVX2"})["DNNL_MAX_CPU_ISA"] == "AVX2"
    line = memory.stated(env)
    assert "OMP_NUM_THREADS=2" in line and "MALLOC_MMAP_THRESHOLD_=131072" in line
    with pytest.raises(ValueError, match="threads must be at least 1"):
        fixed_env(threads=0)


def test_a_workload_is_checked():
    with pytest.raises(ValueError, match="warmup must be at least 1"):
        Workload(lambda: None, warmup=0)
    with pytest.raises(TypeError, match="must be callable"):
        Workload(42)


def _run(peak, before, source, tensor):
    return StepMemory(peak=peak, before=before, transient=peak - before, peak_source=source,
                      tensor_peak=tensor)


runs = st.lists(st.builds(lambda before, extra, source, tensor:
                          _run(before + extra, before, source, tensor),
                          st.integers(0, 1 << 34), st.integers(0, 1 << 32),
                          st.sampled_from(["VmHWM", "ru_maxrss"]),
                          st.one_of(st.none(), st.integers(0, 1 << 32))),
                min_size=1, max_size=7)


@given(runs)
def test_each_figure_is_the_median_of_the_runs_figure(results):
    got = median(results)
    for field in ("peak", "before", "transient"):
        values = sorted(getattr(r, field) for r in results)
        assert getattr(got, field) in values
        below = sum(v <= getattr(got, field) for v in values)
        above = sum(v >= getattr(got, field) for v in values)
        assert below >= len(values) / 2 and above >= (len(values) + 1) // 2
    assert got.runs == len(results)
    assert (got.peak_source == "VmHWM") == all(r.peak_source == "VmHWM" for r in results)
    tensors = [r.tensor_peak for r in results]
    assert (got.tensor_peak is None) == (None in tensors)


def test_median_of_nothing_and_a_bad_source_are_errors():
    with pytest.raises(ValueError, match="at least one"):
        median([])
    with pytest.raises(ValueError, match="peak_source must be one of"):
        StepMemory(peak=1, before=0, transient=1, peak_source="top")


def test_a_workloads_own_figures_reach_the_result_beside_the_measured_ones():
    got = measure(SERVER, fns.knows_its_bytes, 1234, runs=2)
    assert got.facts == {"o2_param_bytes": 1234}
    assert StepMemory(**got.to_dict()) == got


def test_a_measuring_process_may_be_another_interpreter(tmp_path):
    """``python=``: the interpreter that runs the child (Paddle 3's beside a Paddle 2 bench);
    one that does not exist is a failed measurement naming it."""
    import sys
    assert measure_once(SERVER, fns.allocates, 1, python=sys.executable).peak > 0
    missing = str(tmp_path / "python")
    with pytest.raises((MemoryMeasureFailed, OSError)):
        measure_once(SERVER, fns.allocates, 1, python=missing)
