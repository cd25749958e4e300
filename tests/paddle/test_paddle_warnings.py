"""What paddle_amp tells the user on a device without fp16 kernels (Paddle's CPU build): each
op that stays float32 warns once, at a level Paddle 2.6 shows, and each rewritten program gets
one summary line; the cast report counts the casts the program holds."""
import logging
import os
import subprocess
import sys

import paddle
import pytest

import paddle_amp
from paddle_helpers import forward_ops, is_pir, mlp


def _casts(program, opt):
    """(forward casts, all casts) of ``program``, read from the program itself: on the legacy
    IR by op role; under PIR (no op roles) the casts before the scaled loss's op."""
    if not is_pir(program):
        return (len(forward_ops(program, "cast")),
                sum(op.type == "cast" for op in program.global_block().ops))
    ops = list(program.global_block().ops)
    scaled = opt.get_scaled_loss().get_defining_op()
    end = next(i for i, op in enumerate(ops) if op.id() == scaled.id())
    casts = [i for i, op in enumerate(ops) if op.name() == "pd_op.cast"]
    return sum(i < end for i in casts), len(casts)


def _records(caplog, level):
    return [r.getMessage() for r in caplog.records if r.name == "paddle_amp"
            and r.levelno == level]


@pytest.mark.legacy_ir  # the legacy op name (mul; PIR's is matmul_v2)
def test_fallback_warns_once_per_op_and_summarizes_the_program(static, caplog):
    caplog.set_level(logging.INFO, logger="paddle_amp")
    _, _, loss = mlp()
    paddle_amp.decorate(paddle.optimizer.SGD(0.1)).minimize(loss)
    warnings = _records(caplog, logging.WARNING)
    per_op = [m for m in warnings if m.startswith("mul on ")]
    assert len(per_op) == 1, warnings  # two fc layers, two muls: one warning
    assert "no float16 kernel for mul" in per_op[0] and "pass emulate=True" in per_op[0]
    summary = [m for m in warnings if m.startswith("paddle_amp: program")]
    assert len(summary) == 1, warnings
    assert "2 in float32 for lack of a float16 kernel on this device (mul x2)" in summary[0]
    assert "pass emulate=True to emulate float16 on them" in summary[0]


SCRIPT = """
import paddle, paddle_amp
paddle.enable_static()
with paddle.static.program_guard(paddle.static.Program(), paddle.static.Program()):
    x = paddle.static.data("x", [None, 4], "float32")
    loss = paddle.mean(paddle.static.nn.fc(x, 2))
    paddle_amp.decorate(paddle.optimizer.SGD(0.1)).minimize(loss)
"""


def test_a_user_sees_the_warning_without_configuring_logging():
    """A plain script (no logging setup, as a user runs it): the warning reaches stderr.
    At INFO, as before, Paddle 2.6 showed nothing."""
    env = dict(os.environ, FLAGS_enable_pir_api="0", GLOG_minloglevel="2")
    r = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                       timeout=120, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "mul on this device" in r.stderr and "no float16 kernel for mul" in r.stderr
    assert "paddle_amp: program: 0 ops run in float16" in r.stderr


def test_emulation_is_info_and_its_casts_are_counted(static, caplog):
    caplog.set_level(logging.INFO, logger="paddle_amp")
    _, _, loss = mlp()
    opt = paddle_amp.decorate(paddle.optimizer.SGD(0.1), emulate=True)
    opt.minimize(loss)
    assert _records(caplog, logging.WARNING) == []
    assert any(m.startswith("paddle_amp: program") and "2 EMULATED float16" in m
               for m in _records(caplog, logging.INFO))
    report = opt.cast_report()
    in_program, all_casts = _casts(static.main, opt)
    # it said "0 casts" for 12 before (the legacy IR at first, PIR until issue 22)
    assert report.num_casts == in_program == 12
    assert report.graph_casts.round_trips == in_program  # every one is emulation's
    # The backward adds the gradients' casts, not counted: the gradient of a cast is a cast,
    # for each forward cast on the gradient's path (all but the 2 that round the input data
    # x, which needs no gradient). So a PIR program holds 12 + 10 = 22 casts where the
    # forward, the legacy IR's count and the report's, holds 12 (the legacy IR's backward
    # adds one more, for its own bookkeeping: 23).
    assert all_casts > in_program
    if is_pir(static.main):
        forward = [op for op in static.main.global_block().ops
                   if op.name() == "pd_op.cast"][:in_program]
        with_grad = sum(not op.result(0).stop_gradient for op in forward)
        assert (in_program, with_grad, all_casts) == (12, 10, 22)
    assert str(report).splitlines()[0] == (
        f"paddle: {len(report.decisions)} ops, {in_program} casts in the forward graph "
        f"({in_program} of them emulation's round trips through float16)"
        f"{report.graph_casts.bytes_line()}")
    # the parameters' round trips have their size; the activations' wait for the batch
    assert "bytes written by them per step (and" in report.graph_casts.bytes_line()


def test_real_casts_are_not_called_round_trips(static):
    x = paddle.static.data("x", [None, 8], "float32")
    h = paddle.scale(paddle.static.nn.fc(x, 4, activation="relu"), 0.5)  # scale: a CPU fp16 kernel
    loss = paddle.mean(paddle.static.nn.fc(h, 1))
    lists = paddle_amp.AutoMixedPrecisionLists(custom_white_list=["scale"])
    opt = paddle_amp.decorate(paddle.optimizer.SGD(0.1), lists)
    opt.minimize(loss)
    report = opt.cast_report()
    assert report.num_casts == _casts(static.main, opt)[0] > 0
    assert report.graph_casts.round_trips == 0
