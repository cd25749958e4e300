"""amp-adapters info --measure / profile: the per-op speed table and the saved profile, from a
backend's answer given as data (a speed book whose timer returns fixed costs)."""
from amp_adapters.services.cli import main
from amp_adapters.rules.device import Cost, DeviceProfile, ShapeClass
from amp_adapters.services.speed_report import Sample, SpeedProbe, measure
from amp_adapters.services.speedbook import SpeedBook, read_profile

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
    monkeypatch.setattr("amp_adapters.services.speed_report.installed",
                        lambda: {"mxnet": provider(tmp_path)})
    assert main(["profile", "--save", str(tmp_path / "p.json")], commands={}) == 0
    out = capsys.readouterr().out
    assert "measured here (bfloat16" in out and "profile written to" in out


def test_profile_refresh_measures_this_dtype_again_and_keeps_every_other_entry(
        capsys, tmp_path, monkeypatch):
    """``amp-adapters profile --refresh``: the samples and the models' keys of this dtype are
    measured again; another framework's entries and another dtype's are kept as they were."""
    from amp_adapters.services.speedbook import ProfileFile, write_profile
    here = {"cpu": "Test CPU", "flags": [], "gpu": None, "isa": {}}
    model = ("mxnet", "1.9.1", "bfloat16+train", "FullyConnected", "64x512;512x512>2")
    kept = {("paddle", "2.6.2", "bfloat16", "mul", "64x8;8x16>2"): Cost(0.9, 0.01),
            ("mxnet", "1.9.1", "float16", "FullyConnected", GEMM.shape.key): Cost(1.4, 0.01)}
    write_profile(tmp_path / "c.json",
                  ProfileFile(here, {**kept, model: Cost(3.0, 0.0, 3.0, 0.0)}))
    monkeypatch.setenv("AMP_ADAPTERS_REFRESH", "0")  # the command sets it; undone after
    monkeypatch.setattr("amp_adapters.services.speed_report.installed",
                        lambda: {"mxnet": provider(tmp_path)})
    assert main(["profile", "--refresh"], commands={}) == 0
    assert "measured again 1 more bfloat16 entries" in capsys.readouterr().out
    entries = read_profile(tmp_path / "c.json").entries
    assert {k: entries[k] for k in kept} == kept
    assert entries[model] == Cost(2.2, 0.05, 2.5, 0.05)  # measured again by this timer
    assert {k[4] for k in entries if k[0] == "mxnet" and k[2] == "bfloat16"} == {
        SMALL.shape.key, GEMM.shape.key}


def test_a_tie_within_the_spread_says_its_whole_verdict(tmp_path):
    """A ratio whose spread could undo its win: the decision column gives the verdict with
    its ratio, not the clause after its own semicolon."""
    def make(dtype):
        book = SpeedBook("mxnet", "1.9.1", dtype, lambda op, shape, training:
                         Cost(0.9, 0.2, 0.87, 0.7), cache=tmp_path / "c.json",
                         here={"cpu": "Test CPU", "flags": [], "gpu": None, "isa": {}})
        kernels = frozenset({"FullyConnected"})
        return SpeedProbe("mxnet", "mxnet", book,
                          DeviceProfile(kernels, training=True, costs=book.for_training(True)),
                          DeviceProfile(kernels, costs=book.for_training(False)), (GEMM,))
    row = measure({"mxnet": make}, "bfloat16").splitlines()[2]
    assert "float32: not faster here" in row and "0.87x +- 0.70" in row
