"""Every mxnet_amp test leaves MXNet unpatched and in legacy (non-numpy) mode."""
import pytest

mx = pytest.importorskip("mxnet")
import mxnet_amp as amp  # noqa: E402


@pytest.fixture(autouse=True)
def clean_amp():
    amp.reset()
    yield
    amp.reset()
    mx.npx.reset_np()
