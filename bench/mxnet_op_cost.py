"""Figure: what the imperative (non-hybridized) MXNet wrapper costs per op call and per step.

Per op: the same call on small fp32 inputs (4x4) through the plain MXNet function,
the native ``mxnet.contrib.amp`` wrapper and ours, interleaved in one process (a
worker subprocess: the native ``init`` cannot be undone). ``mx.np``/``npx`` ops
are not patched by the native, so there native = plain. Per step: a 21-layer
Dense MLP (hidden 64, batch 32), imperative forward + backward, plain fp32 vs
``mxnet_amp.init()`` (on CPU every op stays fp32: the figure is the wrapper's
cost), toggled between steps outside the timed region. Targets: per op within
1.1x of the native wrapper; the MLP step within 1.1x of plain.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

from bench.timing import interleaved, ratio

STEPS = 3000


def _ops(mx):
    a, b = mx.nd.ones((4, 4)), mx.nd.ones((4, 4))
    na, nb = a.as_np_ndarray(), b.as_np_ndarray()
    return {  # name -> (module, attribute, arguments, keyword arguments)
        "exp": (mx.nd, "exp", (a,), {}),
        "elemwise_add": (mx.nd, "elemwise_add", (a, b), {}),
        "broadcast_mul": (mx.nd, "broadcast_mul", (a, b), {}),
        "softmax": (mx.nd, "softmax", (a,), {}),
        "Activation(relu)": (mx.nd, "Activation", (a,), {"act_type": "relu"}),
        "np.exp": (mx.np, "exp", (na,), {}),
        "np.add": (mx.np, "add", (na, nb), {}),
        "npx.softmax": (mx.npx, "softmax", (na,), {}),
    }


def worker() -> None:
    """Print {op: stats} as JSON: plain, native and ours for every op, interleaved."""
    import mxnet as mx
    from mxnet.contrib import amp as native

    import mxnet_amp

    ops = _ops(mx)
    plain = {k: getattr(m, a) for k, (m, a, _, _) in ops.items()}
    mxnet_amp.init()
    ours = {k: getattr(m, a) for k, (m, a, _, _) in ops.items()}
    mxnet_amp.reset()
    native.init()
    nat = {k: getattr(m, a) for k, (m, a, _, _) in ops.items()}
    out = {}
    for k, (_, _, args, kw) in ops.items():
        def call(f, args=args, kw=kw):
            return lambda: f(*args, **kw)
        stats = interleaved({"plain": call(plain[k]), "native": call(nat[k]),
                             "ours": call(ours[k])}, steps=STEPS, warmup=200)
        out[k] = {"ours/native": ratio(stats, "ours", "native"),
                  "native/plain": ratio(stats, "native", "plain"),
                  "ours/plain": ratio(stats, "ours", "plain"),
                  "added_us": (stats["ours"].median - stats["plain"].median) * 1e6,
                  "native_added_us": (stats["native"].median - stats["plain"].median) * 1e6}
    mx.nd.waitall()
    print(json.dumps(out))


def mlp_step(steps: int = 300) -> str:
    import mxnet as mx
    from mxnet import autograd, gluon

    import mxnet_amp
    from mxnet_amp import patching

    mx.random.seed(0)
    net = gluon.nn.Sequential()
    for _ in range(20):
        net.add(gluon.nn.Dense(64, activation="relu"))
    net.add(gluon.nn.Dense(10))
    net.initialize(mx.init.Xavier())
    x, y = mx.nd.random.uniform(shape=(32, 64)), mx.nd.array([i % 10 for i in range(32)])
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    mxnet_amp.init()
    patched = [(m, a, getattr(m, a), orig) for m, a, orig in patching._patches]
    mxnet_amp.reset()

    def use(on: bool) -> None:
        for m, a, wrapper, orig in patched:
            setattr(m, a, wrapper if on else orig)

    def step(on: bool):
        def run():
            with autograd.record():
                loss = loss_fn(net(x), y)
            loss.backward()
            loss.wait_to_read()
            for p in net.collect_params().values():
                p.grad().wait_to_read()
        return run

    # toggle outside the timed call: time each step through interleaved with a tiny wrapper
    import time
    times = {"plain": [], "ours": []}
    try:
        for i in range(steps + 20):
            for name in (("plain", "ours") if i % 2 else ("ours", "plain")):
                use(name == "ours")
                t0 = time.perf_counter()
                step(name == "ours")()
                if i >= 20:
                    times[name].append(time.perf_counter() - t0)
    finally:
        use(False)
    import numpy as np
    from bench.timing import Stats
    stats = {k: Stats(float(np.median(v)), float(np.percentile(v, 10)),
                      float(np.percentile(v, 90)), len(v)) for k, v in times.items()}
    return ratio(stats, "ours", "plain")


def run(steps: int = 300) -> str:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [os.getcwd(), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-m", "bench.mxnet_op_cost", "--worker"],
                          capture_output=True, text=True, env=env, check=True)
    per_op = json.loads(proc.stdout.strip().splitlines()[-1])
    rows = [f"| {op} | {r['native/plain']} | {r['ours/plain']} | {r['ours/native']} | "
            f"{r['native_added_us']:+.1f} / {r['added_us']:+.1f} |" for op, r in per_op.items()]
    step = mlp_step(steps)
    return "\n".join([
        "## Figure: imperative MXNet, the wrapper's cost per op and per step", "",
        "Small inputs (4x4 fp32), median of "
        f"{STEPS} calls per variant, interleaved in one process. mx.np/npx ops are not "
        "patched by the native: there its column is plain MXNet. Target: ours within 1.1x "
        "of the native wrapper.", "",
        "| op | native vs plain | ours vs plain | ours vs native | µs added (native / ours) |",
        "| --- | --- | --- | --- | --- |", *rows, "",
        f"21-layer Dense MLP (hidden 64, batch 32), imperative forward + backward, "
        f"`mxnet_amp.init()` vs plain fp32, {steps} steps each, interleaved: **{step}** "
        "(target 1.1x).", ""])


if __name__ == "__main__":
    if "--worker" in sys.argv:
        worker()
    else:
        print(run())
