"""Both frameworks in one process: skip the suite where either is missing."""
import os

os.environ.setdefault("FLAGS_enable_pir_api", "0")  # Paddle 3.x: the legacy program IR

import pytest  # noqa: E402

pytest.importorskip("mxnet", reason="the consistency suite runs MXNet and Paddle side by side")
pytest.importorskip("paddle", reason="the consistency suite runs MXNet and Paddle side by side")


@pytest.fixture(autouse=True)
def clean_frameworks():
    """No AMP patching leaks out of a test, and Paddle is back in dynamic mode after it."""
    import mxnet_amp
    import paddle

    yield
    mxnet_amp.reset()
    if not paddle.in_dynamic_mode():
        paddle.disable_static()
