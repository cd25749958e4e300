"""The amp-adapters command: inspect the effective op lists, explain a decision, run the demo.

    amp-adapters lists --framework mxnet --dtype float16 [--policy FILE]
    amp-adapters explain softmax --framework paddle [--policy FILE] [--attr act_type=softrelu]
    amp-adapters diff --framework mxnet [--dtype float16]   (shared O1 vs the native default)
    amp-adapters demo [--framework mxnet|paddle|both|numpy] [--policy FILE|PRESET] [--steps N]
                      [--plot out.png] [--k-log2 0]

``demo`` is not defined here: installed packages add subcommands through the
entry-point group ``amp_adapters.commands`` (``amp_demo`` adds ``demo``, see
setup.cfg), so the core imports no backend, not even lazily.

Every user error (a bad argument, a policy file that does not load or names an
unknown op, a missing optional dependency) is one ``amp-adapters: error: ...``
line on stderr and exit status 2, found before any training starts.
"""
from __future__ import annotations

import argparse
import sys
from importlib.metadata import entry_points
from typing import Callable, Mapping, NoReturn, Optional, Sequence

from . import __version__
from .errors import AmpConfigError, UnknownOpError
from .oplists import CATEGORIES, FRAMEWORKS, LOW_DTYPES, load_table
from .planner import categorize, effective_lists
from .policy import Policy, resolve_policy

PROG = "amp-adapters"
# An installed package's subcommand: ``register(subparsers)`` adds a parser whose
# ``handler`` default runs it (see amp_demo.command.register).
COMMAND_GROUP = "amp_adapters.commands"
Register = Callable[["argparse._SubParsersAction"], None]


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is the same one line as every other error (exit 2):
    ``<command>: error: <what> (see <command> --help)``. ``command`` names the program in
    that line (subcommand parsers inherit the class, and the default)."""

    def __init__(self, *args, command: str = PROG, **kwargs):
        super().__init__(*args, **kwargs)
        self.command = command

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.command}: error: {message} (see {self.prog} --help)\n")


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
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


def _policy(args: argparse.Namespace) -> Policy:
    """The policy from ``--policy FILE|PRESET`` (its dtype wins) or the O1 preset for
    ``--dtype``.

    A file's framework op names are checked against both frameworks' op tables, so a
    misspelt name is an error (with close matches) here, not a silent no-op."""
    if not args.policy:
        return Policy(dtype=args.dtype, level="O1")
    policy = resolve_policy(args.policy)
    for framework in FRAMEWORKS:
        policy.validate_for(framework)
    return policy


def _diff(args: argparse.Namespace) -> int:
    from .native_diff import markdown
    print(markdown(args.framework, args.dtype, args.version))
    return 0


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


def plugin_commands() -> dict[str, Register]:
    """{name: register} of the subcommands installed packages declare in ``COMMAND_GROUP``."""
    return {ep.name: ep.load() for ep in entry_points(group=COMMAND_GROUP)}


EXAMPLES = """examples:
  amp-adapters lists --framework paddle
  amp-adapters explain Activation --framework mxnet --attr act_type=softrelu
  amp-adapters demo --framework paddle --steps 200 --plot demo.png
"""


def build_parser(commands: Optional[Mapping[str, Register]] = None) -> argparse.ArgumentParser:
    """The parser; ``commands`` (default: the installed ones) add their subcommands."""
    parser = Parser(prog=PROG, formatter_class=HelpFormatter, epilog=EXAMPLES,
                     description="Inspect the effective AMP op lists, explain one decision, "
                                 "or run the demo.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, helptext in (("lists", "print the effective op lists, conditional rules included"),
                           ("explain", "say which category an op falls in, and why")):
        p = sub.add_parser(name, help=helptext, description=helptext)
        if name == "explain":
            p.add_argument("op", help="the framework's op name, e.g. FullyConnected or matmul_v2")
            p.add_argument("--attr", action="append", default=[], metavar="KEY=VALUE",
                           type=_attr,
                           help="an op attribute, for conditional ops (act_type=softrelu)")
        p.add_argument("--framework", required=True, choices=FRAMEWORKS,
                       help="whose op names to use")
        p.add_argument("--dtype", default="float16", choices=LOW_DTYPES,
                       help="the low-precision dtype (ignored with --policy: its dtype wins)")
        p.add_argument("--policy", metavar="FILE",
                       help="a TOML policy file or a preset name (its dtype wins)")
    p = sub.add_parser("diff", help="ops whose category differs between the shared O1 and "
                                    "the installed native's default lists, and why")
    p.add_argument("--framework", required=True, choices=FRAMEWORKS)
    p.add_argument("--dtype", default="float16", choices=LOW_DTYPES)
    p.add_argument("--version", help="the native version whose lists to compare (default: "
                                     "the installed one)")
    _add_info(sub)
    for register in (plugin_commands() if commands is None else commands).values():
        register(sub)
    for p in sub.choices.values():  # plain help with defaults, one-line errors, for all
        p.formatter_class = HelpFormatter
    return parser


def _add_info(sub: "argparse._SubParsersAction") -> None:
    """``info``: what this machine runs in low precision (``fallback.info_text``)."""
    def run(args: argparse.Namespace) -> int:
        from .fallback import info_text
        print(info_text(dtypes=args.dtype or LOW_DTYPES))
        return 0
    p = sub.add_parser("info", help="which ops have real low-precision kernels here, per "
                                    "installed framework, and what AMP does with the others")
    p.add_argument("--dtype", action="append", choices=LOW_DTYPES,
                   help="only this dtype (repeatable; default: float16 and bfloat16)")
    p.set_defaults(handler=run)


def main(argv: Optional[Sequence[str]] = None,
         commands: Optional[Mapping[str, Register]] = None) -> int:
    args = build_parser(commands).parse_args(argv)
    handler = {"lists": _lists, "explain": _explain, "diff": _diff}.get(args.command) \
        or args.handler
    try:
        return handler(args)
    except (AmpConfigError, OSError) as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
