"""A model library's own ``paddle.static.amp.fp16_guard()`` with ``paddle_amp.decorate``.

PaddleNLP's Transformer builds its forward inside the native guard; a user who migrates
the training script cannot edit it. The native guard is a name scope, which PIR ops do not
keep: ``paddle_amp`` sees it being entered (``ir.pir.guard``), so in both IRs it guards the
same ops as ``paddle_amp.fp16_guard()``. The native decorate runs the same model on the
legacy IR (it fails under PIR, PIR_NOTES P4e).
"""
import numpy as np
import paddle

import paddle_amp
from paddle_helpers import Static, is_pir


def _model(guard):
    """x -> [guard: fc -> scale -> fc] -> scale -> mean, as a library wraps its forward."""
    x = paddle.static.data("x", [None, 8], "float32")
    with guard():
        h = paddle.static.nn.fc(paddle.scale(paddle.static.nn.fc(x, 8), 2.0), 8)
    return paddle.mean(paddle.scale(h, 3.0))


def _train(amp, guard, steps=3):
    """(losses, cast report or None, PIR program) of ``amp.decorate(use_pure_fp16=True)``;
    ``paddle_amp`` emulates float16 (so the GEMM after the guarded scale computes in it, and
    O2 lowers the scale: between float32 ops it would follow them)."""
    env = Static.new(seed=5)
    with paddle.static.program_guard(env.main, env.startup), \
            paddle.static.scope_guard(env.scope), paddle.base.unique_name.guard():
        loss = _model(guard)
        emulate = {"emulate": True} if amp is paddle_amp else {}
        opt = amp.decorate(paddle.optimizer.SGD(0.1), use_pure_fp16=True,
                           init_loss_scaling=1.0, **emulate)  # use_fp16_guard: on
        opt.minimize(loss)
        env.exe.run(env.startup)
        opt.amp_init(paddle.CPUPlace())
        feed = {"x": np.random.RandomState(0).rand(4, 8).astype("float32")}
        losses = [float(np.asarray(env.run(feed, [loss])[0])) for _ in range(steps)]
    report = opt.cast_report() if amp is paddle_amp else None
    return losses, report, is_pir(env.main)


def test_the_native_guard_in_model_code_guards_as_ours(static):
    native_guard, ours_guard = paddle.static.amp.fp16_guard, paddle_amp.fp16_guard
    losses, report, pir = _train(paddle_amp, native_guard)
    scales = [d for d in report.decisions if d.op == "scale"]
    assert [s.run_dtype for s in scales] == ["float16", "float32"]  # in the guard, out
    assert "outside fp16_guard" in scales[1].reason
    # exactly as with paddle_amp's own guard: same decisions, same numbers
    again, ours_report, _ = _train(paddle_amp, ours_guard)
    assert report.decisions == ours_report.decisions and losses == again
    assert np.all(np.isfinite(losses)) and losses[-1] < losses[0]
    if not pir:  # the native runs it too (everything float32: no GPU kernel here)
        native, _, _ = _train(paddle.static.amp, native_guard)
        assert np.allclose(losses, native, rtol=1e-2)
