"""amp-adapters info --measure / profile: the per-op speed table and the saved profile, from a
backend's answer given as data (a speed book whose timer returns fixed costs)."""
from amp_adapters.cli import main
from amp_adapters.device import Cost, DeviceProfile, ShapeClass
from amp_adapters.speed_report import Sample, SpeedProbe, measure
from amp_adapters.speedbook import SpeedBook, read_profile

GEMM = Sample("FullyConnected", ShapeClass.of([(64, 2048), (2048, 2048), (2048,)]), "GEMM big")
SMALL = Sample("FullyConnected", ShapeClass.of([(64, 64), (64, 64), (64,)]), "GEMM small")
CONV = Sample("Convolution", ShapeClass.of([(16, 64, 56, 56), (64, 64, 3, 3), (64,)]), "conv")


def provider(tmp_path, kernels=frozenset({"FullyConnected"})):
    def measure_(op, shape, training):
        big = shape.operands[0][1] == 2048
        return Cost(0.6, 0.01, 0.7, 0.01) if big else Cost(2.2, 0.05, 2.5, 0.05)

    def make(dtype):
        book = SpeedBook("mxnet", "1.9.1", dtype, measure_, cache=tmp_path / "c.json",
                         here={"cpu": "Test CPU", "flags": [], "gpu": None, "isa": {}})
        return SpeedProbe("mxnet", "mxnet", book,
                          DeviceProfile(kernels, training=True, costs=book.for_training(True)),
                          DeviceProfile(kernels, costs=book.for_training(False)),
                          (SMALL, GEMM, CONV))
    return make


def test_each_sample_gets_its_route_ratios_and_auto_decision(tmp_path):
    text = measure({"mxnet": provider(tmp_path)}, "bfloat16")
    small, big, conv = text.splitlines()[2:5]
    assert "GEMM small" in small and "2.20x+-0.05" in small and "2.50x+-0.05" in small
    assert "float32: slower here (2.50x" in small
    assert big.split()[-1] == "bfloat16" and "0.70x+-0.01" in big
    assert conv.split()[2:4] == ["conv", "none"] and "no bfloat16 kernel" in conv


def test_save_writes_a_profile_a_policy_can_name(tmp_path):
    out = tmp_path / "cpu.json"
    text = measure({"mxnet": provider(tmp_path)}, "bfloat16", save=out)
    assert f"profile written to {out} (4 measurements)" in text
    entries = read_profile(out).entries
    assert {(k[2], k[4]) for k in entries} == {
        ("bfloat16", GEMM.shape.key), ("bfloat16+train", GEMM.shape.key),
        ("bfloat16", SMALL.shape.key), ("bfloat16+train", SMALL.shape.key)}


def test_a_backend_that_fails_says_so_in_its_line(tmp_path):
    def broken(dtype):
        raise ImportError("no module named mxnet")
    text = measure({"mxnet": broken, "paddle": provider(tmp_path)}, "bfloat16")
    assert "mxnet: cannot measure (ImportError: no module named mxnet)" in text


def test_the_profile_command_needs_no_framework_to_start(capsys, tmp_path, monkeypatch):
    monkeypatch.setattr("amp_adapters.speed_report.installed",
                        lambda: {"mxnet": provider(tmp_path)})
    assert main(["profile", "--save", str(tmp_path / "p.json")], commands={}) == 0
    out = capsys.readouterr().out
    assert "measured here (bfloat16" in out and "profile written to" in out
