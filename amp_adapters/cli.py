"""The ``amp-adapters`` command: inspect the effective op lists, explain a decision, run the demo.

    amp-adapters lists --framework mxnet --dtype float16 [--policy FILE]
    amp-adapters explain softmax --framework paddle [--policy FILE] [--attr act_type=softrelu]
    amp-adapters demo [--framework mxnet|paddle|both|numpy] [--policy FILE] [--steps N]
                      [--plot out.png] [--k-log2 0]

``demo`` is not defined here: installed packages add subcommands through the
entry-point group ``amp_adapters.commands`` (``amp_demo`` adds ``demo``, see
setup.cfg), so the core imports no backend, not even lazily.
"""
from __future__ import annotations

import argparse
import sys
from importlib.metadata import entry_points
from typing import Callable, Mapping, Optional, Sequence

from .errors import AmpConfigError, UnknownOpError
from .oplists import CATEGORIES, FRAMEWORKS, LOW_DTYPES, load_table
from .planner import categorize, effective_lists
from .policy import Policy

# An installed package's subcommand: ``register(subparsers)`` adds a parser whose
# ``handler`` default runs it (see amp_demo.command.register).
COMMAND_GROUP = "amp_adapters.commands"
Register = Callable[["argparse._SubParsersAction"], None]


def _policy(args: argparse.Namespace) -> Policy:
    """The policy from ``--policy FILE`` (its dtype wins) or the O1 preset for ``--dtype``."""
    if args.policy:
        return Policy.from_file(args.policy)
    return Policy(dtype=args.dtype, level="O1")


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


def plugin_commands() -> dict[str, Register]:
    """{name: register} of the subcommands installed packages declare in ``COMMAND_GROUP``."""
    return {ep.name: ep.load() for ep in entry_points(group=COMMAND_GROUP)}


def build_parser(commands: Optional[Mapping[str, Register]] = None) -> argparse.ArgumentParser:
    """The parser; ``commands`` (default: the installed ones) add their subcommands."""
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
        p.add_argument("--policy", metavar="FILE", help="a TOML policy file (its dtype wins)")
    for register in (plugin_commands() if commands is None else commands).values():
        register(sub)
    return parser


def main(argv: Optional[Sequence[str]] = None,
         commands: Optional[Mapping[str, Register]] = None) -> int:
    args = build_parser(commands).parse_args(argv)
    handler = {"lists": _lists, "explain": _explain}.get(args.command) or args.handler
    try:
        return handler(args)
    except AmpConfigError as e:
        print(f"amp-adapters: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
