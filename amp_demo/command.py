"""The ``demo`` subcommand: train one MLP in each framework, in fp32 and with AMP, side by side.

Paddle has two rows per mode: its static program (``paddle``, ``paddle_amp``) and its dynamic
graph (``paddle-dygraph``, ``paddle_amp.dygraph``), under the same policy as MXNet's. Each row
also gets the peak memory of one of its steps, measured in a fresh process
(``amp_demo.memory``).

``amp-adapters demo ...`` reaches ``register`` through the entry-point group
``amp_adapters.commands`` (setup.cfg), so the core's CLI never names or
imports this package or a backend; ``python -m amp_demo ...`` runs the same
command without the core's CLI. Importing this module imports no framework:
a backend is imported when its trainer runs.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from typing import Optional, Sequence

from amp_adapters import AmpConfigError, Policy, resolve_policy
from amp_adapters.services.cli import HelpFormatter, Parser, positive_steps
from amp_adapters.rules.isa import describe_bf16, machine
from amp_adapters.services.quiet import quiet_frameworks

from .doctor_command import register as register_doctor
from .max_batch_command import register as register_max_batch
from .trainers import BF16_POLICY, DEMO_POLICY, PACKAGE, require  # noqa: F401 (command.X too)

HELP = "train one MLP in each framework, in fp32 and with AMP, side by side"
# --framework: both = MXNet and Paddle, Paddle's static program and dynamic graph each
RUNTIMES = {"both": ("mxnet", "paddle", "paddle-dygraph"), "mxnet": ("mxnet",),
            "paddle": ("paddle",), "paddle-dygraph": ("paddle-dygraph",), "numpy": ("numpy",)}
PLOT_SUFFIXES = (".png", ".pdf", ".svg")  # what matplotlib's Agg backend writes


def figure_path(text: str) -> str:
    """``--plot``: a path whose format matplotlib writes, in a writable directory that exists
    (checked here, not after the whole training run)."""
    if os.path.splitext(text)[1].lower() not in PLOT_SUFFIXES:
        raise argparse.ArgumentTypeError(
            f"{text!r}: the figure must end in {', '.join(PLOT_SUFFIXES)}")
    folder = os.path.dirname(os.path.abspath(text))
    if not os.path.isdir(folder):
        raise argparse.ArgumentTypeError(f"{text!r}: directory {folder!r} does not exist")
    if not os.access(folder, os.W_OK):
        raise argparse.ArgumentTypeError(f"{text!r}: directory {folder!r} is not writable")
    return text


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The demo's options, on ``p``."""
    p.add_argument("--framework", default="both", choices=tuple(RUNTIMES),
                   help="where to train (both: MXNet, Paddle's static program and Paddle's "
                        "dynamic graph; numpy: a reference trainer, fp16 emulated)")
    p.add_argument("--policy", metavar="POLICY",
                   help="a preset name (O1, O2, ...) or a TOML policy file, as policy= takes "
                        "in both backends (default: O1 fp16, emulated where there is no "
                        "fp16 kernel, dynamic loss scale growing every 100 steps)")
    p.add_argument("--steps", type=positive_steps, default=800, help="training steps (batch 64)")
    p.add_argument("--plot", metavar="FILE", type=figure_path,
                   help="write loss curves and the loss scale to this .png/.pdf/.svg "
                        "(default: no figure)")
    p.add_argument("--k-log2", type=int, default=0, metavar="K",
                   help="divide the loss by 2**K and multiply the learning rate by it")
    p.add_argument("--no-speed", action="store_true",
                   help="skip the speed table (a GEMM-bound MLP: float32 against bf16 with the "
                        "native's decisions and with policy 'auto', side by side)")
    p.add_argument("--no-memory", action="store_true",
                   help="skip the peak-memory column (one fresh process per row, measuring "
                        "one training step)")


def register(subparsers: "argparse._SubParsersAction") -> None:
    """Add ``demo`` to the ``amp-adapters`` subcommands (the entry point the core looks up),
    the numerics doctor on the demo's planted models (``doctor_command``) and the largest
    batch in a memory budget (``max_batch_command``)."""
    p = subparsers.add_parser("demo", help=HELP, description=HELP)
    add_arguments(p)
    p.set_defaults(handler=run)
    register_doctor(subparsers)
    register_max_batch(subparsers)


def run(args: argparse.Namespace) -> int:
    """Train, print progress and the side-by-side table, write the figure if asked."""
    quiet_frameworks()  # before any framework is imported
    policy = resolve_policy(args.policy) if args.policy else DEMO_POLICY  # the core's front door
    frameworks = RUNTIMES[args.framework]
    require(["sklearn"] + (["matplotlib"] if args.plot else []), "demo")
    for fw in ("mxnet", "paddle"):  # a policy file drives both: a misspelt name is an error
        policy.validate_for(fw)
    for fw in frameworks:
        if fw != "numpy":
            require([PACKAGE[fw]], PACKAGE[fw])
    from .data import digits_data
    from .table import format_table
    from .trainers import real_kernel, train

    k = 2.0**args.k_log2
    data = digits_data(args.steps)
    every = max(1, args.steps // 5)
    # each row's policy, as its measuring process names it; a bf16 row where the backend
    # has a real bf16 kernel (its own answer), with the demo's default policy
    bf16 = {fw: args.policy is None and fw != "numpy" and real_kernel(fw, "bfloat16")
            for fw in frameworks}
    specs = [(fw, spec) for fw in frameworks for spec in
             ("fp32", args.policy or "demo", *(("bf16",) if bf16[fw] else ()))]
    results = []
    for fw in frameworks:
        for pol in (Policy.preset("O0"), policy):
            label = f"{fw} {'fp32' if not pol.enabled else pol.dtype + ' ' + pol.level}"

            def progress(step: int, loss: float, scale: float, label: str = label) -> None:
                if (step + 1) % every == 0:
                    print(f"  {label}: step {step + 1}/{args.steps}  loss {loss:.3f}  "
                          f"scale {scale:g}", flush=True)

            results.append(train(fw, pol, data, k=k, on_step=progress))
        if bf16[fw]:
            results.append(train(fw, BF16_POLICY, data, k=k))  # real bf16 kernels here
    measured = not args.no_memory and any(fw != "numpy" for fw in frameworks)
    if measured:  # after the training: a process beside it would slow its steps
        from .memory import rows_memory
        print("the peak memory of one step per row (a fresh process each)...", flush=True)
        got = rows_memory([row for row in specs if row[0] != "numpy"])
        results = [dataclasses.replace(r, memory=got.get(row))
                   for r, row in zip(results, specs)]
    emulated = any("emulated" in r.mode for r in results)
    print(f"\nMLP 64-64-10 on digits, {args.steps} steps, batch 64"
          + (f", loss / 2**{args.k_log2}, lr x 2**{args.k_log2}" if args.k_log2 else "")
          + (" (emulated: fp16 rounding at op boundaries, fp32 arithmetic, where this device "
             "has no fp16 kernel)" if emulated else ""))
    print(format_table(results))
    if measured:
        from .memory import NOTE
        print(NOTE)
    if args.policy is None:
        line = bf16_note([fw for fw in frameworks if fw != "numpy"
                          and not any(r.framework == fw and r.mode.startswith("bf16")
                                      for r in results)])
        if line:
            print(line)
    if not args.no_speed:
        from . import speed
        fws = [fw for fw in frameworks if fw in ("mxnet", "paddle")]
        if fws:
            print(f"\nSpeed: {speed.MODEL}, one training step of AMP over one of float32, "
                  f"interleaved (median, +- half the interquartile range); bf16 runs only "
                  f"where this CPU has the kernels: {describe_bf16(machine())}", flush=True)
            print(speed.format_rows(speed.rows(fws)))
    if args.plot:
        from .plot import plot

        plot(results, args.plot)
        print(f"\nfigure written to {args.plot}")
    return 0


def bf16_note(without: Sequence[str]) -> Optional[str]:
    """The one line saying why ``without`` (frameworks) have no bf16 row, and what runs
    instead; None when every framework has its row."""
    if not without:
        return None
    return (f"bf16: no row for {', '.join(without)}: no real bfloat16 GEMM kernel here "
            f"({describe_bf16(machine())}), so bf16 would run in float32; the fp16 rows above "
            f"are emulated instead")


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m amp_demo [options]``: the demo without the core's CLI (same options)."""
    prog = "python -m amp_demo"
    parser = Parser(prog=prog, command=prog, description=HELP, formatter_class=HelpFormatter)
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return run(args)
    except (AmpConfigError, OSError) as e:
        print(f"{parser.prog}: error: {e}", file=sys.stderr)
        return 2
