"""Measured speed kept: each key measured once, a saved profile replayed, the cache keyed by the
machine, bad files refused with the file and the key, an unwritable cache measured in memory."""
import json
import logging

import pytest
from hypothesis import given
from hypothesis import strategies as st

from amp_adapters import AmpConfigError, Policy, plan_op
from amp_adapters.device import Cost, DeviceProfile, ShapeClass
from amp_adapters.speedbook import (ISA_ENV, SpeedBook, machine, machine_id, parse_profile,
                                    read_profile)
from amp_adapters.timing import ratio_of, spread_of

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
    assert book(tmp_path, again, refresh=True).lookup("FullyConnected", MLP, True) == again.cost


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
    plans = {plan_op(policy, "mxnet", "FullyConnected", ("float32",) * 3, device=device,
                     shape=MLP).run_dtype for _ in range(3)}
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
    d = plan_op(Policy.preset("auto"), "mxnet", "Convolution", ("float32",) * 3,
                device=DeviceProfile({"Convolution"}, costs=b.for_training(False)), shape=MLP)
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
