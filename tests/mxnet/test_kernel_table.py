"""The MXNet backend's answer to amp-adapters info agrees with its probes (no CPU assumed)."""
import mxnet as mx

from amp_adapters.services import fallback as info
from mxnet_amp.kernels import has_kernel, lowp_kernels


def test_lowp_kernels_is_the_probes_answer_forward_and_backward():
    for dtype in ("float16", "bfloat16"):
        table = lowp_kernels("CPU", dtype)
        for op in ("FullyConnected", "Convolution", "Activation"):  # ops it probes
            assert (op in table) == has_kernel(op, mx.cpu(), dtype, backward=True), (op, dtype)
    assert "FullyConnected" not in lowp_kernels("CPU", "float16")  # MXNet 1.9.1: no fp16 GEMM


def test_info_renders_the_mxnet_table():
    text = info.info_text({"mxnet": lowp_kernels}, dtypes=("bfloat16",))
    line = next(x for x in text.splitlines() if x.startswith("mxnet CPU bfloat16:"))
    gemm = has_kernel("FullyConnected", mx.cpu(), "bfloat16", backward=True)
    assert ("FullyConnected" in line) == gemm
