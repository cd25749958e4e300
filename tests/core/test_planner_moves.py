"""O2 and ops that only move values (reshape, transpose): they follow their data where
none of their readers computes low (``plan_op``'s ``readers``), in both frameworks."""
import pytest

from amp_adapters.rules.device import DeviceProfile
from amp_adapters import ParamUse, Policy, OpCall, plan_op

F32, F16, BF16 = "float32", "float16", "bfloat16"
O2, O2_EMU, O2_BF = (Policy.preset("O2"), Policy.preset("O2", emulate=True),
                     Policy.preset("O2", dtype="bfloat16"))
CPU = frozenset({"reshape2", "transpose2", "scale"})  # Paddle fp16 on a CPU: no GEMM kernel
ONEDNN = frozenset({"reshape2", "transpose2", "matmul_v2", "mul"})  # bf16 on oneDNN
GEMM = ParamUse("matmul_v2", slot="X")


def test_a_move_between_float32_ops_follows_its_data():
    d = plan_op(O2, "paddle", OpCall("reshape2", (F32,), readers=(GEMM,)),
                device=DeviceProfile(CPU))
    assert (d.run_dtype, d.casts) == (F32, (None,))
    assert "follows its data" in d.reason and not d.fell_back


def test_through_moves_to_a_reader_that_runs_low_it_is_lowered():
    chain = (ParamUse("transpose2", slot="X", then=(ParamUse("scale", slot="X"),)),)
    d = plan_op(O2, "paddle", OpCall("reshape2", (F32,), readers=chain), device=DeviceProfile(CPU))
    assert (d.run_dtype, d.casts) == (F16, (F16,))
    chain = (ParamUse("transpose2", slot="X", then=(GEMM,)),)
    assert plan_op(O2, "paddle", OpCall("reshape2", (F32,), readers=chain),
                   device=DeviceProfile(CPU)).run_dtype == F32


@pytest.mark.parametrize("policy, kernels", [
    (O2, None),          # every op has a low kernel (a GPU, a device-free plan)
    (O2_BF, ONEDNN),     # bf16 on oneDNN: the GEMM reading it has one
    (O2_EMU, CPU),       # the GEMM is emulated: it computes with fp16 numerics
])
def test_where_a_reader_computes_low_o2_lowers_it_as_before(policy, kernels):
    d = plan_op(policy, "paddle", OpCall("reshape2", (F32,), readers=(GEMM,)),
                device=DeviceProfile(kernels))
    assert d.run_dtype == policy.dtype
    assert d == plan_op(policy, "paddle", OpCall("reshape2", (F32,)), device=DeviceProfile(kernels))


def test_unlisted_readers_low_data_and_arithmetic_ops_are_unchanged():
    # readers not listed (None): O2 lowers it, as before
    assert plan_op(O2, "paddle", OpCall("reshape2", (F32,)),
                   device=DeviceProfile(CPU)).run_dtype == F16
    # low data: it follows it, low
    assert plan_op(O2, "paddle", OpCall("reshape2", (F16,), readers=(GEMM,)),
                   device=DeviceProfile(CPU)).run_dtype == F16
    # scale computes (x * s + b): between float32 ops it follows them too (issue 38, 8:
    # test_planner_lone_op), and O2 lowers it where its reader computes low
    assert plan_op(O2, "paddle", OpCall("scale", (F32,), readers=(GEMM,)),
                   device=DeviceProfile(CPU)).run_dtype == F32
    assert plan_op(O2_EMU, "paddle", OpCall("scale", (F32,), readers=(GEMM,)),
                   device=DeviceProfile(CPU)).run_dtype == F16
    # a reader outside fp16_guard or in fp32 keeps it float32 too
    forced = ParamUse("scale", slot="X", force_fp32="outside fp16_guard")
    assert plan_op(O2, "paddle", OpCall("transpose2", (F32,), readers=(forced,)),
                   device=DeviceProfile(CPU)).run_dtype == F32
    # O1 never lowers a move of float32 data
    assert plan_op(Policy.preset("O1"), "paddle",
                   OpCall("reshape2", (F32,), readers=(ParamUse("scale"),)),
                   device=DeviceProfile(CPU)).run_dtype == F32


def test_mxnet_gets_the_same_rule():
    d = plan_op(O2, "mxnet", OpCall(
        "Reshape", (F32,), readers=(ParamUse("FullyConnected", slot="data"),)),
        device=DeviceProfile(frozenset({"Reshape"})))
    assert d.run_dtype == F32 and "follows its data" in d.reason
