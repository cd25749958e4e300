"""The amp-adapters command: inspect the effective op lists, explain a decision, run the demo.

    amp-adapters lists --framework mxnet --dtype float16 [--policy FILE]
    amp-adapters explain softmax --framework paddle [--policy FILE] [--attr act_type=softrelu]
    amp-adapters demo [--framework mxnet|paddle|both|numpy] [--policy FILE] [--steps N]
                      [--plot out.png] [--k-log2 0]

Every user error (a bad argument, a policy file that does not load or names an
unknown op, a missing optional dependency) is one ``amp-adapters: error: ...``
line on stderr and exit status 2, found before any training starts.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from typing import NoReturn, Optional, Sequence

from . import __version__
from .errors import AmpConfigError, UnknownOpError
from .oplists import CATEGORIES, FRAMEWORKS, LOW_DTYPES, load_table
from .planner import categorize, effective_lists
from .policy import Policy
from .quiet import quiet_frameworks
from .scaler import DynamicLossScale

PROG = "amp-adapters"
PLOT_SUFFIXES = (".png", ".pdf", ".svg")  # what matplotlib's Agg backend writes


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is the same one line as every other error (exit 2)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{PROG}: error: {message} (see {self.prog} --help)\n")


class _Help(argparse.RawDescriptionHelpFormatter):
    """Shows each option's default (unless it has none); keeps the examples' line breaks."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if action.default not in (None, argparse.SUPPRESS, []) and "default" not in text:
            text += " (default: %(default)s)"
        return text


def _attr(text: str) -> tuple[str, str]:
    """``KEY=VALUE`` of ``--attr``."""
    key, eq, value = text.partition("=")
    if not eq or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE (e.g. act_type=softrelu), "
                                         f"got {text!r}")
    return key, value


def _positive(text: str) -> int:
    """A step count: an integer >= 1."""
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of steps >= 1, got {text!r}")
    return n


def _plot_path(text: str) -> str:
    """A figure path whose format matplotlib writes, in a directory that exists."""
    if os.path.splitext(text)[1].lower() not in PLOT_SUFFIXES:
        raise argparse.ArgumentTypeError(
            f"{text!r}: the figure must end in {', '.join(PLOT_SUFFIXES)}")
    folder = os.path.dirname(os.path.abspath(text))
    if not os.path.isdir(folder):
        raise argparse.ArgumentTypeError(f"{text!r}: directory {folder!r} does not exist")
    if not os.access(folder, os.W_OK):
        raise argparse.ArgumentTypeError(f"{text!r}: directory {folder!r} is not writable")
    return text


def _require(modules: Sequence[str], extra: str) -> None:
    """An AmpConfigError naming the missing modules and the pip extra that brings them."""
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        raise AmpConfigError(f"{', '.join(missing)} not installed: pip install "
                             f"\"amp-adapters[{extra}]\" (from a checkout: pip install "
                             f"\".[{extra}]\")")


def _policy(args: argparse.Namespace) -> Policy:
    """The policy from ``--policy FILE`` (its dtype wins) or the O1 preset for ``--dtype``.

    A file's framework op names are checked against both frameworks' op tables, so a
    misspelt name is an error (with close matches) here, not a silent no-op."""
    if not args.policy:
        return Policy(dtype=args.dtype, level="O1")
    policy = Policy.from_file(args.policy)
    for framework in FRAMEWORKS:
        policy.validate_for(framework)
    return policy


def _lists(args: argparse.Namespace) -> int:
    policy = _policy(args)
    table = load_table(args.framework)
    lists = effective_lists(policy, args.framework)
    print(f"# {args.framework} op lists, dtype {policy.dtype}, level {policy.level}"
          + (f", policy {args.policy}" if args.policy else ""))
    for cat in CATEGORIES:
        print(f"\n[{cat}] ({len(lists[cat])} ops)")
        for op in lists[cat]:
            canon = table.canonical_of.get(op)
            print(f"  {op}" + (f"  ({canon})" if canon and canon != op else ""))
    rules = _conditional_rules(policy, args.framework)
    print(f"\n[conditional] ({len(rules)} rules: the op's category depends on an attribute; "
          f"the op is listed above under its default)")
    for line in rules:
        print(f"  {line}")
    return 0


def _conditional_rules(policy: Policy, framework: str) -> list[str]:
    """``op attr=value -> category (canonical)`` for the table's and the policy's rules."""
    table = load_table(framework)
    out = []
    for op, rule in sorted(table.conditional.items()):
        for value in rule.values:
            cat = categorize(policy, framework, op, {rule.attr: value})
            out.append(f"{op} {rule.attr}={value} -> {cat.category}"
                       + (f"  ({cat.canonical})" if cat.canonical else ""))
    for op, attr, values in policy.framework_ops(framework).conditional_fp32:
        out.append(f"{op} {attr}={'|'.join(map(str, values))} -> fp32  (policy file)")
    return out


def _explain(args: argparse.Namespace) -> int:
    policy = _policy(args)
    table = load_table(args.framework)
    attrs = dict(args.attr)
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
    quiet_frameworks()
    policy = Policy.from_file(args.policy) if args.policy else DEMO_POLICY
    frameworks = ("mxnet", "paddle") if args.framework == "both" else (args.framework,)
    _require(["sklearn"] + (["matplotlib"] if args.plot else []), "demo")
    for fw in frameworks:
        if fw != "numpy":
            _require([fw], fw)
            policy.validate_for(fw)
    from . import demo

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


EXAMPLES = """examples:
  amp-adapters lists --framework paddle
  amp-adapters explain Activation --framework mxnet --attr act_type=softrelu
  amp-adapters demo --framework paddle --steps 200 --plot demo.png
"""


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=PROG, formatter_class=_Help, epilog=EXAMPLES,
                     description="Inspect the effective AMP op lists, explain one decision, "
                                 "or run the demo.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, helptext in (("lists", "print the effective op lists, conditional rules included"),
                           ("explain", "say which category an op falls in, and why")):
        p = sub.add_parser(name, help=helptext, description=helptext, formatter_class=_Help)
        if name == "explain":
            p.add_argument("op", help="the framework's op name, e.g. FullyConnected or matmul_v2")
            p.add_argument("--attr", action="append", default=[], metavar="KEY=VALUE",
                           type=_attr,
                           help="an op attribute, for conditional ops (act_type=softrelu)")
        p.add_argument("--framework", required=True, choices=FRAMEWORKS,
                       help="whose op names to use")
        p.add_argument("--dtype", default="float16", choices=LOW_DTYPES,
                       help="the low-precision dtype (ignored with --policy: its dtype wins)")
        p.add_argument("--policy", metavar="FILE", help="a TOML policy file")
    helptext = "train one MLP in each framework, in fp32 and with AMP, side by side"
    p = sub.add_parser("demo", help=helptext, description=helptext, formatter_class=_Help)
    p.add_argument("--framework", default="both", choices=("both", "mxnet", "paddle", "numpy"),
                   help="where to train (numpy: a reference trainer, fp16 emulated)")
    p.add_argument("--policy", metavar="FILE",
                   help="a TOML policy file (default: O1 fp16, emulated where there is no "
                        "fp16 kernel, dynamic loss scale growing every 100 steps)")
    p.add_argument("--steps", type=_positive, default=800, help="training steps (batch 64)")
    p.add_argument("--plot", metavar="FILE", type=_plot_path,
                   help="write loss curves and the loss scale to this .png/.pdf/.svg "
                        "(default: no figure)")
    p.add_argument("--k-log2", type=int, default=0, metavar="K",
                   help="divide the loss by 2**K and multiply the learning rate by it")
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    handler = {"lists": _lists, "explain": _explain, "demo": _demo}[args.command]
    try:
        return handler(args)
    except (AmpConfigError, OSError) as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
