"""The ``max-batch`` subcommand: the largest batch that fits in a memory budget, in float32 and
under a policy (issue 40; MXNet's fp16 FAQ: ResNet-50 from batch 128 to 256).

    amp-adapters max-batch --framework paddle-dygraph --model cnn --memory 4GiB [--policy O1-bf16]

For float32 and for the policy: the peak of one training step of the model at two or three
batch sizes (``amp_adapters.services.memory``: a fresh process each, the high-water mark after
warm-up), the line ``peak = fixed + per_sample * batch`` through them
(``amp_adapters.services.batch_fit``), the largest batch whose predicted peak is within the budget,
and one more run at that batch to check it. ``amp_demo.command.register`` adds it.
"""
from __future__ import annotations

import argparse
from concurrent.futures import ThreadPoolExecutor
from typing import Sequence

from amp_adapters import AmpConfigError, resolve_policy
from amp_adapters.services.batch_fit import (FitCheck, PeakFit, batch_gain, check, fit_peak,
                                             format_size, parse_size)
from amp_adapters.services.memory import MemoryMeasureFailed

from .batch_models import MODELS, model_named

HELP = ("the largest batch of a model that fits in a memory budget, in float32 and under a "
        "policy: peaks measured at a few batch sizes, a line fitted, the prediction checked")
FRAMEWORKS = ("mxnet", "paddle", "paddle-dygraph")
PARALLEL = 2  # measuring processes at a time (each measures its own peak)


def memory_size(text: str) -> int:
    """``--memory``: a size such as ``4GiB`` (``batch_fit.parse_size``)."""
    try:
        return parse_size(text)
    except AmpConfigError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def batch_sizes(text: str) -> tuple[int, ...]:
    """``--batches``: two or three distinct whole numbers >= 1, comma-separated."""
    try:
        sizes = tuple(int(part) for part in text.split(","))
    except ValueError:
        sizes = ()
    if not 2 <= len(set(sizes)) == len(sizes) <= 3 or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"expected two or three distinct batch sizes >= 1, "
                                         f"comma-separated (such as 4,8,16), got {text!r}")
    return tuple(sorted(sizes))


def register(subparsers: "argparse._SubParsersAction") -> argparse.ArgumentParser:
    """Add ``max-batch`` to the ``amp-adapters`` subcommands."""
    p = subparsers.add_parser("max-batch", help=HELP, description=HELP)
    p.add_argument("--framework", required=True, choices=FRAMEWORKS,
                   help="where to train (paddle: a static program; paddle-dygraph: eager "
                        "layers through paddle_amp.dygraph)")
    p.add_argument("--model", required=True, choices=tuple(MODELS),
                   help="; ".join(f"{name}: {m.what}" for name, m in MODELS.items()))
    p.add_argument("--memory", required=True, type=memory_size, metavar="SIZE",
                   help="the budget: the peak resident size of the training process, such "
                        "as 4GiB, 512MiB, 2.5G (binary units)")
    p.add_argument("--policy", default="O1-bf16", metavar="POLICY",
                   help="a preset name or a TOML policy file, compared with float32")
    p.add_argument("--batches", type=batch_sizes, metavar="N,N[,N]",
                   help="the batch sizes to fit the line at (default: the model's, where a "
                        "sample's bytes show above the process's noise)")
    p.add_argument("--runs", type=int, default=1, choices=(1, 3),
                   help="fresh processes per measurement (3: the median of three)")
    p.set_defaults(handler=run)
    return p


def peak_of(framework: str, model: str, policy: str, batch: int, runs: int) -> int:
    """The peak bytes of one training step of ``model`` at ``batch``
    (``amp_adapters.services.memory``:
    ``runs`` fresh processes, the median); the seam a test feeds its own peaks through."""
    from amp_adapters.services.memory import measure

    from .memory import SERVER, batch_step
    return measure(SERVER, batch_step, framework, model, policy, batch, runs=runs).peak


def answer(framework: str, model: str, policy: str, budget: int, batches: Sequence[int],
           runs: int) -> tuple[PeakFit, int, FitCheck]:
    """(the fit, its largest batch within ``budget``, the check run at it) for ``policy``."""
    with ThreadPoolExecutor(PARALLEL) as pool:
        peaks = list(pool.map(lambda b: peak_of(framework, model, policy, b, runs), batches))
    fit = fit_peak(list(zip(batches, peaks)))
    batch = fit.largest_batch(budget)
    return fit, batch, check(fit, budget, batch, peak_of(framework, model, policy, batch, runs))


def run(args: argparse.Namespace) -> int:
    from amp_adapters.services.quiet import quiet_frameworks

    from .trainers import PACKAGE, require
    policy = resolve_policy(args.policy)  # a bad policy stops here, before any measuring
    require([PACKAGE[args.framework]], PACKAGE[args.framework])
    spec = model_named(args.model)
    batches = args.batches or spec.batches
    quiet_frameworks()
    print(f"the largest batch in {format_size(args.memory)}: {args.framework}, {args.model} "
          f"({spec.what}), momentum SGD; the peak of one training step (VmHWM after warm-up, "
          f"a fresh process per run, {args.runs} run{'s' * (args.runs > 1)} each) at batches "
          f"{', '.join(map(str, batches))}, a line fitted, then one run at its prediction",
          flush=True)
    rows = []
    for name in ("fp32", args.policy):
        try:
            rows.append((name, *answer(args.framework, args.model, name, args.memory,
                                       batches, args.runs)))
        except MemoryMeasureFailed as e:
            raise AmpConfigError(f"{name}: {e}") from None
    print(format_rows(rows))
    fp32, low = rows[0][2], rows[1][2]
    print(f"\n{args.policy}: {batch_gain(fp32, low):.2f}x float32's largest batch ({fp32} -> "
          f"{low}; MXNet's fp16 FAQ: ResNet-50 128 -> 256 on a GPU, 2.00x)"
          + ("; emulated fp16 stores float32: its batch is not fp16's"
             if policy.enabled and policy.emulate else ""))
    return 0


def format_rows(rows: Sequence[tuple[str, PeakFit, int, FitCheck]]) -> str:
    """The table: per policy, the fitted line, the largest batch and its check."""
    table = [("policy", "fixed", "per sample", "largest batch", "peak at it", "vs the line",
              "fits")]
    for name, fit, batch, got in rows:
        table.append((name, format_size(fit.fixed), format_size(fit.per_sample), str(batch),
                      format_size(got.peak), f"{got.error:+.1%}", "yes" if got.fits else
                      f"no: with this run, the line says {_refit(got, fit, got.budget)}"))
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in table]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _refit(got: FitCheck, fit: PeakFit, budget: int) -> str:
    """The batch the line through the check's run as well predicts, or why it cannot."""
    try:
        return str(got.refit(fit).largest_batch(budget))
    except AmpConfigError as e:
        return f"no batch ({e})"
