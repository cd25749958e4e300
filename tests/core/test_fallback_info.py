"""amp-adapters info: rendered from each backend's kernel answer (plain data here)."""
from amp_adapters import fallback as info
from amp_adapters.cli import main


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
    text = info.render_info(tables, ())
    assert text.splitlines()[0].startswith("CPU: no AVX-512")
    assert "mxnet CPU bfloat16: 1 of 2 ops the lists lower have a real kernel: " \
           "FullyConnected" in text
    assert "AMP runs them in float32" in text and "Convolution" in text


def test_a_framework_that_cannot_answer_is_one_line_not_a_crash():
    text = info.render_info(info.gather({"mxnet": _broken}, dtypes=("float16",)), ("avx512f",))
    assert "CPU: avx512f" in text
    assert "mxnet CPU float16: cannot tell (ImportError: no module named mxnet)" in text


def test_no_backend_says_so():
    assert "no framework backend registered" in info.render_info([], ())


def test_cpu_flags_reads_avx512_and_amx(tmp_path):
    f = tmp_path / "cpuinfo"
    f.write_text("flags : fpu sse avx2 avx512f avx512_bf16 amx_tile avx512f\n")
    assert info.cpu_flags(str(f)) == ("amx_tile", "avx512_bf16", "avx512f")
    assert info.cpu_flags(str(tmp_path / "missing")) == ()


def test_the_info_subcommand_prints_the_report(capsys):
    assert main(["info", "--dtype", "bfloat16"], commands={}) == 0
    assert capsys.readouterr().out.startswith("CPU: ")
