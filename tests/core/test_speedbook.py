"""Measured speed kept: each key measured once, a saved profile replayed, the cache keyed by the
machine, bad files refused with the file and the key, an unwritable cache measured in memory."""
import json
import logging
import math
import multiprocessing
import os
import time

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from amp_adapters import AmpConfigError, Policy, OpCall, plan_op
from amp_adapters.rules.device import Cost, DeviceProfile, ShapeClass
from amp_adapters.services import speedbook
from amp_adapters.rules.isa import ISA_ENV, describe, machine
from amp_adapters.services.speedbook import (RETRY_AFTER_S, Failure, MeasuringFailed, ProfileFile,
                                             SpeedBook, gpu_key, machine_id, nvidia_gpu,
                                             parse_profile, read_profile, write_profile)

import speedbook_procs
from amp_adapters.services.timing import ratio_of, spread_of

MLP = ShapeClass.of([(64, 2048), (2048, 2048), (2048,)], result_rank=2)
HERE = {"cpu": "Test CPU", "flags": ["avx512_bf16", "avx512f"], "gpu": None, "isa": {}}


class Timer:
    """A ``measure`` that returns given costs and counts its calls."""

    def __init__(self, cost):
        self.cost, self.calls = cost, []

    def __call__(self, op, shape, training):
        self.calls.append((op, shape.key, training))
        if isinstance(self.cost, Exception):
            raise self.cost
        return self.cost


def later():
    """The clock of a process started after this one (a book counts from its process's
    start: ``speedbook.PROCESS_STARTED``)."""
    return time.time() + 60


def book(tmp_path, timer, **kw):
    kw.setdefault("here", HERE)
    return SpeedBook("mxnet", "1.9.1", "bfloat16", timer, cache=tmp_path / "cache.json", **kw)


def test_each_key_is_measured_once_and_the_cache_keeps_it(tmp_path):
    timer = Timer(Cost(0.6, 0.01, 0.7, 0.02))
    first = book(tmp_path, timer)
    assert first.lookup("FullyConnected", MLP, True) == timer.cost
    assert first.lookup("FullyConnected", MLP, True) == timer.cost
    assert len(timer.calls) == 1
    first.lookup("FullyConnected", MLP, False)  # inference is its own key
    assert len(timer.calls) == 2
    again = Timer(Cost(3.0, 0.0, 3.0, 0.0))  # a later process, a noisier moment
    assert book(tmp_path, again).lookup("FullyConnected", MLP, True) == timer.cost
    assert again.calls == []  # the decision once made is kept
    assert book(tmp_path, again, refresh=True, clock=later).lookup(
        "FullyConnected", MLP, True) == again.cost


def test_another_machine_does_not_read_this_machines_cache(tmp_path):
    book(tmp_path, Timer(Cost(0.6, 0.0))).lookup("FullyConnected", MLP)
    capped = {**HERE, "isa": {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE"}}
    timer = Timer(Cost(2.5, 0.0))
    assert book(tmp_path, timer, here=capped).lookup("FullyConnected", MLP).forward == 2.5
    assert timer.calls


def test_the_machine_key_holds_the_isa_limits():
    env = {"ONEDNN_MAX_CPU_ISA": "AVX2"}
    m = machine(environ=env)
    assert m["isa"] == env and set(ISA_ENV) >= set(m["isa"])
    assert machine_id(m) != machine_id(machine(environ={}))


def test_a_saved_profile_replays_the_plan_whatever_this_machine_would_measure(tmp_path,
                                                                              caplog):
    saved = book(tmp_path, Timer(Cost(0.5, 0.01, 0.5, 0.01)))
    saved.lookup("FullyConnected", MLP, True)
    saved.save(tmp_path / "cpu.json")
    policy = Policy.preset("auto", profile=str(tmp_path / "cpu.json"))
    elsewhere = {**HERE, "cpu": "Other CPU"}
    slow = Timer(Cost(4.0, 0.0, 4.0, 0.0))
    with caplog.at_level(logging.WARNING, logger="amp_adapters"):
        replay = SpeedBook("mxnet", "1.9.1", "bfloat16", slow, profile=policy.profile,
                           cache=tmp_path / "other.json", here=elsewhere)
    assert "measured on Test CPU" in caplog.text and "Other CPU" in caplog.text
    device = DeviceProfile({"FullyConnected"}, training=True, costs=replay.for_training(True))
    plans = {plan_op(policy, "mxnet", OpCall("FullyConnected", ("float32",) * 3, shape=MLP),
                     device=device).run_dtype for _ in range(3)}
    assert plans == {"bfloat16"} and slow.calls == []


def test_a_profile_from_another_framework_version_is_refused(tmp_path):
    b = book(tmp_path, Timer(Cost(0.5, 0.0)))
    b.lookup("FullyConnected", MLP)
    b.save(tmp_path / "cpu.json")
    with pytest.raises(AmpConfigError, match=r"cpu.json.*mxnet 1.9.1.*mxnet 2.0.0 is installed"):
        SpeedBook("mxnet", "2.0.0", "bfloat16", Timer(None), profile=tmp_path / "cpu.json",
                  cache=tmp_path / "c.json", here=HERE)


def test_a_crash_while_timed_is_recorded_as_an_error_never_raised(tmp_path):
    b = book(tmp_path, Timer(RuntimeError("could not create a primitive")))
    cost = b.lookup("Convolution", MLP, True)
    assert cost.error and "could not create a primitive" in cost.error
    d = plan_op(Policy.preset("auto"), "mxnet", OpCall("Convolution", ("float32",) * 3, shape=MLP),
                device=DeviceProfile({"Convolution"}, costs=b.for_training(False)))
    assert d.lacks_kernel


def test_an_op_without_a_recipe_is_not_cached(tmp_path):
    b = book(tmp_path, Timer(None))
    assert b.lookup("softmax", MLP) is None
    assert b.entries() == {}


def test_an_unwritable_cache_warns_once_and_measures_in_memory(tmp_path, caplog):
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    timer = Timer(Cost(0.6, 0.0))
    b = SpeedBook("mxnet", "1.9.1", "bfloat16", timer, cache=blocked / "sub" / "c.json",
                  here=HERE)
    with caplog.at_level(logging.WARNING, logger="amp_adapters"):
        b.lookup("FullyConnected", MLP)
        b.lookup("FullyConnected", ShapeClass.of([(8, 8)]))
        b.lookup("FullyConnected", MLP)
    assert caplog.text.count("cannot write the speed cache") == 1
    assert len(timer.calls) == 2


def test_a_broken_cache_is_measured_again(tmp_path, caplog):
    (tmp_path / "cache.json").write_text("{not json")
    timer = Timer(Cost(0.6, 0.0))
    with caplog.at_level(logging.WARNING, logger="amp_adapters"):
        assert book(tmp_path, timer).lookup("FullyConnected", MLP).forward == 0.6
    assert "ignoring the speed cache" in caplog.text


GOOD = {"amp_adapters_profile": 1, "machine": HERE, "entries": [
    {"framework": "mxnet", "version": "1.9.1", "dtype": "bfloat16+train", "op": "dot",
     "shape": "64x64;64x64>2", "forward": 0.5, "forward_spread": 0.01, "train": 0.6,
     "train_spread": 0.02}]}


@pytest.mark.parametrize("change, key", [
    (lambda d: d.update(amp_adapters_profile=2), "amp_adapters_profile"),
    (lambda d: d.update(extra=1), "extra"),
    (lambda d: d.update(machine=[]), "machine"),
    (lambda d: d.update(entries={}), "entries"),
    (lambda d: d["entries"][0].update(op=3), "entries[0].op"),
    (lambda d: d["entries"][0].update(forward=-1), "entries[0].forward"),
    (lambda d: d["entries"][0].update(forward=0), "entries[0].forward"),
    (lambda d: d["entries"][0].update(train="fast"), "entries[0].train"),
    (lambda d: d["entries"][0].update(when="now"), "entries[0].when"),
    (lambda d: d["entries"][0].pop("forward"), "entries[0].forward"),
])
def test_a_malformed_profile_names_the_file_and_the_key(tmp_path, change, key):
    data = json.loads(json.dumps(GOOD))
    change(data)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(AmpConfigError) as e:
        read_profile(path)
    assert "bad.json" in str(e.value) and f"{key} = " in str(e.value)


def test_not_json_and_missing_files_are_clear(tmp_path):
    (tmp_path / "x.json").write_text("{")
    with pytest.raises(AmpConfigError, match=r"x.json' is not JSON.*line 1"):
        read_profile(tmp_path / "x.json")
    with pytest.raises(AmpConfigError, match="does not exist; write one with `amp-adapters "
                                             "profile --save"):
        read_profile(tmp_path / "none.json")


@given(st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
                    lambda c: st.lists(c) | st.dictionaries(st.text(), c), max_leaves=20))
def test_any_structure_is_read_or_refused_clearly(data):
    try:
        parse_profile(data, "profile file 'x'")
    except AmpConfigError as e:
        assert str(e).startswith("profile file 'x': ")


def test_the_timer_interleaves_and_reports_the_median_ratio():
    clock = iter(range(10_000))
    order = []

    def tick():
        return next(clock)

    def low():
        order.append("low")
        next(clock)  # low takes 2 ticks, base 1

    def base():
        order.append("base")
    ratio, spread = ratio_of(low, base, warmup=1, min_pairs=4, max_pairs=4, clock=tick)
    assert (ratio, spread) == (2.0, 0.0)
    assert order[2:] == ["low", "base", "base", "low"] * 2  # the order flips each pair
    assert spread_of([1.0, 2.0, 3.0, 4.0, 100.0]) == (3.0, 1.0)


def test_two_books_sharing_a_cache_keep_each_others_entries(tmp_path):
    a, b = book(tmp_path, Timer(Cost(0.6, 0.0))), book(tmp_path, Timer(Cost(0.7, 0.0)))
    a.lookup("FullyConnected", MLP)
    b.lookup("Convolution", MLP)  # b read the cache before a wrote it
    keys = {k[3] for k in read_profile(tmp_path / "cache.json").entries}
    assert keys == {"FullyConnected", "Convolution"}


# -- issue 38 point 6: a failure is not a measurement; processes share one book --------------

def test_a_failure_of_the_measuring_is_not_kept_and_a_later_process_measures_again(
        tmp_path, caplog, monkeypatch):
    """A child that timed out, was killed or could not start says nothing about the op: it
    is not "no kernel"; processes started before its retry time (other ranks) plan it alike
    (not measured: float32), and one started after measures it."""
    monkeypatch.setattr(speedbook, "_warned", set())
    now = [1000.0]
    killed = Timer(MeasuringFailed("the measuring process ended (signal SIGKILL)"))
    with caplog.at_level(logging.WARNING, logger="amp_adapters"):
        assert book(tmp_path, killed, clock=lambda: now[0]).lookup(
            "FullyConnected", MLP, True) is None
    said = caplog.text
    assert "signal SIGKILL" in said and "not kept as a measurement" in said
    assert "measures it again" in said
    on_disk = read_profile(tmp_path / "cache.json")
    assert on_disk.costs() == {}  # no "no kernel" answer on disk
    failure, = on_disk.entries.values()
    assert failure.retry_after == 1000.0 + RETRY_AFTER_S
    meanwhile = book(tmp_path, killed, clock=lambda: now[0])
    plan = plan_op(Policy.preset("auto"), "mxnet", OpCall(
        "FullyConnected", ("float32",) * 3, shape=MLP),
        device=DeviceProfile({"FullyConnected"}, training=True,
                                        costs=meanwhile.for_training(True)))
    assert plan.run_dtype == "float32" and not plan.lacks_kernel  # not measured, not "no kernel"
    works = Timer(Cost(0.5, 0.01, 0.6, 0.01))
    now[0] += RETRY_AFTER_S / 2  # another rank, started meanwhile: the same answer, no timing
    assert book(tmp_path, works, clock=lambda: now[0]).lookup("FullyConnected", MLP,
                                                              True) is None
    assert works.calls == []
    now[0] += RETRY_AFTER_S  # a later process measures it again, and keeps the measurement
    assert book(tmp_path, works, clock=lambda: now[0]).lookup(
        "FullyConnected", MLP, True) == works.cost
    assert read_profile(tmp_path / "cache.json").costs() != {}


def test_an_op_that_fails_in_the_child_is_kept_a_dying_child_is_not(tmp_path):
    """The failures of a real measuring child: the op raised there or crashed it (SIGABRT:
    answers, kept as no kernel), the child ended otherwise (no answer, kept only until its
    retry time)."""
    from amp_adapters.services import measure_process

    def raises(op, shape, training):
        return measure_process.call("measure_child_fns", math.sqrt, -1)

    def crashes(op, shape, training):
        return measure_process.call("measure_child_fns", os.abort)

    def dies(op, shape, training):
        return measure_process.call("measure_child_fns", os._exit, 3)
    try:
        refused = book(tmp_path, raises).lookup("dot", MLP)
        assert refused.error and "math domain error" in refused.error
        crashed = book(tmp_path, crashes).lookup("batch_dot", MLP)
        assert crashed.error and "SIGABRT" in crashed.error
        assert book(tmp_path, dies).lookup("FullyConnected", MLP) is None
    finally:
        measure_process.close_all()
    kept = read_profile(tmp_path / "cache.json").entries
    assert isinstance(kept[book(tmp_path, dies).key("dot", MLP, False)], Cost)
    assert isinstance(kept[book(tmp_path, dies).key("batch_dot", MLP, False)], Cost)
    assert isinstance(kept[book(tmp_path, dies).key("FullyConnected", MLP, False)], Failure)


def test_refresh_measures_only_its_own_keys_and_keeps_every_other_entry(tmp_path):
    first = book(tmp_path, Timer(Cost(0.6, 0.01)))
    first.lookup("FullyConnected", MLP)
    model = ShapeClass.of([(None, 512), (512, 512)], 2)  # a model's key, timed by a run
    first.lookup("FullyConnected", model, True)
    first.lookup("FullyConnected", MLP, True)
    other = {("paddle", "2.6.2", "bfloat16", "mul", "64x8;8x16>2"): Cost(0.9, 0.01),
             ("mxnet", "1.9.1", "float16", "FullyConnected", MLP.key): Cost(1.4, 0.01)}
    disk = read_profile(tmp_path / "cache.json")
    disk.entries.update(other)
    write_profile(tmp_path / "cache.json", disk)
    again = Timer(Cost(0.4, 0.01, 0.5, 0.01))
    refresh = book(tmp_path, again, refresh=True, clock=later)
    assert refresh.lookup("FullyConnected", MLP) == again.cost  # measured again
    assert refresh.lookup("FullyConnected", MLP) == again.cost and len(again.calls) == 1
    assert refresh.remeasure() == 2  # the model's key and the training one: this dtype's
    kept = read_profile(tmp_path / "cache.json").entries
    assert {k: kept[k] for k in other} == other  # another framework, another dtype: kept
    assert kept[refresh.key("FullyConnected", model, True)] == again.cost
    assert len(kept) == 5


def test_a_stale_copy_does_not_overwrite_what_another_process_measured_since(tmp_path):
    """This process read the cache; another process then measured the GEMM again (a
    refresh); this process's next write keeps the other's newer entry."""
    calls = tmp_path / "calls"
    cache = tmp_path / "cache.json"
    here = speedbook_procs.rank_book(str(cache), str(calls), 0.6)
    here.lookup("FullyConnected", MLP)  # measured here: 0.6
    stale = speedbook_procs.rank_book(str(cache), str(calls), 0.7)  # read now, kept in memory
    ctx = multiprocessing.get_context("spawn")
    p = ctx.Process(target=speedbook_procs.refresh_one, args=(str(cache), str(calls), 0.9))
    p.start()
    p.join()
    assert p.exitcode == 0
    stale.lookup("Convolution", MLP)  # a write of this process's copy
    kept = read_profile(cache).entries
    assert kept[stale.key("FullyConnected", MLP, False)].forward == 0.9
    assert kept[stale.key("Convolution", MLP, False)].forward == 0.7


def test_ranks_on_one_host_measure_once_and_plan_alike(tmp_path):
    """Two ranks make their books on one cache, then look the same GEMM up at once: one
    measures (under the cache's lock), the other reads its answer, so both plan by the same
    number though each one's own timer would answer differently."""
    ctx = multiprocessing.get_context("spawn")
    barrier, answers = ctx.Barrier(2), ctx.Queue()
    calls = tmp_path / "calls"
    ranks = [ctx.Process(target=speedbook_procs.rank, args=(
        str(tmp_path / "cache.json"), str(calls), forward, barrier, answers))
        for forward in (0.5, 2.5)]
    for p in ranks:
        p.start()
    got = [answers.get(timeout=300) for _ in ranks]
    for p in ranks:
        p.join()
    assert [p.exitcode for p in ranks] == [0, 0]
    assert got[0] == got[1] and got[0] in (0.5, 2.5)
    assert len(calls.read_text().splitlines()) == 1  # measured once


# -- the key names what changes speed: threads, CPUs, the batch measured, the GPU ----------

@pytest.mark.parametrize("variable", ["OMP_NUM_THREADS", "MKL_NUM_THREADS",
                                      "MXNET_CPU_WORKER_NTHREADS", "CPU_NUM",
                                      "FLAGS_paddle_num_threads"])
def test_the_machine_key_holds_the_thread_settings(variable):
    one, four = machine(environ={variable: "1"}), machine(environ={variable: "4"})
    assert one["threads"] == {variable: "1"}
    assert machine_id(one) != machine_id(four) != machine_id(machine(environ={}))
    assert f"{variable}=1" in describe(one)


def test_the_machine_key_holds_the_cpus_this_process_may_use():
    assert machine(environ={})["cpus"] >= 1
    assert machine_id(machine(environ={}, ncpus=2)) != machine_id(machine(environ={}, ncpus=8))


def test_the_key_names_the_batch_an_unknown_dimension_was_measured_at(tmp_path):
    open_batch = ShapeClass.of([(None, 2048), (2048, 2048)], 2)
    timer = Timer(Cost(0.6, 0.01))
    b = book(tmp_path, timer)
    b.lookup("FullyConnected", open_batch)
    assert timer.calls == [("FullyConnected", "64x2048;2048x2048>2", False)]
    assert b.key("FullyConnected", open_batch, False)[4] == "64x2048;2048x2048>2"
    # a batch of 64 given is the same measurement; the backend's real batch is its own key
    b.lookup("FullyConnected", ShapeClass.of([(64, 2048), (2048, 2048)], 2))
    assert len(timer.calls) == 1
    told = SpeedBook("mxnet", "1.9.1", "bfloat16", timer, cache=tmp_path / "cache.json",
                     here=HERE, batch=200)
    told.lookup("FullyConnected", open_batch)
    assert timer.calls[-1] == ("FullyConnected", "256x2048;2048x2048>2", False)
    assert {k[4] for k in read_profile(tmp_path / "cache.json").entries} == {
        "64x2048;2048x2048>2", "256x2048;2048x2048>2"}


def test_a_gpu_is_keyed_by_its_name_and_compute_capability():
    """A GPU profile given as data (no GPU here): two GPUs are two machines."""
    a100 = machine(gpu=gpu_key("NVIDIA A100-SXM4-40GB", (8, 0)), environ={})
    v100 = machine(gpu=gpu_key("Tesla V100-SXM2-16GB", "7.0"), environ={})
    assert a100["gpu"] == "NVIDIA A100-SXM4-40GB (compute capability 8.0)"
    assert machine_id(a100) != machine_id(v100)
    assert "GPU NVIDIA A100-SXM4-40GB (compute capability 8.0)" in describe(a100)

    class Answer:
        def __init__(self, stdout, returncode=0):
            self.stdout, self.returncode = stdout, returncode
    asked = []
    facts = nvidia_gpu(1, run=lambda argv, **kw: asked.append(argv) or
                       Answer("NVIDIA A100-SXM4-40GB, 8.0\n"))
    assert facts == ("NVIDIA A100-SXM4-40GB", "8.0") and asked[0][-2:] == ["-i", "1"]
    assert nvidia_gpu(0, run=lambda argv, **kw: Answer("", 9)) is None


# -- the file's new fields and the shape key, as properties -----------------------------------

DIMS = st.one_of(st.none(), st.integers(1, 5000))
SHAPES = st.lists(st.one_of(st.none(), st.lists(DIMS, max_size=4)), max_size=4)


@given(SHAPES, st.one_of(st.none(), st.integers(0, 6)), st.one_of(st.none(), DIMS))
def test_a_key_reads_back_as_the_shape_class_it_was_measured_at(operands, rank, batch):
    """What ``remeasure`` reads from a cache entry (a shape as measured: no unknown
    dimension left; one lone scalar operand's key is empty, as no operands' is: no timed op
    has one)."""
    assume(operands != [[]])
    shape = speedbook.measured_shape(ShapeClass.of(operands, rank), batch)
    assert speedbook.shape_of(shape.key) == shape


WHEN = st.floats(0, 4e9, allow_nan=False)
KNOWN = st.one_of(
    st.builds(Cost, st.floats(0.01, 9), st.floats(0, 1), st.one_of(st.none(), st.floats(0.01, 9)),
              st.one_of(st.none(), st.floats(0, 1))),
    st.builds(lambda e: Cost(error=e), st.text(max_size=20)),
    st.builds(Failure, st.text(max_size=20), WHEN))


@given(st.dictionaries(st.tuples(*[st.text(max_size=6)] * 5), st.tuples(KNOWN, st.one_of(
    st.none(), WHEN)), max_size=5))
def test_measurements_failures_and_times_make_the_round_trip(rows):
    """What a cache keeps (a ratio, "no kernel", a failed timing with its retry time, when
    each was measured) is read back as written."""
    written = ProfileFile(HERE, {k: v for k, (v, _) in rows.items()},
                          {k: t for k, (_, t) in rows.items() if t is not None})
    back = parse_profile(json.loads(written.to_json()), "x")
    assert back.measured_at == written.measured_at
    for k, v in written.entries.items():
        got = back.entries[k]
        assert type(got) is type(v)
        if isinstance(v, Failure) or v.error is not None:
            assert got.error == v.error and getattr(got, "retry_after", None) == \
                getattr(v, "retry_after", None)
        else:
            assert got == v


def test_the_lock_is_taken_again_by_the_thread_that_holds_it(tmp_path):
    """A lookup that measures holds the cache's lock; a second book on the same file asked
    from inside (one process, two frameworks' books share a machine's file) does not wait
    for itself."""
    inner = book(tmp_path, Timer(Cost(0.7, 0.0)))
    outer = book(tmp_path, lambda op, shape, training: (
        inner.lookup("Convolution", MLP), Cost(0.6, 0.0))[1])
    assert outer.lookup("FullyConnected", MLP).forward == 0.6
    assert {k[3] for k in read_profile(tmp_path / "cache.json").entries} == {
        "FullyConnected", "Convolution"}


def test_a_cache_this_version_cannot_read_is_set_aside_not_overwritten(tmp_path):
    (tmp_path / "cache.json").write_text('{"amp_adapters_profile": 99, "entries": []}')
    timer = Timer(Cost(0.6, 0.01))
    assert book(tmp_path, timer).lookup("FullyConnected", MLP) == timer.cost
    aside, = tmp_path.glob("cache.json.unreadable-*")
    assert '"amp_adapters_profile": 99' in aside.read_text()  # another version's, kept
    assert list(read_profile(tmp_path / "cache.json").costs().values()) == [timer.cost]


def test_a_filesystem_without_flock_measures_without_the_lock(tmp_path, monkeypatch):
    import errno

    from amp_adapters.services import speedbook

    def no_flock(fd, how):
        raise OSError(errno.ENOLCK, "No locks available")
    monkeypatch.setattr(speedbook.fcntl, "flock", no_flock)
    with speedbook.locked(tmp_path / "cache.json") as held:
        assert held is False
    timer = Timer(Cost(0.6, 0.01))
    assert book(tmp_path, timer).lookup("FullyConnected", MLP) == timer.cost
