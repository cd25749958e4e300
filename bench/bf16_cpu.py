"""bf16 on the CPU: native bf16 / fp32, ours with the native's decisions / fp32, and ours
``policy="auto"`` (bf16 only where measured faster here) / fp32, training and inference,
run as the CPU is and again with oneDNN limited to AVX512_CORE (a CPU class with AVX-512
but no bf16 instructions), the limit set in the child before the framework loads.

Models: an MLP (4 layers of 2048), a CNN (3x3 convolutions, 64 channels,
56x56) and a Transformer block (self-attention and MLP, LayerNorm), batch 32.
MXNet inference: ``mxnet.contrib.amp.convert_hybrid_block`` vs ours, both
against the fp32 block, interleaved in one process. MXNet training:
``amp.init(target_dtype="bfloat16")`` patches MXNet for the process, so the
native's and ours each run in a child process against their own fp32 steps.
Paddle: the native and our ``decorate_bf16`` training step and
``rewrite_program_bf16`` inference vs fp32, each model (legacy IR; ours under
PIR too on Paddle 3), each in a child process.

A row runs only where the framework has the bf16 kernels it needs, by its own
answer (MXNet and ours on Paddle: our kernel probes, forward and backward for
training; Paddle's native: ``core.supports_bfloat16()``); elsewhere the row says
it cannot run and why. Nothing is timed on a CPU without them and no figure is
made up.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap

from amp_adapters.rules.isa import bf16_class, describe_bf16, machine

MODELS = ("MLP 4x2048", "CNN 3x3 64ch 56x56", "Transformer block")
GEMM = {"MLP 4x2048": "FullyConnected", "CNN 3x3 64ch 56x56": "Convolution",
        "Transformer block": "FullyConnected"}
STEPS, BATCH = 30, 32


def _why_not(what: str) -> str:
    return f"cannot run: {what} ({describe_bf16(machine())})"


def _mx_block(model: str):
    import mxnet as mx
    from mxnet.gluon import nn

    net = nn.HybridSequential()
    if model.startswith("MLP"):
        shape = (BATCH, 2048)
        for _ in range(4):
            net.add(nn.Dense(2048, activation="relu"))
    elif model.startswith("CNN"):
        shape = (BATCH, 64, 56, 56)
        for _ in range(2):
            net.add(nn.Conv2D(64, 3, padding=1, activation="relu"))
    else:
        shape = (BATCH, 128, 512)
        net.add(_TransformerBlock(512))
    net.initialize()
    net.hybridize()
    x = mx.nd.random.uniform(shape=shape)
    net(x).wait_to_read()
    return net, x


def _transformer_class():
    from mxnet.gluon import nn

    class Block(nn.HybridBlock):
        """Self-attention (one head) and a 4x MLP, each with a residual and a LayerNorm."""

        def __init__(self, d: int):
            super().__init__()
            self.qkv, self.proj = nn.Dense(3 * d, flatten=False), nn.Dense(d, flatten=False)
            self.up = nn.Dense(4 * d, flatten=False, activation="relu")
            self.down = nn.Dense(d, flatten=False)
            self.ln1, self.ln2 = nn.LayerNorm(), nn.LayerNorm()
            self.d = d

        def hybrid_forward(self, F, x):
            q, k, v = F.split(self.qkv(x), num_outputs=3, axis=-1)
            att = F.softmax(F.batch_dot(q, k, transpose_b=True) / self.d ** 0.5)
            h = self.ln1(x + self.proj(F.batch_dot(att, v)))
            return self.ln2(h + self.down(self.up(h)))
    return Block


def _TransformerBlock(d: int):
    return _transformer_class()(d)


def mxnet_inference_rows() -> list[str]:
    import mxnet as mx
    from mxnet.contrib import amp as native

    import mxnet_amp as ours
    from mxnet_amp.kernels import has_kernel

    from .timing import interleaved, ratio

    rows = []
    for model in MODELS:
        if not has_kernel(GEMM[model], mx.cpu(), "bfloat16"):
            rows.append(f"| MXNet | {model} | inference | "
                        f"{_why_not(f'no bfloat16 {GEMM[model]} kernel')} | | |")
            continue
        net, x = _mx_block(model)
        theirs = native.convert_hybrid_block(net, target_dtype="bfloat16", ctx=mx.cpu())
        mine = ours.convert_hybrid_block(net, target_dtype="bfloat16", ctx=mx.cpu())
        auto = ours.convert_hybrid_block(net, policy="auto", ctx=mx.cpu(),
                                         input_shapes={"data": x.shape})
        stats = interleaved({"fp32": lambda: net(x).wait_to_read(),
                             "native": lambda: theirs(x).wait_to_read(),
                             "ours": lambda: mine(x).wait_to_read(),
                             "auto": lambda: auto(x).wait_to_read()}, steps=STEPS, warmup=3)
        rows.append(f"| MXNet | {model} | inference | {ratio(stats, 'native', 'fp32')} | "
                    f"{ratio(stats, 'ours', 'fp32')} | {ratio(stats, 'auto', 'fp32')} |")
    return rows


_MX_TRAIN = textwrap.dedent("""
    import sys
    import mxnet as mx
    from mxnet import autograd, gluon
    from bench.bf16_cpu import _mx_block, STEPS
    from bench.timing import interleaved, ratio
    which, model, policy = sys.argv[1:4]  # "bfloat16": init(target_dtype=), the native lists
    if which == "native":
        from mxnet.contrib import amp
    else:
        import mxnet_amp as amp
    fp32_net, x = _mx_block(model)
    # init patches MXNet for the process: the low block is built and traced after it
    amp.init(target_dtype="bfloat16") if policy == "bfloat16" else amp.init(policy=policy)
    low_net, _ = _mx_block(model)
    t32 = gluon.Trainer(fp32_net.collect_params(), "sgd", {"learning_rate": 1e-3})
    tlow = gluon.Trainer(low_net.collect_params(), "sgd", {"learning_rate": 1e-3})
    scaled = which == "ours"  # ours with its loss-scale protocol (bf16: no scale), as a user
    if scaled:
        amp.init_trainer(tlow)
    def step(net, trainer, amp_on):
        def run():
            with autograd.record():  # the loss is scaled while recording, as natively
                loss = net(x).mean()
                if amp_on:
                    with amp.scale_loss(loss, trainer) as s:
                        autograd.backward(s)
            if not amp_on:
                loss.backward()
            trainer.step(1)
            mx.nd.waitall()  # the update too (asynchronous): else the next step timed pays it
        return run
    stats = interleaved({"fp32": step(fp32_net, t32, False),
                         "low": step(low_net, tlow, scaled)}, steps=STEPS, warmup=3)
    print(ratio(stats, "low", "fp32"))
""")


def mxnet_o2_rows() -> list[str]:
    """Ours, O1-bf16 and O2-bf16 (bf16 parameters, float32 masters) against fp32, MLP
    training, each policy in a child process against its own fp32 steps."""
    import mxnet as mx

    from mxnet_amp.kernels import has_kernel

    model = "MLP 4x2048"
    if has_kernel("FullyConnected", mx.cpu(), "bfloat16", backward=True):
        o1, o2 = (_child(_MX_TRAIN, "ours", model, p) for p in ("O1-bf16", "O2-bf16"))
    else:
        o1 = o2 = _why_not("no bfloat16 FullyConnected kernel, forward and backward")
    return [f"| MXNet | {model} | {o1} | {o2} |"]


def paddle_o2_rows() -> list[str]:
    """As ``mxnet_o2_rows``, for Paddle: the legacy IR and, on Paddle 3, PIR."""
    import paddle

    model = "MLP 4x2048"
    rows = []
    for name, pir in [("legacy IR", False)] + ([("PIR", True)]
                                                if int(paddle.__version__[0]) >= 3 else []):
        if _ours_gemm(model, pir):
            o1, o2 = (_child(_PADDLE_STEP, "ours", "1" if pir else "0", model, "training",
                             level) for level in ("O1", "O2"))
        else:
            o1 = o2 = _why_not("paddle_amp finds no oneDNN bf16 matmul here")
        rows.append(f"| Paddle ({name}) | {model} | {o1} | {o2} |")
    return rows


def mxnet_training_rows() -> list[str]:
    import mxnet as mx

    from mxnet_amp.kernels import has_kernel

    rows = []
    for model in MODELS:
        if not has_kernel(GEMM[model], mx.cpu(), "bfloat16", backward=True):
            rows.append(f"| MXNet | {model} | training | "
                        f"{_why_not(f'no bfloat16 {GEMM[model]} kernel, forward and backward')}"
                        f" | | |")
            continue
        native, ours = (_child(_MX_TRAIN, which, model, "bfloat16")
                        for which in ("native", "ours"))
        auto = _child(_MX_TRAIN, "ours", model, "auto")
        rows.append(f"| MXNet | {model} | training | {native} | {ours} | {auto} |")
    return rows


# the op whose bf16 kernel a Paddle row needs (either name: Linear is matmul_v2, the
# native MLP step's fc was mul)
PADDLE_GEMM = {"MLP 4x2048": {"mul", "matmul_v2"}, "CNN 3x3 64ch 56x56": {"conv2d"},
               "Transformer block": {"mul", "matmul_v2"}}
MODES = ("training", "inference")


def paddle_model(model: str):
    """The model's forward pass in the current static program: (feed name, shape, loss)."""
    import paddle
    from paddle import nn as nn_

    if model.startswith("MLP"):
        shape = [BATCH, 2048]
        h = x = paddle.static.data("x", [None, 2048], "float32")
        for _ in range(4):
            h = paddle.nn.functional.relu(nn_.Linear(2048, 2048)(h))
    elif model.startswith("CNN"):
        shape = [BATCH, 64, 56, 56]
        h = x = paddle.static.data("x", [None, 64, 56, 56], "float32")
        for _ in range(2):
            h = paddle.nn.functional.relu(nn_.Conv2D(64, 64, 3, padding=1)(h))
    else:  # one head of self-attention and a 4x MLP, each with a residual and a LayerNorm
        d = 512
        shape = [BATCH, 128, d]
        x = paddle.static.data("x", [None, 128, d], "float32")
        q, k, v = paddle.split(nn_.Linear(d, 3 * d)(x), 3, axis=-1)
        # paddle.mm: Paddle 3.3.1's legacy IR builds no paddle.matmul (it calls the PIR op)
        att = paddle.nn.functional.softmax(
            paddle.mm(q, paddle.transpose(k, [0, 2, 1])) * d ** -0.5)
        h = nn_.LayerNorm(d)(x + nn_.Linear(d, d)(paddle.mm(att, v)))
        up = paddle.nn.functional.relu(nn_.Linear(d, 4 * d)(h))
        h = nn_.LayerNorm(d)(h + nn_.Linear(4 * d, d)(up))
    return x.name, shape, paddle.mean(h)


def paddle_program(model: str, mode: str, amp, bf16: bool, pure: bool = False,
                   policy=None):
    """(main, startup, feed name, feed shape, loss, optimizer) of ``model``: a training step
    (SGD, under ``amp.bf16.decorate_bf16`` when ``bf16``; pure bf16, O2, with ``pure``;
    under ``amp.decorate(policy=policy)`` with a ``policy``) or the forward pass for
    inference (rewritten by ``amp.bf16.rewrite_program_bf16`` when ``bf16``); ``amp``:
    ``paddle.static.amp`` or ``paddle_amp``."""
    import paddle

    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    main, start = paddle.static.Program(), paddle.static.Program()
    opt = None
    with paddle.static.program_guard(main, start):
        name, shape, loss = paddle_model(model)
        lists = amp.bf16.AutoMixedPrecisionListsBF16()
        if mode == "training":
            opt = paddle.optimizer.SGD(1e-3)
            if bf16 and policy is not None:
                opt = amp.decorate(opt, policy=policy)
            elif bf16:
                opt = amp.bf16.decorate_bf16(opt, amp_lists=lists, use_bf16_guard=False,
                                             use_pure_bf16=pure)
            opt.minimize(loss)
    if mode == "inference" and bf16:
        amp.bf16.rewrite_program_bf16(main, lists)
    return main, start, name, shape, loss, opt


_PADDLE_STEP = textwrap.dedent("""
    import os, sys
    os.environ["FLAGS_enable_pir_api"] = sys.argv[2]
    import numpy as np
    import paddle
    from bench.bf16_cpu import paddle_program
    from bench.bf16_cpu import STEPS
    from bench.timing import interleaved, ratio
    paddle.enable_static()
    amp = paddle.static.amp if sys.argv[1] == "native" else __import__("paddle_amp")
    model, mode = sys.argv[3], sys.argv[4]
    pure = len(sys.argv) > 5 and sys.argv[5] == "O2"
    policy = sys.argv[5] if len(sys.argv) > 5 and sys.argv[5] == "auto" else None
    def build(bf16):
        main, start, name, shape, loss, opt = paddle_program(model, mode, amp, bf16, pure,
                                                             policy)
        exe = paddle.static.Executor(paddle.CPUPlace())
        scope = paddle.static.Scope()
        with paddle.static.scope_guard(scope):
            exe.run(start)
            if bf16 and (pure or policy):
                opt.amp_init(paddle.CPUPlace(), scope=scope)
        feed = {name: np.random.rand(*shape).astype("float32")}
        def step():
            with paddle.static.scope_guard(scope):
                exe.run(main, feed=feed, fetch_list=[loss])
        return step
    stats = interleaved({"fp32": build(False), "bf16": build(True)}, steps=STEPS, warmup=3)
    print(ratio(stats, "bf16", "fp32"))
""")


def _ours_gemm(model: str = "MLP 4x2048", pir: bool = False) -> bool:
    """Whether our rewrite lowers ``model``'s GEMM or convolution here (our kernel answer for
    the IR, forward and backward)."""
    from paddle_amp import ir
    from paddle_amp.kernels import lowp_kernels
    kernels = lowp_kernels("CPU", "bfloat16", (ir.PirProgram if pir else ir.LegacyProgram).probe)
    return bool(PADDLE_GEMM[model] & kernels)


def paddle_rows() -> list[str]:
    """The Paddle rows, per model and mode: legacy IR (native and ours), and PIR (ours;
    Paddle 3: the native has no PIR branch)."""
    import paddle

    # the native asks Paddle's cpuid (supports_bfloat16), which a simulated CPU class
    # (AMP_ADAPTERS_CPU) cannot change: the project's device truth decides first
    native_runs = bf16_class(machine()) != "none" and paddle.base.core.supports_bfloat16()
    why = _why_not("no oneDNN bfloat16 here, or paddle.base.core.supports_bfloat16() is False")
    irs = [("legacy IR", False)] + ([("PIR", True)] if int(paddle.__version__[0]) >= 3 else [])
    rows = []
    for name, pir in irs:
        for model in MODELS:
            for mode in MODES:
                native = "-" if pir else (_child(_PADDLE_STEP, "native", "0", model, mode)
                                          if native_runs else why)
                gemm = _ours_gemm(model, pir)
                # without a bf16 kernel auto lowers nothing: its program is the float32 one
                auto = "-" if mode != "training" else (
                    _child(_PADDLE_STEP, "ours", "1" if pir else "0", model, mode, "auto")
                    if gemm else f"not timed: no {'/'.join(sorted(PADDLE_GEMM[model]))} bf16 "
                    f"kernel here, so auto stays float32")
                if gemm:
                    ours = _child(_PADDLE_STEP, "ours", "1" if pir else "0", model, mode)
                else:
                    ours = why if not native_runs else (
                        f"not timed: our probe finds no {'/'.join(sorted(PADDLE_GEMM[model]))}"
                        f" bf16 kernel that runs in this IR, so it stays fp32")
                rows.append(f"| Paddle ({name}) | {model} | {mode} | {native} | {ours} | "
                            f"{auto} |")
    return rows


def _child(script: str, *args: str) -> str:
    """The ratio a child process prints (a native that patches its framework for good)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}
    r = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True,
                       env=env, timeout=3600)
    if r.returncode < 0:  # killed by a signal (oneDNN's bf16 matmul_grad: SIGSEGV)
        try:
            name = signal.Signals(-r.returncode).name
        except ValueError:
            name = f"signal {-r.returncode}"
        return f"failed: the process died ({name})"
    if r.returncode != 0:  # the last line that names an error, else the last one not a log line
        lines = [line for line in r.stderr.strip().splitlines()
                 if not re.match(r"[IWE]\d{4} ", line)]
        last = ([line for line in lines if "rror" in line] or lines or ["no output"])[-1]
        return f"failed: {last.strip()[:120]}"
    return r.stdout.strip().splitlines()[-1]


CAPPED = {"DNNL_MAX_CPU_ISA": "AVX512_CORE", "ONEDNN_MAX_CPU_ISA": "AVX512_CORE"}
HEAD = ["| framework | model | mode | native bf16 / fp32 | ours, native decisions / fp32 | "
        "ours auto / fp32 |", "| --- | --- | --- | --- | --- | --- |"]


def rows() -> list[str]:
    """Every row of the main table, in this process's oneDNN setting (its children inherit
    the environment)."""
    return mxnet_inference_rows() + mxnet_training_rows() + paddle_rows()


def _capped_rows() -> list[str]:
    """``rows()`` with oneDNN limited to AVX512_CORE, in a child that sets the limit before
    any framework loads (bf16 runs without bf16 instructions, as on a Skylake-class CPU)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, **CAPPED,
           "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}
    r = subprocess.run([sys.executable, "-c", "from bench.bf16_cpu import rows\n"
                        "print('\\n'.join(rows()))"], capture_output=True, text=True, env=env,
                       timeout=7200)
    if r.returncode != 0:
        return [f"| (all) | | | failed: {(r.stderr.strip().splitlines() or ['?'])[-1][:120]} "
                f"| | |"]
    return [line for line in r.stdout.splitlines() if line.startswith("| ")]


def run() -> str:
    capped = {**machine(), "isa": CAPPED}
    return "\n".join([
        "## bf16 on this CPU: native, ours and ours auto against fp32", "",
        __doc__.split("\n\n")[1].replace("\n", " "), "",
        f"As the CPU is ({describe_bf16(machine())}):", "", *HEAD, *rows(), "",
        f"Limited to AVX512_CORE ({describe_bf16(capped)}):", "", *HEAD, *_capped_rows(), "",
        "O2-bf16 (bf16 parameters, float32 masters) beside O1-bf16, ours, training:", "",
        "| framework | model | O1-bf16 / fp32 | O2-bf16 / fp32 |", "| --- | --- | --- | --- |",
        *mxnet_o2_rows(), *paddle_o2_rows()])
