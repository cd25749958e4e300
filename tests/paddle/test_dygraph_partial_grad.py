"""``paddle.grad`` through a region's bf16 GEMM asks for some operands' gradients only.

oneDNN's bf16 ``matmul_v2_grad`` killed the process (SIGSEGV, Paddle 2.6.2 and 3.3.1) when
one of its two gradients was not asked for (issue 39, point 2); the route
(``kernels.matmul_v2``) never runs it now. The calls that crashed run in a child process,
so a regression fails the test rather than the suite."""
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import paddle
import pytest

from amp_adapters.rules.isa import bf16_class, machine

ROOT = Path(__file__).resolve().parents[2]
NO_BF16 = pytest.mark.skipif(
    bf16_class(machine()) == "none",
    reason="the device truth (isa.bf16_class) says this CPU class has no oneDNN bf16 kernel "
           "(no AVX-512 in use): no bf16 GEMM route to take a gradient through")

# (name, call on float32 tensors, operand shapes): Linear (with bias, a batch of sequences,
# a Layer's parameters), matmul in every transpose combination, batched, broadcast, a vector
# (a vector's transpose is ignored, as Paddle does: oneDNN's kernel failed or corrupted the
# heap on it)
CHILD = r'''
import numpy as np, paddle
import paddle.nn.functional as F
from paddle_amp import dygraph as amp

def mm(tx, ty):
    return lambda x, y: paddle.matmul(x, y, transpose_x=tx, transpose_y=ty)

def t(s, tx):  # the last two dimensions swapped
    return s if not tx or len(s) < 2 else s[:-2] + (s[-1], s[-2])

CASES = [("linear", F.linear, [(8, 32), (32, 16), (16,)]),
         ("linear on sequences", F.linear, [(4, 8, 32), (32, 16), (16,)])]
for tx in (False, True):
    for ty in (False, True):
        for xs, ys in (((8, 32), (32, 16)), ((4, 8, 32), (4, 32, 16)),
                       ((4, 8, 32), (32, 16)), ((8, 32), (4, 32, 16))):
            CASES.append((f"matmul {t(xs, tx)} {t(ys, ty)} tx={tx} ty={ty}", mm(tx, ty),
                          [t(xs, tx), t(ys, ty)]))
# an operand the backward keeps in float32 anyway (a ReLU's output): its bf16 copy is cast
# again in the backward, not kept (paddle_amp.dygraph.recast)
CASES.append(("linear after relu", lambda x, w, b: F.linear(F.relu(x), w, b),
              [(8, 32), (32, 16), (16,)]))
CASES.append(("matmul of two relu outputs", lambda x, y: paddle.matmul(F.relu(x), F.relu(y)),
              [(4, 8, 32), (32, 16)]))
CASES.append(("matmul vector", mm(False, False), [(32,), (32, 16)]))
CASES.append(("matmul vector, its transpose ignored", mm(True, True), [(32,), (16, 32)]))

rng = np.random.default_rng(0)

def run(f, arrays, stop=()):
    ts = [paddle.to_tensor(a, stop_gradient=i in stop) for i, a in enumerate(arrays)]
    with amp.auto_cast(dtype="bfloat16") as region:
        out = f(*ts)
    assert region.ran["matmul_v2"].execution == "kernel", region.ran["matmul_v2"]
    w = paddle.to_tensor(np.cos(np.arange(out.size)).reshape(out.shape).astype("float32"))
    return ts, (out * w).sum()

for name, f, shapes in CASES:
    arrays = [rng.standard_normal(s).astype("float32") for s in shapes]
    ts, loss = run(f, arrays)
    loss.backward()
    full = [x.grad.numpy() for x in ts]
    for i in range(len(ts)):
        ts, loss = run(f, arrays)  # paddle.grad w.r.t. one operand: the others pruned
        (g,) = paddle.grad([loss], [ts[i]])
        assert np.array_equal(g.numpy(), full[i]), (name, i, "paddle.grad")
        others = [j for j in range(len(ts)) if j != i]
        ts, loss = run(f, arrays, stop=others)  # the others want no gradient
        (g,) = paddle.grad([loss], [ts[i]])
        assert np.array_equal(g.numpy(), full[i]), (name, i, "stop_gradient")
    print("ok", name, flush=True)

paddle.seed(0)  # a Layer's own parameters, only the input's gradient, then only the weight's
layer = paddle.nn.Linear(32, 16)
x = paddle.to_tensor(rng.standard_normal((8, 32)).astype("float32"), stop_gradient=False)
with amp.auto_cast(dtype="bfloat16"):
    out = layer(x)
out.sum().backward()
want = (x.grad.numpy(), layer.weight.grad.numpy())
for target in (0, 1):
    x = paddle.to_tensor(x.numpy(), stop_gradient=False)
    with amp.auto_cast(dtype="bfloat16"):
        out = layer(x)
    (g,) = paddle.grad([out.sum()], [(x, layer.weight)[target]])
    assert np.array_equal(g.numpy(), want[target]), ("Linear layer", target)
print("ok Linear layer")
'''


@NO_BF16
def test_paddle_grad_wrt_one_operand_of_a_bf16_gemm_gives_backwards_gradients(tmp_path):
    """``paddle.grad`` w.r.t. only the input, only the weight (the bias), of a Linear and a
    matmul (every transpose combination, batched, broadcast, a vector) in a bf16 region,
    and with the other operands ``stop_gradient``: bit-identical to ``backward()``'s."""
    script = tmp_path / "partial_grad.py"
    script.write_text(CHILD)
    env = {**os.environ, "GLOG_minloglevel": "3",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                       timeout=300, env=env)
    assert r.returncode == 0, (r.returncode, r.stdout[-1500:], r.stderr[-3000:])
    assert r.stdout.strip().splitlines()[-1] == "ok Linear layer"


def _legacy_gemm_grads(x, y, tx, ty):
    """oneDNN's own bf16 ``matmul_v2`` forward and gradient (both operands asked: it runs)."""
    from paddle_amp.dygraph import kernels
    x, y = (paddle.to_tensor(a).astype("bfloat16") for a in (x, y))
    x.stop_gradient = y.stop_gradient = False
    out = kernels._onednn_matmul(x, y, tx, ty).astype("float32")
    (out * _weights(out.shape)).sum().backward()
    return [a.astype("float32").numpy() for a in (out, x.grad, y.grad)]


def _weights(shape):
    return paddle.to_tensor(np.cos(np.arange(int(np.prod(shape)))).reshape(shape)
                            .astype("float32"))


@NO_BF16
@pytest.mark.parametrize("tx", [False, True])
@pytest.mark.parametrize("ty", [False, True])
@pytest.mark.parametrize("xs,ys", [((6, 4), (4, 5)), ((3, 6, 4), (3, 4, 5)),
                                   ((3, 6, 4), (4, 5)), ((6, 4), (2, 4, 5)),
                                   ((2, 1, 6, 4), (3, 4, 5))])
def test_the_routes_gradients_are_onednns_own(xs, ys, tx, ty):
    """The route's result and gradients equal oneDNN's ``matmul_v2_grad``'s bit for bit
    (transposes, batches, broadcasting); but a batch of rows by a matrix (``mul``), whose
    matrix gradient is one GEMM over the whole batch, accumulated in float32 and rounded
    once, where oneDNN's sums the batch's bf16 products: within a bf16 rounding."""
    from paddle_amp.dygraph import kernels
    xs = xs[:-2] + (xs[-1], xs[-2]) if tx else xs
    ys = ys[:-2] + (ys[-1], ys[-2]) if ty else ys
    rng = np.random.default_rng(3)
    xa, ya = rng.standard_normal(xs).astype("float32"), rng.standard_normal(ys).astype("float32")
    want = _legacy_gemm_grads(xa, ya, tx, ty)
    x, y = (paddle.to_tensor(a).astype("bfloat16") for a in (xa, ya))
    x.stop_gradient = y.stop_gradient = False
    out = kernels.matmul_v2(x, y, tx, ty).astype("float32")
    (out * _weights(out.shape)).sum().backward()
    got = [a.astype("float32").numpy() for a in (out, x.grad, y.grad)]
    folded = not tx and not ty and len(ys) == 2 and len(xs) > 2
    for name, g, w in zip(("result", "dx", "dy"), got, want):
        if folded and name == "dy":
            np.testing.assert_allclose(g, w, rtol=2 ** -7, atol=2 ** -7 * np.abs(w).max())
        else:
            assert np.array_equal(g, w), name
