"""policy="auto" on Paddle takes the low dtype of the device programs run on, as Paddle
answers it (``env.current_device``, set by ``paddle.set_device``): bfloat16 on this CPU,
float16 on a GPU (run only where a CUDA build of Paddle sees a GPU). In the IR under test.
What auto then plans on this CPU, bf16 where measured faster (speeds as data), in both
the training and the eval program: tests/paddle/test_paddle_speed.py."""
import paddle
import pytest

import paddle_amp
from amp_adapters import Policy
from paddle_amp.env import current_device

ON_GPU = paddle.is_compiled_with_cuda() and paddle.device.cuda.device_count() > 0


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


@pytest.mark.skipif(not ON_GPU, reason="no CUDA build of Paddle with a GPU here: the GPU "
                    "rule (auto is float16) is tested as data in tests/core/test_auto_dtype.py")
def test_decorate_auto_runs_float16_on_a_gpu(static):
    paddle.set_device("gpu:0")
    try:
        opt = paddle_amp.decorate(paddle.optimizer.SGD(0.01), policy="auto")
        assert opt.policy.dtype == "float16"
    finally:
        paddle.set_device("cpu")
