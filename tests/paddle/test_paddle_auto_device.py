"""policy="auto" on Paddle takes the low dtype of the device programs run on, as Paddle
answers it (``env.current_device``, set by ``paddle.set_device``): bfloat16 on this CPU,
float16 on a GPU (run only where a CUDA build of Paddle sees a GPU). In the IR under test.

Speeds are data (a ``SpeedBook`` answering "faster" for every op), so the plan shows the
dtype auto chose, whatever this machine measures."""
import paddle
import pytest

import paddle_amp
from amp_adapters import Policy
from amp_adapters.device import Cost
from amp_adapters.speedbook import SpeedBook
from paddle_amp import kernels, speed
from paddle_amp.env import current_device
from paddle_helpers import is_pir, mlp

GEMMS = ("mul", "matmul_v2")
REAL_GEMM = kernels.runs_onednn_bf16("matmul_v2", backward=True)
ON_GPU = paddle.is_compiled_with_cuda() and paddle.device.cuda.device_count() > 0
BOOKS = speed.book  # the process's books (a test replaces ``speed.book``)


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("AMP_ADAPTERS_CACHE", str(tmp_path / "cache"))
    BOOKS.cache_clear()
    yield
    BOOKS.cache_clear()


def faster_everywhere(monkeypatch):
    """``speed.book`` answering "twice as fast" for every op: the speeds as data."""
    def book(device, dtype, profile, probe):
        return SpeedBook(speed.framework(probe), paddle.__version__, dtype,
                         lambda op, shape, training: Cost(0.5, 0.01, 0.5, 0.01),
                         profile=profile)
    monkeypatch.setattr(speed, "book", book)


def test_decorate_auto_runs_bfloat16_on_this_cpu(static, tmp_path):
    """The static fixture runs on a CPU place: Paddle answers 'CPU', auto is bf16, by name
    and as a file's preset; a dtype in the file wins."""
    assert current_device() == "CPU"
    opt = paddle_amp.decorate(paddle.optimizer.SGD(0.01), policy="auto")
    assert opt.policy.dtype == "bfloat16"
    assert opt.policy == Policy.preset("auto", device_type="cpu")
    f = tmp_path / "auto.toml"
    f.write_text('preset = "auto"\n')
    assert paddle_amp.decorate(paddle.optimizer.SGD(0.01), policy=f).policy.dtype == "bfloat16"
    f.write_text('preset = "auto"\ndtype = "float16"\n')
    assert paddle_amp.decorate(paddle.optimizer.SGD(0.01), policy=f).policy.dtype == "float16"


def test_decorate_passes_the_devices_answer_to_the_core(static, monkeypatch):
    """The glue hands ``current_device()``'s answer to the core: where it says 'GPU' (a
    CUDA place; no CUDA build here, so the answer is substituted, Paddle is not), auto is
    float16 with its dynamic loss scale; an explicit policy's dtype is kept."""
    monkeypatch.setattr("paddle_amp.config.current_device", lambda: "GPU")
    opt = paddle_amp.decorate(paddle.optimizer.SGD(0.01), policy="auto")
    assert opt.policy == Policy.preset("auto", device_type="gpu")
    assert opt.policy.dtype == "float16"
    explicit = Policy.preset("auto", dtype="bfloat16")
    assert paddle_amp.decorate(paddle.optimizer.SGD(0.01),
                               policy=explicit).policy.dtype == "bfloat16"


@pytest.mark.skipif(not REAL_GEMM, reason=(
    "this CPU runs no oneDNN bf16 matmul (it needs AVX-512): the kernel probe's answer"))
def test_auto_rewrites_training_and_eval_programs_in_bfloat16(static, monkeypatch):
    """minimize and amp_init(test_program=...) rewrite in the dtype decorate chose for this
    CPU: every GEMM bfloat16 (measured faster, as data)."""
    faster_everywhere(monkeypatch)
    _, _, loss = mlp()
    test = static.main.clone() if is_pir(static.main) else static.main.clone(for_test=True)
    opt = paddle_amp.decorate(paddle.optimizer.SGD(0.01), policy="auto")
    opt.minimize(loss)
    static.exe.run(static.startup)
    opt.amp_init(paddle.CPUPlace(), test_program=test, use_fp16_test=True)
    for report in (opt.cast_report(), paddle_amp.cast_report(test)):
        gemms = [d for d in report.decisions if d.op in GEMMS]
        assert gemms and {d.run_dtype for d in gemms} == {"bfloat16"}, gemms


@pytest.mark.skipif(not ON_GPU, reason="no CUDA build of Paddle with a GPU here: the GPU "
                    "rule (auto is float16) is tested as data in tests/core/test_auto_dtype.py")
def test_decorate_auto_runs_float16_on_a_gpu(static):
    paddle.set_device("gpu:0")
    try:
        opt = paddle_amp.decorate(paddle.optimizer.SGD(0.01), policy="auto")
        assert opt.policy.dtype == "float16"
    finally:
        paddle.set_device("cpu")
