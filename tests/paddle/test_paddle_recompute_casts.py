"""A low copy the backward reads is cast again there, not kept from the forward, where its
float32 source lives anyway (issue 40: no copy that does not have to live; the core's rule,
``amp_adapters.rules.recompute``), in both IRs. On an MLP of Linear + ReLU under O1-bf16
the backward read each ReLU output and its bf16 copy (the GEMM's gradient): 4 copies of
8192x512 at the bench's size, the peak 1.08x float32's. Counted from the program's ops and
shapes; the training run checks the values are the same bits with and without it."""
import numpy as np
import paddle
import pytest
from paddle.base import unique_name

import paddle_amp
from amp_adapters import Policy
from amp_adapters.rules.device import DeviceProfile
from amp_adapters.rules.recompute import recasts
from paddle_amp import ir as program_ir
from paddle_amp.rewrite import Rewriter
from paddle_helpers import Static, is_pir
from test_paddle_bf16 import NO_BF16_GEMM, REAL_BF16

BATCH, UNITS, LAYERS = 64, 32, 4
COPY_BYTES = BATCH * UNITS * 2  # one bf16 copy of an activation


def model(relu: bool = True):
    """LAYERS Linears, each followed by a ReLU (or by nothing), and a mean."""
    x = paddle.static.data("x", [BATCH, UNITS], "float32")
    h = x
    for _ in range(LAYERS):
        h = paddle.nn.Linear(UNITS, UNITS)(h)
        h = paddle.nn.functional.relu(h) if relu else h
    return paddle.mean(h)


def _kept_copies(ir) -> int:
    """The rewrite's forward casts whose result a GEMM's gradient reads (kept until then;
    the bias add's gradient also reads its inputs, but only their shapes)."""
    uses, gemm_grads = ir.op_uses(), _gemm_grads(ir)
    return sum(1 for op in uses if op.cast is not None and
               any(i in gemm_grads and op.cast[1] in u.reads for i, u in enumerate(uses)))


def _gemm_grads(ir) -> set:
    """The positions of the GEMMs' gradient ops, in the order ``op_uses`` lists the ops."""
    names = [op.name() if hasattr(op, "name") and callable(op.name) else op.type
             for op in ir.program.global_block().ops]
    return {i for i, n in enumerate(names) if n.split(".")[-1] in ("matmul_grad",
                                                                   "matmul_v2_grad")}


def _build(static, relu: bool):
    """The rewrite on a device that runs the GEMMs in bf16 (whatever this CPU runs), the
    backward, and the recasts: (copies kept before the recasts, after, the recasts)."""
    loss = model(relu)
    gemms = frozenset({"mul", "matmul_v2"})
    rewriter = Rewriter(Policy.preset("O1-bf16"), DeviceProfile(gemms, gemms))
    rewriter.rewrite(static.main)
    ir = program_ir.of(static.main)
    ir.end_forward()
    paddle.optimizer.SGD(0.1).backward(loss)
    before = _kept_copies(ir)
    plan = recasts(ir.op_uses())
    ir.recast(plan)
    return before, _kept_copies(ir), plan


def test_the_copy_of_each_relu_output_is_cast_again_in_the_backward_not_kept(static):
    before, after, plan = _build(static, relu=True)
    # kept for the GEMMs' gradients: each weight's copy (LAYERS of them, as before: a
    # weight's copy is small), and the input's and each ReLU output's (LAYERS x 64x32
    # bf16); now of the activations at most the input's: the legacy IR keeps a fed var in
    # its scope the whole step, so its copy is cast again too; PIR frees a fed value after
    # its last reader, so there the copy is the smaller thing to keep
    fed_copy = 1 if is_pir(static.main) else 0
    assert (before - LAYERS, after - LAYERS) == (LAYERS, fed_copy)
    assert (before - after) * COPY_BYTES == (LAYERS - fed_copy) * BATCH * UNITS * 2
    assert len(plan) == LAYERS - fed_copy


def test_a_copy_whose_source_the_backward_does_not_keep_stays_kept(static):
    # Linear after Linear: the GEMM input is a bias add's result, which its gradient does
    # not read: recasting would keep the float32 value instead of its smaller copy
    before, after, plan = _build(static, relu=False)
    fed = 0 if is_pir(static.main) else 1  # (the legacy IR's fed input lives anyway)
    assert (before, after, len(plan)) == (2 * LAYERS, 2 * LAYERS - fed, fed)


def _train(recast: bool, monkeypatch):
    """Three Adam steps of ``model()`` under O1-bf16 in a fresh program and scope (with the
    recasts, or with the core's rule made to recast nothing): (copies kept, losses,
    parameters)."""
    if not recast:
        monkeypatch.setattr(paddle_amp.decorator, "recasts", lambda ops: ())
    env = Static.new()
    with paddle.static.program_guard(env.main, env.startup), \
            paddle.static.scope_guard(env.scope), unique_name.guard():
        loss = model()
        opt = paddle_amp.decorate(paddle.optimizer.Adam(1e-2), policy="O1-bf16")
        opt.minimize(loss)
        casts = opt.cast_report().graph_casts
        again = LAYERS - (1 if is_pir(env.main) else 0)
        assert (casts.recast, casts.recast_bytes) == ((again, again * COPY_BYTES)
                                                      if recast else (0, 0))
        assert (f"{again} of their copies cast again in the backward rather than kept from "
                f"the forward" in opt.cast_report().summary()) is recast
        env.exe.run(env.startup)
        rng = np.random.default_rng(0)
        losses = [float(env.run({"x": rng.standard_normal((BATCH, UNITS)).astype("float32")},
                                [loss])[0]) for _ in range(3)]
        return _kept_copies(program_ir.of(env.main)), losses, env.state(), env.main


@pytest.mark.skipif(not REAL_BF16, reason=NO_BF16_GEMM)
def test_training_with_the_casts_made_again_gives_the_same_bits(static, monkeypatch):
    kept, losses, state, program = _train(True, monkeypatch)
    kept_before, losses_before, state_before, _ = _train(False, monkeypatch)
    fed_copy = 1 if is_pir(program) else 0
    assert (kept, kept_before) == (LAYERS + fed_copy, 2 * LAYERS)  # weights' copies: LAYERS
    assert losses == losses_before
    assert state.keys() == state_before.keys()
    for name, value in state.items():
        assert np.array_equal(value, state_before[name]), name
