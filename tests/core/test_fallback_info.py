"""amp-adapters info: rendered from each backend's kernel answer (plain data here)."""
import pytest

from amp_adapters.services import fallback as info
from amp_adapters.rules.isa import bf16_class, describe_bf16, machine

AVX512 = ["avx512bw", "avx512dq", "avx512f", "avx512vl"]
from amp_adapters.services.cli import main


def _gemm_only(device, dtype):
    return frozenset({"FullyConnected"}) if dtype == "bfloat16" else frozenset()


def _broken(device, dtype):
    raise ImportError("no module named mxnet")


def test_real_kernels_and_what_amp_does_with_the_rest():
    tables = info.gather({"mxnet": _gemm_only}, dtypes=("bfloat16",))
    (t,) = tables
    assert t.real == ("FullyConnected",)
    rows = {r.op: r for r in t.rows}
    assert rows["FullyConnected"].execution == "kernel"
    assert rows["Convolution"].execution == "fell back" and not rows["Convolution"].has_kernel
    text = info.render_info(tables, {"cpu": "Some CPU", "flags": [], "isa": {}})
    assert text.splitlines()[0] == "CPU: Some CPU (no AVX-512): oneDNN runs no bfloat16 " \
        "kernel here"
    assert "mxnet CPU bfloat16: 1 of 2 ops the lists lower have a real kernel: " \
           "FullyConnected" in text
    assert "AMP runs them in float32" in text and "Convolution" in text


def test_a_framework_that_cannot_answer_is_one_line_not_a_crash():
    text = info.render_info(info.gather({"mxnet": _broken}, dtypes=("float16",)),
                            {"cpu": "X", "flags": AVX512, "isa": {}})
    assert "CPU: X (avx512bw avx512dq avx512f avx512vl): oneDNN runs bfloat16 without bf16 " \
        "instructions" in text
    assert "mxnet CPU float16: cannot tell (ImportError: no module named mxnet)" in text


def test_no_backend_says_so():
    assert "no framework backend registered" in info.render_info([], {"cpu": "X"})


def test_the_machine_reads_the_model_the_flags_and_the_isa_limits(tmp_path):
    f = tmp_path / "cpuinfo"
    f.write_text("model name\t: Test CPU\nflags : fpu sse avx2 avx512f avx512_bf16 amx_tile\n")
    m = machine(str(f), environ={"DNNL_MAX_CPU_ISA": "AVX512_CORE", "OMP_NUM_THREADS": "1"},
                ncpus=2)
    assert m == {"cpu": "Test CPU", "flags": ["amx_tile", "avx2", "avx512_bf16", "avx512f"],
                 "gpu": None, "isa": {"DNNL_MAX_CPU_ISA": "AVX512_CORE"}, "cpus": 2,
                 "threads": {"OMP_NUM_THREADS": "1"}}
    assert machine(str(tmp_path / "missing"), environ={})["flags"] == []


@pytest.mark.parametrize("flags, isa, kind", [
    (AVX512 + ["avx512_bf16"], {}, "native"),
    (AVX512 + ["amx_bf16"], {}, "native"),
    (AVX512 + ["avx512_bf16"], {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE"}, "emulated"),
    (AVX512 + ["avx512_bf16"], {"DNNL_MAX_CPU_ISA": "avx2"}, "none"),
    (AVX512, {}, "emulated"),
    (["avx512f", "avx512_bf16"], {}, "none"),  # not all of oneDNN's avx512_core
    (["avx2"], {}, "none"),
    (AVX512 + ["avx512_bf16"], {"ONEDNN_MAX_CPU_ISA": "ALL"}, "native"),
])
def test_what_onednn_uses_for_bf16_follows_the_flags_and_the_cap(flags, isa, kind):
    m = {"cpu": "C", "flags": flags, "isa": isa}
    assert bf16_class(m) == kind
    line = describe_bf16(m)
    assert ("limited to" in line) == bool(isa)
    assert ("natively" in line) == (kind == "native")


def test_the_info_subcommand_prints_the_report(capsys):
    assert main(["info", "--dtype", "bfloat16"], commands={}) == 0
    assert capsys.readouterr().out.startswith("CPU: ")
