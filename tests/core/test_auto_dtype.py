"""The preset "auto" runs the low dtype its device runs fast: float16 on a GPU, bfloat16 on a
CPU (``device.auto_dtype``), applied in one place (``policy.preset_fields``) whichever way
the preset arrives (by name, ``Policy.preset``, a file's ``preset``); a dtype given beside
it always wins. The GPU branch is tested as data: no GPU runs here."""
import pytest
from hypothesis import given
from hypothesis import strategies as st

from amp_adapters import AmpConfigError, DynamicLossScale, NoOpLossScale, Policy
from amp_adapters.rules.device import auto_dtype
from amp_adapters.rules.policy import PRESETS, preset_fields, resolve_policy

GPU_SPELLINGS = ["gpu", "GPU", "gpu:0", "gpu:3", " Gpu:1 "]  # mx ctx.device_type, Paddle's
CPU_SPELLINGS = ["cpu", "CPU", "cpu:0", "cpu_pinned", "cpu_shared", "xpu:0", "npu"]


@pytest.mark.parametrize("device", GPU_SPELLINGS)
def test_a_gpu_runs_float16(device):
    assert auto_dtype(device) == "float16"


@pytest.mark.parametrize("device", CPU_SPELLINGS)
def test_anything_else_runs_bfloat16(device):
    assert auto_dtype(device) == "bfloat16"


@given(st.text(), st.sampled_from(["gpu", "GPU", "Gpu"]), st.integers(0, 64))
def test_the_rule_is_total_over_device_names(device, gpu, index):
    """Any name is an answer or a TypeError, never another dtype; a GPU with any index, in
    any case, is float16; a name that does not start with a GPU's is bfloat16."""
    try:
        got = auto_dtype(device)
    except TypeError:
        assert not device.strip()
    else:
        assert got in ("float16", "bfloat16")
        if not device.strip().lower().startswith("gpu"):
            assert got == "bfloat16"
    assert auto_dtype(f"{gpu}:{index}") == auto_dtype(f" {gpu} ") == "float16"


@pytest.mark.parametrize("bad", [None, 0, "", "  ", ["gpu"]])
def test_a_device_type_that_is_none_says_so(bad):
    with pytest.raises(TypeError, match="'cpu' or 'gpu'"):
        auto_dtype(bad)


def test_auto_by_name_follows_the_device():
    assert Policy.preset("auto").dtype == "bfloat16"  # not known: a CPU, as before
    assert Policy.preset("auto", device_type="cpu").dtype == "bfloat16"
    gpu = Policy.preset("auto", device_type="gpu:0")
    assert (gpu.dtype, gpu.level, gpu.speed) == ("float16", "O1", "measured")
    assert isinstance(gpu.loss_scale, DynamicLossScale)  # fp16's default: scaled
    assert resolve_policy("auto", device_type="gpu") == gpu
    assert resolve_policy("auto", device_type="cpu") == Policy.preset("auto")


@pytest.mark.parametrize("device", ["cpu", "gpu"])
def test_an_explicit_dtype_wins(device, tmp_path):
    """``dtype=`` beside the name, a file's ``dtype``, a Policy object: the device is not
    asked. The dtype given gets its own default loss scale (bf16: none), as if named."""
    bf16 = resolve_policy("auto", device_type=device, dtype="bfloat16")
    assert bf16.dtype == "bfloat16" and isinstance(bf16.loss_scale, NoOpLossScale)
    assert Policy.preset("auto", device_type=device, dtype="float16").dtype == "float16"
    f = tmp_path / "auto.toml"
    f.write_text('preset = "auto"\ndtype = "bfloat16"\n')
    assert resolve_policy(f, device_type=device).dtype == "bfloat16"
    obj = Policy.preset("auto", dtype="bfloat16")
    assert resolve_policy(obj, device_type=device) is obj


def test_a_file_naming_auto_follows_the_device(tmp_path):
    f = tmp_path / "auto.toml"
    f.write_text('preset = "auto"\n')
    assert resolve_policy(f, device_type="gpu").dtype == "float16"
    assert resolve_policy(str(f), device_type="cpu").dtype == "bfloat16"
    assert resolve_policy(f).dtype == "bfloat16"
    assert Policy.from_dict({"preset": "auto"}, device_type="gpu") == \
        Policy.preset("auto", device_type="gpu")


@pytest.mark.parametrize("name", sorted(set(PRESETS) - {"auto"}))
def test_other_presets_are_the_same_on_every_device(name):
    assert preset_fields(name, "gpu") == preset_fields(name, "cpu") == PRESETS[name]
    assert resolve_policy(name, device_type="gpu") == Policy.preset(name)


def test_an_unknown_preset_is_still_named():
    with pytest.raises(AmpConfigError, match="preset"):
        preset_fields("autoo", "gpu")
