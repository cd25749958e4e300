"""amp_adapters.services.native_speed: when the native's bf16 decisions are slower than float32,
known
without timing (the CPU's flags and oneDNN's ISA caps as data, a speed cache on disk)."""
import logging
import re
import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from amp_adapters.services import native_speed as ns
from amp_adapters.services import speedbook
from amp_adapters.rules.device import Cost
from amp_adapters.rules.isa import cap, describe_bf16, why_emulated
from amp_adapters.services.speedbook import ProfileFile, write_profile

AVX512 = ["avx2", "avx512bw", "avx512dq", "avx512f", "avx512vl"]
OPS = frozenset({"FullyConnected"})
# a speed figure as a message prints it: 2.50x, 1.0-1.3x
RATIO = re.compile(r"\d+(?:\.\d+)?x(?![0-9])")


def _m(flags, isa=None):
    return {"cpu": "Test CPU", "flags": flags, "gpu": None, "isa": isa or {}}


def test_the_rule_names_avx512_without_bf16_and_caps_between_core_and_bf16():
    assert "without avx512_bf16" in why_emulated(_m(AVX512))
    assert why_emulated(_m(AVX512 + ["avx512_bf16"])) is None
    capped = _m(AVX512 + ["avx512_bf16"], {"ONEDNN_MAX_CPU_ISA": "avx512_core"})
    assert "ONEDNN_MAX_CPU_ISA=avx512_core" in why_emulated(capped)
    # below AVX512_CORE, or no AVX-512: no bf16 kernel at all (a fallback, not a slowdown)
    assert why_emulated(_m(AVX512, {"DNNL_MAX_CPU_ISA": "AVX2"})) is None
    assert why_emulated(_m(["avx2"])) is None
    assert cap(_m([], {"DNNL_MAX_CPU_ISA": "AVX512_CORE_BF16",
                       "ONEDNN_MAX_CPU_ISA": "AVX2"})) == ("ONEDNN_MAX_CPU_ISA", "AVX2")


def test_a_measured_profile_on_disk_names_the_op_and_its_ratio(tmp_path):
    m = _m(AVX512 + ["avx512_bf16"])
    path = tmp_path / "cache.json"
    write_profile(path, ProfileFile(m, {
        ("fw", "1", "bfloat16+train", "FullyConnected", "64x2048"): Cost(1.9, 0.01, 2.4, 0.02),
        ("fw", "1", "bfloat16+train", "Other", "64x2048"): Cost(3.0, 0.0, 3.0, 0.0),
        ("fw", "1", "bfloat16", "FullyConnected", "64x2048"): Cost(0.6, 0.01)}))
    line = ns.native_slowdown("x_amp", "fw", "1", "bfloat16", OPS, True, m, path)
    assert line.startswith("x_amp: ") and "FullyConnected 2.40x" in line
    assert "Other" not in line and 'policy="auto"' in line and "\n" not in line
    # inference measured faster, a bf16 CPU: nothing to say
    assert ns.native_slowdown("x_amp", "fw", "1", "bfloat16", OPS, False, m, path) is None
    # by rule, without a profile: what it may do, and no figure (none was measured here)
    line = ns.native_slowdown("x_amp", "fw", "1", "bfloat16", OPS, True, _m(AVX512),
                              tmp_path / "none.json")
    assert "FullyConnected" in line and "info --measure" in line
    assert not RATIO.search(line)


def test_said_once_per_process(monkeypatch, caplog):
    monkeypatch.setattr(speedbook, "_warned", set())
    log = logging.getLogger("x_amp")
    with caplog.at_level(logging.WARNING, logger="x_amp"):
        assert ns.say_once(log, "x_amp: slower") and not ns.say_once(log, "x_amp: slower")
        assert not ns.say_once(log, None)
    assert len(caplog.records) == 1


# -- issue 38 point 7: say only what was measured -------------------------------------------

CLASSES = {"native": AVX512 + ["avx512_bf16"], "emulated": AVX512, "none": ["avx2"]}
ISA_CAPS = st.sampled_from([{}, {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE"},
                            {"DNNL_MAX_CPU_ISA": "AVX2"}])
COSTS = st.builds(Cost, st.floats(0.05, 5.0), st.floats(0.0, 0.5), st.floats(0.05, 5.0),
                  st.floats(0.0, 0.5))
BOOK = st.dictionaries(st.tuples(st.sampled_from(["bfloat16", "bfloat16+train", "float16"]),
                                 st.sampled_from(["FullyConnected", "Convolution", "dot"]),
                                 st.sampled_from(["64x2048;2048x2048", "8x8;8x8"])),
                       COSTS, max_size=6)


@settings(max_examples=60, deadline=None)
@given(flags=st.sampled_from(sorted(CLASSES.values())), isa=ISA_CAPS, book=BOOK,
       training=st.booleans(),
       ops=st.frozensets(st.sampled_from(["FullyConnected", "Convolution", "dot"]),
                         max_size=3))
def test_no_message_prints_a_ratio_that_is_not_in_the_book(flags, isa, book, training, ops):
    """Whatever the CPU class and whatever this machine's book holds, every speed figure the
    drop-ins' line prints is one of the book's measured ratios (as printed), and the line
    about the CPU class (``amp-adapters info``) prints none."""
    m = _m(flags, isa)
    entries = {("fw", "1", dt, op, shape): c for (dt, op, shape), c in book.items()}
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "cache.json"
        write_profile(path, ProfileFile(m, entries))
        line = ns.native_slowdown("x_amp", "fw", "1", "bfloat16", ops, training, m, path)
    measured = {f"{c.ratio(training)[0]:.2f}x" for c in entries.values()}
    assert set(RATIO.findall(line or "")) <= measured, line
    assert not RATIO.search(describe_bf16(m))
