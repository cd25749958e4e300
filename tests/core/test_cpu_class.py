"""Running as another CPU class (``AMP_ADAPTERS_CPU``): the device truth answers as that class,
and oneDNN is limited to match in this process and in every child. Machines as data."""
import os
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from amp_adapters.rules import isa
from amp_adapters.services import measure_process
from amp_adapters.rules.errors import AmpConfigError
from amp_adapters.rules.isa import bf16_class, machine, onednn_env, simulate, simulated
from amp_adapters.services.speedbook import machine_id

AVX512 = ["avx2", "avx512bw", "avx512dq", "avx512f", "avx512vl"]
FLAGS = AVX512 + ["avx512_bf16", "amx_tile", "avx512_vnni", "avx512_fp16", "fma"]
RANK = {"none": 0, "emulated": 1, "native": 2}


def _m(flags, caps=None):
    return {"cpu": "Test CPU", "flags": sorted(flags), "gpu": None, "isa": caps or {}}


@pytest.mark.parametrize("flags, kind, want", [
    (AVX512 + ["avx512_bf16"], "avx2", "none"),
    (AVX512 + ["avx512_bf16"], "avx512_core", "emulated"),
    (AVX512 + ["amx_tile"], "avx512_core", "emulated"),
    (AVX512, "avx512_core", "emulated"),
    (["avx2"], "avx512_core", "none"),  # a class is a ceiling: no CPU is simulated upward
])
def test_the_simulated_class_is_what_the_device_truth_answers(flags, kind, want):
    got = simulate(_m(flags), {"AMP_ADAPTERS_CPU": kind})
    assert bf16_class(got) == want
    assert got["simulated"] == kind
    assert not any(f.startswith(("avx512_bf16", "amx")) for f in got["flags"])


@given(st.lists(st.sampled_from(FLAGS), unique=True),
       st.sampled_from([None, "avx2", "avx512_core"]),
       st.sampled_from([None, "AVX2", "AVX512_CORE", "AVX512_CORE_BF16", "ALL"]))
def test_a_simulated_class_never_raises_the_class_and_caps_oneDNN_to_match(flags, kind, cap):
    env = {"AMP_ADAPTERS_CPU": kind} if kind else {}
    if cap:
        env["ONEDNN_MAX_CPU_ISA"] = cap
    real = _m(flags, {"ONEDNN_MAX_CPU_ISA": cap} if cap else {})
    seen = simulate(real, env)
    assert RANK[bf16_class(seen)] <= RANK[bf16_class(real)]
    if kind is None:
        assert seen == real and onednn_env(env) == {}
        return
    limits = onednn_env(env)
    assert set(limits) == set(isa.ISA_ENV)
    ceiling = isa.ORDER.index(isa.SIMULATED[kind])
    assert all(isa.ORDER.index(v.upper()) <= ceiling for v in limits.values())
    assert RANK[bf16_class(seen)] <= (0 if kind == "avx2" else 1)


def test_a_lower_limit_already_set_is_kept():
    env = {"AMP_ADAPTERS_CPU": "avx512_core", "DNNL_MAX_CPU_ISA": "AVX2"}
    assert onednn_env(env) == {"DNNL_MAX_CPU_ISA": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX512_CORE"}


@pytest.mark.parametrize("value", ["avx512", "AVX-2", "native", "sse"])
def test_an_unknown_class_is_refused_naming_the_classes(value):
    with pytest.raises(AmpConfigError, match=r"AMP_ADAPTERS_CPU=.*avx2 or avx512_core"):
        simulated({"AMP_ADAPTERS_CPU": value})


def test_a_simulated_machine_has_its_own_cache_file(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("model name\t: Test CPU\nflags : avx2 avx512f avx512bw avx512vl avx512dq "
                    "avx512_bf16\n")
    real = machine(str(info), environ={})
    as_avx2 = machine(str(info), environ={"AMP_ADAPTERS_CPU": "avx2"})
    assert bf16_class(real) == "native" and bf16_class(as_avx2) == "none"
    assert machine_id(real) != machine_id(as_avx2)
    assert "run as the CPU class avx2" in isa.describe_bf16(as_avx2)


def test_importing_the_core_limits_onednn_for_the_frameworks_to_come():
    env = {k: v for k, v in os.environ.items() if k not in isa.ISA_ENV}
    out = subprocess.run(
        [sys.executable, "-c", "import os, amp_adapters; "
         "print(os.environ['DNNL_MAX_CPU_ISA'], os.environ['ONEDNN_MAX_CPU_ISA'])"],
        env={**env, "AMP_ADAPTERS_CPU": "avx2"}, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["AVX2", "AVX2"]


def test_a_measuring_child_runs_under_the_simulated_limits(monkeypatch):
    monkeypatch.syspath_prepend(os.path.dirname(__file__))
    for k in isa.ISA_ENV:
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("AMP_ADAPTERS_CPU", "avx512_core")
    try:
        got = [measure_process.call("measure_child_fns", os.getenv, k) for k in isa.ISA_ENV]
    finally:
        measure_process.close_all()
    assert got == ["AVX512_CORE", "AVX512_CORE"]


def test_a_framework_imported_first_is_named_in_a_warning():
    env = {k: v for k, v in os.environ.items() if k not in isa.ISA_ENV}
    out = subprocess.run(
        [sys.executable, "-W", "always", "-c", "import paddle; "
         "import amp_adapters"],
        env={**env, "AMP_ADAPTERS_CPU": "avx2"}, capture_output=True, text=True, check=True)
    assert "a framework was imported first" in out.stderr
