"""Memory of one training step: fp32, the native bf16 AMP, and ours per policy, as ratios to
fp32, measured by ``amp_adapters.services.memory`` (a fresh process per run, the high-water mark reset
before one step after warm-up, median of three), as the CPU is and with oneDNN limited to
AVX512_CORE.

Models: the bench's families at sizes where activations outweigh parameters: an MLP (4
layers of 512, batch 8192), a CNN (two 3x3 convolutions, 64 channels, 56x56, batch 32) and a
Transformer block (d 256, sequence 128, batch 64), trained with momentum SGD; MXNet
(Gluon, hybridized) and Paddle (static, legacy IR; PIR too when the bench runs on Paddle 3). MXNet also runs one
Dense(2048) applied 8 times in an imperative (not hybridized) forward, batch 64: the reuse
case where MXNet's AMP casts the weight again at each use (apache/mxnet#19019).

Columns: the process's peak during the step (``VmHWM``), the step's transient (peak minus
the resident size before the step) and the framework's own count of its tensor bytes
(Paddle: the host allocator's peak; MXNet: the storage profiler's bytes allocated during
the step), each over fp32's. Emulated fp16 stores float32 and rounds through float16: it
is reported, not held to a target. Targets: ours (drop-in, the native's decisions) at most
1.05x the native's peak; ``auto`` at most 1.05x fp32's; O1-bf16 on the CNN at most 0.85x
fp32's where bf16 kernels run.
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
    return Workload(step, tensors=ProfilerBytes(), warmup=WARMUP)


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
        if o2:
            opt.amp_init(paddle.CPUPlace(), scope=scope)
    feed = {name: np.random.rand(*shape).astype("float32")}

    def step():
        with paddle.static.scope_guard(scope):
            exe.run(main_prog, feed=feed, fetch_list=[loss])
    return Workload(step, tensors=HostAllocatorBytes(), warmup=WARMUP)


# ---- the section -------------------------------------------------------------------------

def _measure(factory, *args, env=None) -> "StepMemory | str":
    try:
        return measure(SERVER, factory, *args, runs=RUNS, env=env)
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
        return f"| {framework} | {model} (batch {batch}) | {config} | {got} | | | |"
    return (f"| {framework} | {model} (batch {batch}) | {config} | "
            f"{_cell(got, base, 'peak')} | {_cell(got, base, 'transient')} | "
            f"{_cell(got, base, 'tensor_peak')} | {got.peak / MIB:.0f} / "
            f"{got.transient / MIB:.0f} |")


def _targets(framework: str, model: str, results: dict) -> list[str]:
    """The targets this model's rows hold or miss, one line each."""
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
        a, b = peak(config), peak(ref) if ref != "fp32" else fp32
        if a is None or b is None:
            failed = " and ".join(c for c in (config, ref) if peak(c) is None)
            out.append(f"- {framework}, {model}: {what}: not measured ({failed} failed)")
            continue
        held = "holds" if a <= limit * b else "MISSED"
        out.append(f"- {framework}, {model}: {what}: {a / b:.2f}x, {held}")
    return out


def rows(env: Optional[dict] = None) -> tuple[list[str], list[str]]:
    """(table rows, target lines) with the measuring processes in ``env`` (added to this
    environment)."""
    import paddle

    table, targets = [], []
    for model, batch in [*MODELS.items(), (REUSE, 64)]:
        configs = CONFIGS if model != REUSE else ("fp32", "native", "ours", "O1-bf16",
                                                  "O1-fp16-emulated")
        results = {c: _measure(mxnet_workload, model, batch, c, env=env) for c in configs}
        table += [_row("MXNet", model, batch, c, r, results["fp32"]) for c, r in results.items()]
        targets += _targets("MXNet", model, results)
    irs = [("legacy IR", False)] + ([("PIR", True)] if int(paddle.__version__[0]) >= 3 else [])
    for ir, pir in irs:
        for model, batch in MODELS.items():
            configs = [c for c in CONFIGS if not (pir and c == "native")]  # no PIR native
            results = {c: _measure(paddle_workload, pir, model, batch, c, env=env)
                       for c in configs}
            table += [_row(f"Paddle ({ir})", model, batch, c, r, results["fp32"])
                      for c, r in results.items()]
            targets += _targets(f"Paddle ({ir})", model, results)
    return table, targets


HEAD = ["| framework | model | config | peak / fp32 | transient / fp32 | framework's tensor "
        "bytes / fp32 | peak / transient, MiB |", "| --- | --- | --- | --- | --- | --- | --- |"]


def run() -> str:
    from amp_adapters.rules.isa import describe_bf16
    from amp_adapters.rules.isa import machine

    parts = ["## Memory of one training step: native, ours per policy, against fp32", "",
             __doc__.split("\n\n")[1].replace("\n", " "), "",
             __doc__.split("\n\n")[2].replace("\n", " "), "",
             f"Each figure: the median of {RUNS} fresh processes; their environment fixed: "
             f"{stated(fixed_env())}. Configs: "
             + "; ".join(f"`{k}` {v}" for k, v in CONFIGS.items()) + "."]
    for title, env, m in (("As the CPU is", None, machine()),
                          ("Limited to AVX512_CORE", CAPPED, {**machine(), "isa": CAPPED})):
        table, targets = rows(env)
        parts += ["", f"{title} ({describe_bf16(m)}):", "", *HEAD, *table, "", "Targets:", "",
                  *targets]
    return "\n".join(parts)


if __name__ == "__main__":
    main(mxnet_workload, paddle_workload)
    sys.exit(0)
