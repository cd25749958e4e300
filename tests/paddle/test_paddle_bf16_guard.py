"""``decorate_bf16(use_bf16_guard=True)`` with ``bf16_guard``, ours and the native's, in both IRs.

The bf16 guard is the fp16 guard's twin (``__use_bf16__`` for ``__use_fp16__``): ops built
inside ``paddle_amp.bf16.bf16_guard()`` or a model library's own
``paddle.static.amp.bf16.bf16_guard()`` may go bf16, the others stay float32, exactly as
with ``fp16_guard``. Under PIR ops keep no name scope, so the guard is whatever the
program's IR records on entry (``ProgramIR.guarding``); a guard that recorded nothing is an
error that names the bf16 guard too. On the legacy IR the native decorate_bf16 rewrites the
same model (not run: its bf16 kernels would need a CPU feature).
"""
import paddle
import pytest

import paddle_amp
from amp_adapters import AmpConfigError
from paddle_helpers import is_pir

GUARDS = {"ours": lambda: paddle_amp.bf16.bf16_guard(),
          "native": lambda: paddle.static.amp.bf16.bf16_guard(),
          "fp16_guard": lambda: paddle_amp.fp16_guard()}


def _model(guard):
    """x -> [guard: fc -> scale] -> scale -> mean."""
    x = paddle.static.data("x", [None, 8], "float32")
    with guard():
        h = paddle.scale(paddle.static.nn.fc(x, 8), 2.0)
    return paddle.mean(paddle.scale(h, 3.0))


def _decisions(amp, guard):
    """The decisions of ``amp``'s pure bf16 with the guard on a fresh program (and it)."""
    main, startup = paddle.static.Program(), paddle.static.Program()
    with paddle.static.program_guard(main, startup), paddle.base.unique_name.guard():
        loss = _model(guard)
        opt = amp.bf16.decorate_bf16(paddle.optimizer.SGD(0.1), use_pure_bf16=True,
                                     use_bf16_guard=True)
        opt.minimize(loss)
    return (opt.cast_report().decisions if amp is paddle_amp else None), main


def _bf16_gemm_here():
    from paddle_amp import ir, kernels
    return bool({"mul", "matmul_v2"} & kernels.lowp_kernels("CPU", "bfloat16",
                                                           ir.default_probe()))


@pytest.mark.parametrize("spelling", ["ours", "native"])
def test_bf16_guard_guards_as_fp16_guard(static, spelling):
    decisions, _ = _decisions(paddle_amp, GUARDS[spelling])
    scales = [d for d in decisions if d.op == "scale"]
    assert scales[1].run_dtype == "float32" and "outside" in scales[1].reason
    gemm, = [d for d in decisions if d.op in ("mul", "matmul_v2", "fc")]  # the guarded one
    if _bf16_gemm_here():
        assert gemm.run_dtype == "bfloat16"
    else:  # the device truth: no bf16 GEMM kernel here (AVX2, or AMP_ADAPTERS_CPU=avx2)
        assert gemm.run_dtype == "float32" and "kernel" in gemm.reason
    assert all(d.run_dtype == "float32" for d in decisions[-2:])  # outside: scale, mean
    again, _ = _decisions(paddle_amp, GUARDS["fp16_guard"])
    assert decisions == again


def test_the_native_decorate_bf16_keeps_the_same_ops_float32(static):
    """Legacy IR: the native's pure bf16 with its guard leaves the ops outside float32 too."""
    if is_pir(paddle.static.default_main_program()):
        pytest.skip("the native bf16 decorator builds legacy programs only (PIR_NOTES P4e)")
    if not _bf16_gemm_here():
        pytest.skip("no bfloat16 GEMM kernel runs here (oneDNN needs AVX-512): ours keeps the "
                    "fc float32, the native lowers it regardless")
    decisions, _ = _decisions(paddle_amp, GUARDS["native"])
    _, main = _decisions(paddle.static.amp, GUARDS["native"])
    ours = {d.op: d.run_dtype for d in decisions if d.op in ("mul", "matmul_v2")}
    block = main.global_block()
    native = {op.type: block.var(op.output_arg_names[0]).dtype
              for op in block.ops if op.type in ("mul", "matmul_v2")}
    scales = [block.var(op.output("Out")[0]).dtype for op in block.ops if op.type == "scale"
              and not op.attr("op_role")]
    assert list(ours.values()) == ["bfloat16"]
    assert [str(d) for d in native.values()] == ["paddle.bfloat16"]
    assert [str(d) for d in scales] == ["paddle.bfloat16", "paddle.float32"]


def test_a_bf16_guard_that_guarded_nothing_is_named_under_pir(static):
    """PIR: nothing recorded means the guard was not seen; the error names bf16_guard (the
    legacy IR keeps every op float32, as natively)."""
    def unguarded():
        return paddle.static.name_scope("not_a_guard")
    if not is_pir(paddle.static.default_main_program()):
        decisions, _ = _decisions(paddle_amp, unguarded)
        assert all(d.run_dtype == "float32" for d in decisions)
        return
    with pytest.raises(AmpConfigError, match=r"paddle_amp\.bf16\.bf16_guard\(\)"):
        _decisions(paddle_amp, unguarded)
