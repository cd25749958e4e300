"""Memory of one training step: fp32, the native bf16 AMP, and ours per policy, as ratios to
fp32, measured by ``amp_adapters.services.memory`` (a fresh process per run, the high-water mark
reset
before one step after warm-up, median of three), as the CPU is and with oneDNN limited to
AVX512_CORE.

Models: the bench's families at sizes where activations outweigh parameters: an MLP (4
layers of 512, batch 8192), a CNN (two 3x3 convolutions, 64 channels, 56x56, batch 32) and a
Transformer block (d 256, sequence 128, batch 64), trained with momentum SGD; MXNet (Gluon,
hybridized), Paddle static in the legacy IR and in PIR (run by Paddle 3's interpreter when
the bench runs on Paddle 2: ``paddle3_python``) and Paddle dygraph (``paddle_amp.dygraph``).
MXNet and dygraph also run one Dense/Linear(2048) applied 8 times in an imperative forward,
batch 64: the reuse case where MXNet's AMP casts the weight again at each use
(apache/mxnet#19019).

Columns: the process's peak during the step (``VmHWM``), the step's transient (peak minus
the resident size before the step) and the framework's own count of its tensor bytes
(Paddle: the host allocator's peak; MXNet: the storage profiler's bytes allocated during
the step), each over fp32's; for O2, the parameter bytes its plan stores (the low copies
and their float32 masters, from the core's parameter plan) beside float32's. Emulated fp16
stores float32 and rounds through float16: it is reported, not held to a target. Targets:
ours (drop-in, the native's decisions) at most 1.05x the native's peak; ``auto`` at most
1.05x fp32's; O1-bf16 on the CNN at most 0.85x fp32's where bf16 kernels run (a CPU
without them, and Paddle in any runtime, cannot show it: the target line says so).
"""
from __future__ import annotations

import os
import sys
from typing import Optional

from amp_adapters.services.memory import (RUNS, MemoryMeasureFailed, StepMemory, Workload,
                                          fixed_env, main, measure, stated)

SERVER = "bench.memory"
MIB = 1 << 20
WARMUP = 2
MODELS = {"MLP 4x512": 8192, "CNN 3x3 64ch 56x56": 32, "Transformer block d256": 64}
REUSE = "Dense(2048) x8, imperative"
# config -> (what it is, for the table)
CONFIGS = {
    "fp32": "float32",
    "native": "the native bf16 AMP",
    "ours": "ours, drop-in bf16 (the native's decisions)",
    "O1-bf16": "ours, O1-bf16",
    "O2-bf16": "ours, O2-bf16 (bf16 parameters, float32 masters)",
    "O1-fp16-emulated": "ours, O1 fp16 emulated (stores float32)",
    "O2-fp16-emulated": "ours, O2 fp16 emulated (stores float32)",
    "auto": "ours, auto (bf16 only where measured faster)",
}
CAPPED = {"DNNL_MAX_CPU_ISA": "AVX512_CORE", "ONEDNN_MAX_CPU_ISA": "AVX512_CORE"}


def _policy(config: str) -> tuple[str, bool]:
    """(preset, emulate) of one of our policy configs."""
    if config.endswith("-fp16-emulated"):
        return config.split("-")[0], True
    return config, False


def o2_param_bytes(plan, shapes: dict) -> dict:
    """The parameter bytes an O2 ``plan`` (the core's ``ParamPlan``) stores, from the
    parameters' ``shapes``: a low parameter its low copy (2 bytes an element) and its float32
    master (4), a float32 one 4; beside what float32 stores (4 bytes an element)."""
    size = {"float32": 4, "float16": 2, "bfloat16": 2}
    planned = fp32 = 0
    for name, dtype in plan.dtypes.items():
        n = 1
        for d in shapes[name]:
            n *= int(d)
        fp32 += 4 * n
        planned += (size[dtype] + 4) * n if dtype != "float32" else 4 * n
    return {"o2_param_bytes": planned, "fp32_param_bytes": fp32,
            "o2_low_params": len(plan.low), "params": len(plan.dtypes)}


# ---- MXNet -------------------------------------------------------------------------------

def _mx_net(model: str, batch: int):
    import mxnet as mx
    from mxnet.gluon import nn

    from bench.bf16_cpu import _transformer_class

    if model == REUSE:
        class Reused(nn.Block):
            def __init__(self):
                super().__init__()
                self.dense = nn.Dense(2048, in_units=2048, activation="relu")

            def forward(self, x):
                for _ in range(8):
                    x = self.dense(x)
                return x
        net, shape = Reused(), (batch, 2048)
    elif model.startswith("MLP"):
        net, shape = nn.HybridSequential(), (batch, 512)
        for _ in range(4):
            net.add(nn.Dense(512, activation="relu"))
    elif model.startswith("CNN"):
        net, shape = nn.HybridSequential(), (batch, 64, 56, 56)
        for _ in range(2):
            net.add(nn.Conv2D(64, 3, padding=1, activation="relu"))
    else:
        net, shape = _transformer_class()(256), (batch, 128, 256)
    net.initialize()
    if model != REUSE:
        net.hybridize()
    return net, mx.nd.random.uniform(shape=shape)


def mxnet_workload(model: str, batch: int, config: str) -> Workload:
    """One Gluon training step of ``model`` under ``config`` (``CONFIGS``)."""
    import mxnet as mx
    from mxnet import autograd, gluon

    from mxnet_amp.memory import ProfilerBytes

    amp = None
    if config == "native":
        from mxnet.contrib import amp
        amp.init(target_dtype="bfloat16")
    elif config != "fp32":
        import mxnet_amp as amp
        if config == "ours":
            amp.init(target_dtype="bfloat16")
        else:
            preset, emulate = _policy(config)
            amp.init(policy=preset, emulate=emulate)
    net, x = _mx_net(model, batch)
    facts = {}
    if config.startswith("O2"):  # O2 stores the parameters it plans low (cast_params)
        net(x)  # parameters' shapes known (deferred initialization)
        plan = amp.cast_params(net)
        facts = o2_param_bytes(plan, {n: p.shape for n, p in net.collect_params().items()})
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 1e-3,
                                                         "momentum": 0.9})
    scaled = amp is not None and config != "native"
    if scaled:
        amp.init_trainer(trainer)

    def step():
        with autograd.record():
            loss = net(x).astype("float32").mean()
            if scaled:
                with amp.scale_loss(loss, trainer) as s:
                    autograd.backward(s)
        if not scaled:
            loss.backward()
        trainer.step(1)
        mx.nd.waitall()
    return Workload(step, tensors=ProfilerBytes(), warmup=WARMUP, facts=facts)


# ---- Paddle ------------------------------------------------------------------------------

def _paddle_model(model: str, batch: int):
    """The forward pass in the current static program: (feed name, feed shape, loss)."""
    import paddle
    from paddle import nn

    relu = paddle.nn.functional.relu
    if model.startswith("MLP"):
        h = x = paddle.static.data("x", [None, 512], "float32")
        for _ in range(4):
            h = relu(nn.Linear(512, 512)(h))
        shape = [batch, 512]
    elif model.startswith("CNN"):
        h = x = paddle.static.data("x", [None, 64, 56, 56], "float32")
        for _ in range(2):
            h = relu(nn.Conv2D(64, 64, 3, padding=1)(h))
        shape = [batch, 64, 56, 56]
    else:  # as bench.bf16_cpu.paddle_model's Transformer block, d 256
        d = 256
        x = paddle.static.data("x", [None, 128, d], "float32")
        q, k, v = paddle.split(nn.Linear(d, 3 * d)(x), 3, axis=-1)
        att = paddle.nn.functional.softmax(
            paddle.mm(q, paddle.transpose(k, [0, 2, 1])) * d ** -0.5)
        h = nn.LayerNorm(d)(x + nn.Linear(d, d)(paddle.mm(att, v)))
        h = nn.LayerNorm(d)(h + nn.Linear(4 * d, d)(relu(nn.Linear(d, 4 * d)(h))))
        shape = [batch, 128, d]
    return x.name, shape, paddle.mean(paddle.cast(h, "float32"))


def paddle_workload(pir: bool, model: str, batch: int, config: str) -> Workload:
    """One Paddle static training step of ``model`` under ``config`` (``CONFIGS``), in PIR or
    the legacy IR."""
    os.environ["FLAGS_enable_pir_api"] = "1" if pir else "0"
    import numpy as np
    import paddle

    from paddle_amp.memory import HostAllocatorBytes

    paddle.enable_static()
    main_prog, start = paddle.static.Program(), paddle.static.Program()
    o2 = False
    with paddle.static.program_guard(main_prog, start):
        name, shape, loss = _paddle_model(model, batch)
        opt = paddle.optimizer.Momentum(1e-3, 0.9)
        if config in ("native", "ours"):
            amp = paddle.static.amp if config == "native" else __import__("paddle_amp")
            opt = amp.bf16.decorate_bf16(opt, amp_lists=amp.bf16.AutoMixedPrecisionListsBF16(),
                                         use_bf16_guard=False)
        elif config != "fp32":
            import paddle_amp
            preset, emulate = _policy(config)
            opt = paddle_amp.decorate(opt, policy=preset, emulate=emulate)
            o2 = preset.startswith("O2")
        opt.minimize(loss)
    exe = paddle.static.Executor(paddle.CPUPlace())
    scope = paddle.static.Scope()
    with paddle.static.scope_guard(scope):
        exe.run(start)
        facts = {}
        if o2:
            opt.amp_init(paddle.CPUPlace(), scope=scope)
            plan = opt.param_plan()
            facts = o2_param_bytes(plan, {n: scope.find_var(n).get_tensor().shape()
                                          for n in plan.dtypes})
    feed = {name: np.random.rand(*shape).astype("float32")}

    def step():
        with paddle.static.scope_guard(scope):
            exe.run(main_prog, feed=feed, fetch_list=[loss])
    return Workload(step, tensors=HostAllocatorBytes(), warmup=WARMUP, facts=facts)


# ---- Paddle dygraph -----------------------------------------------------------------------

DYGRAPH_CONFIGS = {
    "fp32": "float32",
    "native": "paddle.amp.auto_cast(dtype='bfloat16'): on a CPU it casts nothing (its eager "
              "casts are for GPU, XPU and custom places)",
    "ours": "ours, drop-in paddle_amp.dygraph.auto_cast(dtype='bfloat16') (paddle.amp's "
            "lists, run on this CPU)",
    "O1-bf16": "ours, paddle_amp.dygraph.auto_cast(policy='O1-bf16')",
    "O1-fp16-emulated": "ours, O1 fp16 emulated (stores float32)",
    "O2-bf16": "ours, paddle_amp.dygraph.decorate(policy='O2-bf16') and its region (bf16 "
               "parameters, float32 masters)",
    "O2-fp16-emulated": "ours, O2 fp16 emulated (stores float32)",
    "auto": "ours, auto",
}


def _dygraph_net(model: str):
    """(layer, input shape) of ``model`` in eager mode (the static models' layers)."""
    import paddle
    from paddle import nn

    relu = nn.functional.relu
    if model == REUSE:
        class Reused(nn.Layer):
            def __init__(self):
                super().__init__()
                self.dense = nn.Linear(2048, 2048)

            def forward(self, x):
                for _ in range(8):
                    x = relu(self.dense(x))
                return x
        return Reused(), [2048]
    if model.startswith("MLP"):
        return nn.Sequential(*[m for _ in range(4) for m in (nn.Linear(512, 512),
                                                            nn.ReLU())]), [512]
    if model.startswith("CNN"):
        return nn.Sequential(*[m for _ in range(2) for m in (nn.Conv2D(64, 64, 3, padding=1),
                                                            nn.ReLU())]), [64, 56, 56]

    class Block(nn.Layer):  # as _paddle_model's Transformer block, d 256
        def __init__(self, d=256):
            super().__init__()
            self.d, self.qkv, self.proj = d, nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.up, self.down = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
            self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)

        def forward(self, x):
            q, k, v = paddle.split(self.qkv(x), 3, axis=-1)
            att = nn.functional.softmax(
                paddle.matmul(q, k, transpose_y=True) * self.d ** -0.5)
            h = self.ln1(x + self.proj(paddle.matmul(att, v)))
            return self.ln2(h + self.down(relu(self.up(h))))
    return Block(), [128, 256]


def dygraph_refusal(config: str) -> Optional[str]:
    """Why ``paddle_amp.dygraph`` refuses ``config`` today (None: it runs it): ``auto`` is
    being added to dygraph, so its row says so rather than failing."""
    if config not in ("auto",):
        return None
    from paddle_amp.dygraph.config import policy_of
    try:
        policy_of(policy="auto")
    except Exception as e:  # noqa: BLE001  (any refusal is the row's reason)
        return f"skipped: policy='auto' is refused in dygraph today ({type(e).__name__})"
    return None


def dygraph_workload(model: str, batch: int, config: str) -> Workload:
    """One Paddle dygraph training step of ``model`` under ``config`` (``DYGRAPH_CONFIGS``)."""
    import contextlib

    import paddle

    from paddle_amp.memory import HostAllocatorBytes

    paddle.disable_static()
    net, shape = _dygraph_net(model)
    opt = paddle.optimizer.Momentum(1e-3, 0.9, parameters=net.parameters())
    x = paddle.rand([batch, *shape], "float32")
    scaler, facts = None, {}
    if config == "fp32":
        region = contextlib.nullcontext
    elif config == "native":
        region = lambda: paddle.amp.auto_cast(dtype="bfloat16")  # noqa: E731
    elif config == "ours":
        from paddle_amp import dygraph as amp
        region = lambda: amp.auto_cast(dtype="bfloat16")  # noqa: E731
    else:
        from paddle_amp import dygraph as amp
        preset, emulate = _policy(config)
        if preset.startswith("O2"):  # O2 stores the parameters it plans low (decorate)
            net, opt = amp.decorate(net, opt, policy=preset, emulate=emulate)
            facts = _stored_param_bytes(net)
        region = lambda: amp.auto_cast(policy=preset, emulate=emulate)  # noqa: E731
        if emulate:
            scaler = amp.GradScaler(init_loss_scaling=1024.0)

    def step():
        with region():
            loss = net(x).astype("float32").mean()
        if scaler is None:
            loss.backward()
            opt.step()
        else:
            scaler.minimize(opt, scaler.scale(loss))
        opt.clear_grad()
    return Workload(step, tensors=HostAllocatorBytes(), warmup=WARMUP, facts=facts)


def _stored_param_bytes(net) -> dict:
    """``o2_param_bytes`` of the dtypes a decorated dygraph ``net``'s parameters are stored in
    (a low one beside its float32 master)."""
    from amp_adapters import ParamPlan

    params = {p.name: p for p in net.parameters()}
    plan = ParamPlan({n: str(p.dtype).replace("paddle.", "") for n, p in params.items()}, {})
    return o2_param_bytes(plan, {n: p.shape for n, p in params.items()})


# ---- the section -------------------------------------------------------------------------

def _measure(factory, *args, env=None, python=None) -> "StepMemory | str":
    try:
        return measure(SERVER, factory, *args, runs=RUNS, env=env, python=python)
    except MemoryMeasureFailed as e:
        return f"failed: {str(e).split(': ', 1)[-1][:120]}"


def _cell(got, base, field: str) -> str:
    if isinstance(got, str) or isinstance(base, str):
        return "-"
    value, ref = getattr(got, field), getattr(base, field)
    if value is None or not ref:
        return "-"
    return f"{value / ref:.2f}"


def _row(framework: str, model: str, batch: int, config: str, got, base) -> str:
    if isinstance(got, str):
        return f"| {framework} | {model} (batch {batch}) | {config} | {got} | | | | |"
    planned = got.facts.get("o2_param_bytes")
    o2 = "" if planned is None else (
        f"{planned / MIB:.1f} / {got.facts['fp32_param_bytes'] / MIB:.1f} "
        f"({got.facts['o2_low_params']} of {got.facts['params']} low)")
    return (f"| {framework} | {model} (batch {batch}) | {config} | "
            f"{_cell(got, base, 'peak')} | {_cell(got, base, 'transient')} | "
            f"{_cell(got, base, 'tensor_peak')} | {got.peak / MIB:.0f} / "
            f"{got.transient / MIB:.0f} | {o2} |")


# why a runtime cannot show the O1-bf16 CNN target, whatever it measures (docs/memory.md)
PADDLE_CONV = ("Paddle runs conv2d float32 on a CPU in every runtime (2.6.2's oneDNN conv2d "
               "takes no bf16 filter, eager mode has no oneDNN conv2d route, PIR's convolution "
               "saves nothing: the step's tensor bytes are fp32's)")


def _ratio(a: float, b: float, limit: float) -> str:
    """``a / b`` to two decimals, or three where two would print the limit it misses or
    just holds (0.854 against 0.85)."""
    r = a / b
    return f"{r:.3f}x" if round(r, 2) == limit and r != limit else f"{r:.2f}x"


def _targets(framework: str, model: str, results: dict, bf16: str = "native") -> list[str]:
    """The targets this model's rows hold or miss, one line each; ``bf16``: the bf16 class
    of the CPU the rows ran on (``isa.bf16_class``): only "native" can show the O1-bf16
    target, and no Paddle runtime can (``PADDLE_CONV``)."""
    out = []

    def peak(c):
        r = results.get(c)
        return None if r is None or isinstance(r, str) else r.peak

    fp32 = peak("fp32")
    for config, ref, limit, what in (("ours", "native", 1.05, "ours (drop-in) <= 1.05x native"),
                                     ("auto", "fp32", 1.05, "auto <= 1.05x fp32"),
                                     ("O1-bf16", "fp32", 0.85, "O1-bf16 <= 0.85x fp32")):
        if (config == "O1-bf16" and not model.startswith("CNN")) or config not in results:
            continue  # not a target of this model, or not run for it
        if ref not in results:
            out.append(f"- {framework}, {model}: {what}: no {ref} in this runtime")
            continue
        a, b = peak(config), peak(ref) if ref != "fp32" else fp32
        if a is None or b is None:
            failed = " and ".join(c for c in (config, ref) if peak(c) is None)
            out.append(f"- {framework}, {model}: {what}: not measured ({failed} failed)")
            continue
        cannot = None
        if config == "O1-bf16":
            cannot = (f"no bf16 kernel runs on this CPU (bf16 class {bf16!r})"
                      if bf16 != "native" else
                      PADDLE_CONV if framework.startswith("Paddle") else None)
        if cannot is not None:
            out.append(f"- {framework}, {model}: {what}: cannot show: {cannot}; measured "
                       f"{_ratio(a, b, limit)}")
            continue
        held = "holds" if a <= limit * b else "MISSED"
        out.append(f"- {framework}, {model}: {what}: {_ratio(a, b, limit)}, {held}")
    return out


GROUPS = ("mxnet", "paddle-legacy", "paddle-pir", "paddle-dygraph")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def paddle3_python() -> Optional[str]:
    """The interpreter that runs Paddle 3 (PIR): this one if its Paddle is 3, else
    ``$AMP_BENCH_PADDLE3`` or the project's ``.venv-paddle3`` beside this venv (``make
    test-paddle3`` makes it); None if there is none."""
    import paddle
    if int(paddle.__version__[0]) >= 3:
        return sys.executable
    for candidate in (os.environ.get("AMP_BENCH_PADDLE3"),
                      os.path.join(os.path.dirname(sys.prefix), ".venv-paddle3", "bin",
                                   "python")):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


def _paddle3_version(python: str) -> str:
    import subprocess
    r = subprocess.run([python, "-c", "import paddle; print(paddle.__version__)"],
                       capture_output=True, text=True, env={**os.environ, "PYTHONPATH": ""})
    return r.stdout.strip().splitlines()[-1] if r.returncode == 0 and r.stdout.strip() else "3"


def rows(env: Optional[dict] = None, groups=GROUPS,
         bf16: str = "native") -> tuple[list[str], list[str]]:
    """(table rows, target lines) of ``groups`` with the measuring processes in ``env``
    (added to this environment), on a CPU of bf16 class ``bf16`` (``_targets``)."""
    import paddle

    table, targets = [], []
    if "mxnet" in groups:
        for model, batch in [*MODELS.items(), (REUSE, 64)]:
            configs = CONFIGS if model != REUSE else ("fp32", "native", "ours", "O1-bf16",
                                                      "O1-fp16-emulated")
            results = {c: _measure(mxnet_workload, model, batch, c, env=env) for c in configs}
            table += [_row("MXNet", model, batch, c, r, results["fp32"])
                      for c, r in results.items()]
            targets += _targets("MXNet", model, results, bf16)
    runs = []  # (label, pir, interpreter, its environment)
    if "paddle-legacy" in groups:
        runs.append((f"Paddle {paddle.__version__} (legacy IR)", False, None, env))
    if "paddle-pir" in groups:
        py3 = paddle3_python()
        if py3 is None:
            table.append("| Paddle (PIR) | - | - | skipped: no Paddle 3 interpreter (set "
                         "AMP_BENCH_PADDLE3 or run `make test-paddle3` first) | | | | |")
        else:
            own = py3 == sys.executable
            version = paddle.__version__ if own else _paddle3_version(py3)
            runs.append((f"Paddle {version} (PIR)", True, None if own else py3,
                         env if own else {**(env or {}), "PYTHONPATH": ROOT}))
    for label, pir, py, run_env in runs:
        for model, batch in MODELS.items():
            configs = [c for c in CONFIGS if not (pir and c == "native")]  # no PIR native
            results = {c: _measure(paddle_workload, pir, model, batch, c, env=run_env,
                                   python=py) for c in configs}
            table += [_row(label, model, batch, c, r, results["fp32"])
                      for c, r in results.items()]
            targets += _targets(label, model, results, bf16)
    if "paddle-dygraph" in groups:
        label = f"Paddle {paddle.__version__} (dygraph)"
        for model, batch in [*MODELS.items(), (REUSE, 64)]:
            results = {c: dygraph_refusal(c) or _measure(dygraph_workload, model, batch, c,
                                                         env=env)
                       for c in DYGRAPH_CONFIGS}
            table += [_row(label, model, batch, c, r, results["fp32"])
                      for c, r in results.items()]
            targets += _targets(label, model, results, bf16)
    return table, targets


HEAD = ["| framework | model | config | peak / fp32 | transient / fp32 | framework's tensor "
        "bytes / fp32 | peak / transient, MiB | O2 parameters planned / fp32's, MiB |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |"]


def run(groups=GROUPS) -> str:
    from amp_adapters.rules.isa import bf16_class, describe_bf16, machine

    parts = ["## Memory of one training step: native, ours per policy, against fp32", "",
             __doc__.split("\n\n")[1].replace("\n", " "), "",
             __doc__.split("\n\n")[2].replace("\n", " "), "",
             f"Each figure: the median of {RUNS} fresh processes; their environment fixed: "
             f"{stated(fixed_env())}. Configs: "
             + "; ".join(f"`{k}` {v}" for k, v in CONFIGS.items()) + ". Dygraph: "
             + "; ".join(f"`{k}` {v}" for k, v in DYGRAPH_CONFIGS.items()) + "."]
    for title, env, m in (("As the CPU is", None, machine()),
                          ("Limited to AVX512_CORE", CAPPED, {**machine(), "isa": CAPPED})):
        table, targets = rows(env, groups, bf16_class(m))
        parts += ["", f"{title} ({describe_bf16(m)}):", "", *HEAD, *table, "", "Targets:", "",
                  *targets]
    return "\n".join(parts)


if __name__ == "__main__":
    main(mxnet_workload, paddle_workload, dygraph_workload)
    sys.exit(0)
