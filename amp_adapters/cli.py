"""The ``amp-adapters`` command: inspect the effective op lists, explain a decision, run the demo.

    amp-adapters lists --framework mxnet --dtype float16 [--policy FILE]
    amp-adapters explain softmax --framework paddle [--policy FILE] [--attr act_type=softrelu]
    amp-adapters diff --framework mxnet [--dtype float16]   (shared O1 vs the native default)
    amp-adapters demo [--framework mxnet|paddle|both|numpy] [--policy FILE] [--steps N]
                      [--plot out.png] [--k-log2 0]
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Optional, Sequence

from .errors import AmpConfigError, UnknownOpError
from .oplists import CATEGORIES, FRAMEWORKS, LOW_DTYPES, load_table
from .planner import categorize, effective_lists
from .policy import Policy, resolve_policy
from .scaler import DynamicLossScale


def _policy(args: argparse.Namespace) -> Policy:
    """The policy from ``--policy FILE|PRESET`` (its dtype wins) or the O1 preset for
    ``--dtype``."""
    if args.policy:
        return resolve_policy(args.policy)
    return Policy(dtype=args.dtype, level="O1")


def _diff(args: argparse.Namespace) -> int:
    from .native_diff import markdown
    print(markdown(args.framework, args.dtype, args.version))
    return 0


def _lists(args: argparse.Namespace) -> int:
    policy = _policy(args)
    lists = effective_lists(policy, args.framework)
    print(f"# {args.framework} op lists, dtype {policy.dtype}, level {policy.level}"
          + (f", policy {args.policy}" if args.policy else ""))
    for cat in CATEGORIES:
        print(f"\n[{cat}] ({len(lists[cat])} ops)")
        for op in lists[cat]:
            canon = load_table(args.framework).canonical_of.get(op)
            print(f"  {op}" + (f"  ({canon})" if canon and canon != op else ""))
    return 0


def _explain(args: argparse.Namespace) -> int:
    policy = _policy(args)
    table = load_table(args.framework)
    attrs = dict(a.split("=", 1) for a in args.attr)
    if args.op not in table.names | policy.framework_ops(args.framework).names():
        raise UnknownOpError(args.op, f"the {args.framework} op table (a registered op that no "
                             f"list names follows its inputs)", table.names)
    cat = categorize(policy, args.framework, args.op, attrs or None)
    print(f"{args.framework} op {args.op!r}"
          + (f" (canonical: {cat.canonical})" if cat.canonical else " (no canonical name)"))
    print(f"category: {cat.category} under dtype {policy.dtype}, level {policy.level}")
    print(f"why: {cat.reason}")
    return 0


# O1 fp16, emulated where the device has no fp16 kernel; a short growth interval so the
# dynamic loss scale visibly grows into overflows and backs off within the demo.
DEMO_POLICY = Policy.preset("O1", emulate=True, loss_scale=DynamicLossScale(growth_interval=100))


def _demo(args: argparse.Namespace) -> int:
    os.environ.setdefault("GLOG_minloglevel", "2")  # Paddle's C++ INFO lines are noise here
    from . import demo

    policy = Policy.from_file(args.policy) if args.policy else DEMO_POLICY
    frameworks = ("mxnet", "paddle") if args.framework == "both" else (args.framework,)
    k = 2.0**args.k_log2
    data = demo.digits_data(args.steps)
    every = max(1, args.steps // 5)
    results = []
    for fw in frameworks:
        for pol in (Policy.preset("O0"), policy):
            label = f"{fw} {'fp32' if not pol.enabled else pol.dtype + ' ' + pol.level}"

            def progress(step: int, loss: float, scale: float, label: str = label) -> None:
                if (step + 1) % every == 0:
                    print(f"  {label}: step {step + 1}/{args.steps}  loss {loss:.3f}  "
                          f"scale {scale:g}", flush=True)

            results.append(demo.train(fw, pol, data, k=k, on_step=progress))
    emulated = any("emulated" in r.mode for r in results)
    print(f"\nMLP 64-64-10 on digits, {args.steps} steps, batch 64"
          + (f", loss / 2**{args.k_log2}, lr x 2**{args.k_log2}" if args.k_log2 else "")
          + (" (emulated: fp16 rounding at op boundaries, fp32 arithmetic, where this device "
             "has no fp16 kernel)" if emulated else ""))
    print(demo.format_table(results))
    if args.plot:
        demo.plot(results, args.plot)
        print(f"\nfigure written to {args.plot}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="amp-adapters", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name, helptext in (("lists", "print the effective op lists"),
                           ("explain", "say which category an op falls in, and why")):
        p = sub.add_parser(name, help=helptext)
        if name == "explain":
            p.add_argument("op", help="the framework's op name, e.g. FullyConnected or matmul_v2")
            p.add_argument("--attr", action="append", default=[], metavar="KEY=VALUE",
                           help="an op attribute, for conditional ops (act_type=softrelu)")
        p.add_argument("--framework", required=True, choices=FRAMEWORKS)
        p.add_argument("--dtype", default="float16", choices=LOW_DTYPES)
        p.add_argument("--policy", metavar="FILE",
                       help="a TOML policy file or a preset name (its dtype wins)")
    p = sub.add_parser("diff", help="ops whose category differs between the shared O1 and "
                                    "the installed native's default lists, and why")
    p.add_argument("--framework", required=True, choices=FRAMEWORKS)
    p.add_argument("--dtype", default="float16", choices=LOW_DTYPES)
    p.add_argument("--version", help="the native version whose lists to compare (default: "
                                     "the installed one)")
    p = sub.add_parser("demo", help="train one MLP in each framework, in fp32 and with AMP")
    p.add_argument("--framework", default="both", choices=("both", "mxnet", "paddle", "numpy"))
    p.add_argument("--policy", metavar="FILE",
                   help="a TOML policy file (default: O1 fp16, emulated where there is no "
                        "fp16 kernel, dynamic loss scale growing every 100 steps)")
    p.add_argument("--steps", type=int, default=800)
    p.add_argument("--plot", metavar="PNG", help="write loss curves and the loss scale here")
    p.add_argument("--k-log2", type=int, default=0,
                   help="divide the loss by 2**K and multiply the learning rate by it")
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    handler = {"lists": _lists, "explain": _explain, "diff": _diff,
               "demo": _demo}[args.command]
    try:
        return handler(args)
    except AmpConfigError as e:
        print(f"amp-adapters: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
