"""Training under PIR against the legacy IR in one process: bit-for-bit runs, true skips,
cast reports, and the native decorate that fails where paddle_amp works (AMP_TEST_IR=pir)."""
import numpy as np
import paddle
import pytest

import paddle_amp
from amp_adapters import NoOpLossScale, Policy, compare, kernel_differences, policy_disagreements
from paddle_helpers import batch, mlp, op_names, pir_mode
from pir_testutil import OPTIMIZERS, built, by_position, casts, same_init, train, white_list_model

pytestmark = pytest.mark.skipif(not pir_mode(), reason="PIR programs: AMP_TEST_IR=pir on "
                                                       "Paddle 3 (make test-paddle3)")


@pytest.mark.parametrize("optimizer", ["adam", "momentum", "sgd"])
@pytest.mark.parametrize("precision", ["fp16_emulated", "bf16"])
def test_training_converges_and_equals_the_legacy_ir(optimizer, precision):
    kw = dict(emulate=True) if precision == "fp16_emulated" else dict(dtype="bfloat16")
    pir = train("pir", optimizer, 25, **kw)
    legacy = train("legacy", optimizer, 25, **kw)
    assert np.all(np.isfinite(pir[0])) and np.mean(pir[0][-5:]) < np.mean(pir[0][:5])
    assert pir[0] == legacy[0]  # bit for bit
    got, want = by_position(pir[2]), by_position(legacy[2])  # parameters, optimizer state
    assert len(got) == len(want) and all(np.array_equal(a, b) for a, b in zip(got, want))
    assert pir[1] == legacy[1]  # the same loss-scale trajectory
    assert compare(pir[3], legacy[3]) == []
    if precision == "bf16":
        assert pir[1] == NoOpLossScale(total_steps=25).state_dict()


@pytest.mark.parametrize("optimizer", ["adam", "adamw", "lamb", "momentum", "sgd_l2",
                                       "momentum_clip"])
def test_overflow_is_a_true_skip_under_pir(optimizer):
    """The overflow batch leaves everything bit-identical; the next clean steps continue
    exactly where a run that never saw that batch would be; the scale backs off."""
    skipped = train("pir", optimizer, 6, overflow=(2,), init_loss_scaling=2.0**10)
    with built("pir") as env:
        _, _, loss = mlp()
        opt = paddle_amp.decorate(OPTIMIZERS[optimizer](), init_loss_scaling=2.0**9)
        opt.minimize(loss)
        env.exe.run(env.startup)
        same_init(env)
        losses = [float(np.asarray(env.run(batch(s), [loss])[0]).ravel()[0])
                  for s in (0, 1, 3, 4, 5)]
        clean = env.state()
        # Adam and AdamW skip inside their kernel; the others run inside a pd_op.if, Lamb too:
        # Paddle 3's PIR Lamb passes skip_update=None whatever found_inf says (checked by
        # op, not assumed by optimizer type)
        in_main = {"adam", "adamw", "lamb", "sgd", "momentum"} & op_names(env.main)
        assert in_main == ({optimizer} & {"adam", "adamw"})
    assert skipped[1]["state"]["skipped_steps"] == 1 and skipped[1]["state"]["scale"] == 2.0**9
    got, want = by_position(skipped[2]), by_position(clean)
    assert len(got) == len(want) and all(np.array_equal(a, b) for a, b in zip(got, want))
    assert [skipped[0][s] for s in (0, 1, 3, 4, 5)] == losses


def _cnn():
    x = paddle.static.data("x", [4, 1, 8, 8], "float32")
    h = paddle.nn.BatchNorm2D(4)(paddle.nn.Conv2D(1, 4, 3, padding=1)(x))
    h = paddle.flatten(paddle.nn.functional.max_pool2d(paddle.nn.functional.relu(h), 2), 1)
    return paddle.mean(paddle.nn.Linear(64, 3)(h))


def _transformer():
    x = paddle.static.data("x", [2, 4, 8], "float32")
    q, k, v = (paddle.nn.Linear(8, 8)(x) for _ in range(3))
    # einsum, not matmul: Paddle 3.3.1's paddle.matmul rejects legacy-IR Variables
    att = paddle.nn.functional.softmax(paddle.einsum("bij,bkj->bik", q, k) * 0.35, axis=-1)
    h = paddle.nn.LayerNorm(8)(x + paddle.einsum("bik,bkj->bij", att, v))
    h = paddle.nn.functional.relu(paddle.nn.Linear(8, 16)(h))
    return paddle.mean(paddle.reshape(paddle.transpose(h, [0, 2, 1]), [2, -1]))


MODELS = {"mlp": lambda: mlp()[2], "white_list": white_list_model, "cnn": _cnn,
          "transformer": _transformer}
POLICIES = {"O1 fp16": dict(policy=Policy.preset("O1", emulate=True)),
            "O1 bf16": dict(policy=Policy.preset("O1-bf16", emulate=True)),
            "O2 fp16": dict(policy=Policy.preset("O2", emulate=True)),
            "white list": dict(amp_lists=None)}


@pytest.mark.parametrize("model", sorted(MODELS))
@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_cast_reports_agree_with_the_legacy_ir(model, policy):
    kw = dict(POLICIES[policy])
    reports = {}
    for ir in ("legacy", "pir"):
        with built(ir) as env:
            loss = MODELS[model]()
            if policy == "white list":
                kw["amp_lists"] = paddle_amp.AutoMixedPrecisionLists(
                    custom_white_list=["scale", "concat"])
            paddle_amp.decorate(paddle.optimizer.SGD(0.1), **kw).minimize(loss)
            reports[ir] = paddle_amp.cast_report(env.main)
    both = reports["legacy"].format() + "\n" + reports["pir"].format()
    if kernel_differences(reports["legacy"], reports["pir"]):
        # a kernel one IR runs and the other does not (Paddle 3.3.1's PIR oneDNN conv2d
        # leaves float32 data in its bf16 output: fp32 under PIR); what follows it differs
        assert policy_disagreements(reports["legacy"], reports["pir"]) == [], both
    else:
        assert compare(reports["legacy"], reports["pir"]) == [], both
    assert reports["pir"].precisions()


def test_native_static_decorate_fails_under_pir_where_ours_works(static):
    """Paddle's own paddle.static.amp.decorate under PIR: minimize crashes at default
    arguments, and with scaling off no cast is inserted at all (PIR casts only at op
    construction). Skipped once a Paddle release fixes it."""
    _, _, loss = mlp()
    try:
        paddle.static.amp.decorate(paddle.optimizer.SGD(0.1)).minimize(loss)
    except (ValueError, TypeError) as err:
        assert "check_finite_and_unscale_" in str(err)
    else:
        pytest.skip("this Paddle's native static decorate builds under PIR: re-check the claim")
    with built("pir") as env:
        _, _, loss = mlp()
        paddle.static.amp.decorate(paddle.optimizer.SGD(0.1), use_dynamic_loss_scaling=False,
                                   init_loss_scaling=1.0).minimize(loss)
        assert not casts(env.main)
    with built("pir") as env:
        _, _, loss = mlp()
        opt = paddle_amp.decorate(paddle.optimizer.SGD(0.1), emulate=True)
        opt.minimize(loss)
        assert casts(env.main)
        env.exe.run(env.startup)
        assert np.isfinite(float(env.run(batch(0), [loss])[0]))
