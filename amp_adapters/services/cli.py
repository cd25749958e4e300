"""The amp-adapters command: inspect the effective op lists, explain a decision, run the demo.

    amp-adapters lists --framework mxnet --dtype float16 [--policy FILE|PRESET]
    amp-adapters explain softmax --framework paddle [--policy FILE|PRESET] [--attr
    act_type=softrelu]
    amp-adapters diff --framework mxnet|paddle|paddle-dygraph [--dtype float16] [--version V]
                      (shared O1 vs the native's lists; paddle-dygraph: paddle.amp's)
    amp-adapters info [--dtype bfloat16] [--measure] [--save PATH]
                      (which ops have real low-precision kernels here; --measure: how fast)
    amp-adapters profile [--save PATH] [--refresh]   (time them; save a profile a policy names)
    amp-adapters demo [--framework both|mxnet|paddle|paddle-dygraph|numpy]
                      [--policy FILE|PRESET] [--steps N] [--plot out.png] [--k-log2 0]
    amp-adapters max-batch --framework mxnet|paddle|paddle-dygraph --model digits|mlp|cnn
                           --memory 4GiB [--policy FILE|PRESET]  (largest batch in a budget)
    amp-adapters doctor [--framework mxnet|paddle|paddle-dygraph]
                        [--model overflow|underflow|reduction]
                        [--steps N] [--policy FILE|PRESET] [--write fix.toml]

``lists`` and ``explain`` answer for what the user's code gets: without
``--policy`` the native defaults that ``mxnet_amp.init()`` /
``paddle_amp.decorate()`` use without ``policy=``; every answer names its
policy and the framework version it is for.

Each subcommand is one block below: a ``@subcommand`` register function that adds its
parser and sets its ``handler``. ``demo``, ``doctor`` and ``max-batch`` are not defined
here: installed packages add subcommands through the entry-point group
``amp_adapters.commands`` (``amp_demo`` adds all three, see setup.cfg),
so the core imports no backend, not even lazily.

Every user error (a bad argument, a policy file that does not load or names an
unknown op, a native version the data does not hold, a missing optional
dependency) is one ``amp-adapters: error: ...`` line on stderr and exit status
2, found before any training starts. A closed pipe (``| head``) ends quietly.
"""
from __future__ import annotations

import argparse
import os
import sys
import textwrap
from importlib.metadata import entry_points
from typing import Callable, Mapping, NoReturn, Optional, Sequence

from .._version import __version__
from ..rules.errors import AmpConfigError, UnknownOpError
from .native_diff import DIFF_FRAMEWORKS
from ..rules.oplists import (CATEGORIES, FRAMEWORKS, LOW_DTYPES, dygraph_versions,
                             installed_version, load_table, native_lists, native_versions)
from ..rules.planner import categorize, effective_lists
from ..rules.policy import PRESETS, Policy, resolve_policy

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


# The built-in subcommands, each one block below: ``@subcommand`` on a register function
# that adds its parser with a ``handler`` default (as installed commands do).
SUBCOMMANDS: list[Register] = []


def subcommand(register: Register) -> Register:
    SUBCOMMANDS.append(register)
    return register


# what the user's code runs without policy=, per framework
DROP_IN = {"mxnet": "mxnet_amp.init()", "paddle": "paddle_amp.decorate()"}
POLICY_NOTE = (". Without --policy: the lists mxnet_amp.init() / paddle_amp.decorate() use "
               "without policy= (the installed native's defaults: presets mxnet-native, "
               "paddle-native); --policy O1 shows the shared cross-framework ones.")


def add_policy_arguments(p: argparse.ArgumentParser) -> None:
    """--framework, --dtype and --policy, as ``lists`` and ``explain`` take them."""
    p.add_argument("--framework", required=True, choices=FRAMEWORKS,
                   help="whose op names to use")
    p.add_argument("--dtype", default="float16", choices=LOW_DTYPES,
                   help="the low-precision dtype (ignored with --policy: its dtype wins)")
    p.add_argument("--policy", metavar="POLICY", type=policy_argument,
                   help="a preset name (O1, O2, mxnet-native, ...) or a TOML policy file, as "
                        "policy= takes it (default: the framework's native defaults, as "
                        "without policy=)")


def _attr(text: str) -> tuple[str, str]:
    """``KEY=VALUE`` of ``--attr``."""
    key, eq, value = text.partition("=")
    if not eq or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE (e.g. act_type=softrelu), "
                                         f"got {text!r}")
    return key, value


def positive_steps(text: str) -> int:
    """``--steps``: an integer >= 1."""
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of steps >= 1, got {text!r}")
    return n


def policy_argument(text: str) -> str:
    """``--policy``: a preset name or a file path; an empty value is refused, not ignored."""
    if not text.strip():
        raise argparse.ArgumentTypeError(f"{text!r}: give a preset name "
                                         f"({', '.join(PRESETS)}) or a TOML policy file")
    return text


def _policy(args: argparse.Namespace) -> tuple[Policy, str]:
    """The policy the user's code gets, and its name: ``--policy FILE|PRESET`` (its dtype
    wins), else what the drop-in uses without ``policy=`` (``mxnet_amp.init()``,
    ``paddle_amp.decorate()``): the installed native's default lists for ``--dtype``.

    A file's framework op names are checked against both frameworks' op tables, so a
    misspelt name is an error (with close matches) here, not a silent no-op."""
    if args.policy is None:
        name = f"{args.framework}-native"
        return (Policy.preset(name, dtype=args.dtype),
                f"{name} (the default of {DROP_IN[args.framework]})")
    policy = resolve_policy(args.policy)
    for framework in FRAMEWORKS:
        policy.validate_for(framework)
    return policy, args.policy


def _versions(policy: Policy, framework: str) -> str:
    """Which framework version the answer is for: the native lists read, and what is
    installed."""
    installed = installed_version(framework)
    here = f"{framework} {installed} installed" if installed else f"{framework} not installed"
    if policy.enabled and policy.defaults == "native":
        used = native_lists(framework, policy.dtype, policy.native_version).version
        return f"native lists of {framework} {used} ({here})"
    return here


def _header(what: str, policy: Policy, name: str, framework: str) -> str:
    return (f"# {what}: policy {name}, dtype {policy.dtype}, level {policy.level}; "
            f"{_versions(policy, framework)}")


# -- lists ------------------------------------------------------------------------------------

LISTS_HELP = "print the op lists your code gets, conditional rules included"


@subcommand
def register_lists(sub: "argparse._SubParsersAction") -> None:
    p = sub.add_parser("lists", help=LISTS_HELP, description=LISTS_HELP + POLICY_NOTE)
    add_policy_arguments(p)
    p.set_defaults(handler=_lists)


def _lists(args: argparse.Namespace) -> int:
    policy, name = _policy(args)
    table = load_table(args.framework)
    lists = effective_lists(policy, args.framework)
    print(_header(f"{args.framework} op lists", policy, name, args.framework))
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


# -- explain ----------------------------------------------------------------------------------

EXPLAIN_HELP = "say which category an op falls in for your code, and why"


@subcommand
def register_explain(sub: "argparse._SubParsersAction") -> None:
    p = sub.add_parser("explain", help=EXPLAIN_HELP, description=EXPLAIN_HELP + POLICY_NOTE)
    p.add_argument("op", help="the framework's op name, e.g. FullyConnected or matmul_v2")
    p.add_argument("--attr", action="append", default=[], metavar="KEY=VALUE", type=_attr,
                   help="an op attribute, for conditional ops (act_type=softrelu)")
    add_policy_arguments(p)
    p.set_defaults(handler=_explain)


def _explain(args: argparse.Namespace) -> int:
    policy, name = _policy(args)
    table = load_table(args.framework)
    attrs = dict(args.attr)
    if args.op not in table.names | policy.framework_ops(args.framework).names():
        raise UnknownOpError(args.op, f"the {args.framework} op table (a registered op that no "
                             f"list names follows its inputs)", table.names)
    cat = categorize(policy, args.framework, args.op, attrs or None)
    print(_header("explain", policy, name, args.framework))
    print(f"{args.framework} op {args.op!r}"
          + (f" (canonical: {cat.canonical})" if cat.canonical else " (no canonical name)"))
    print(f"category: {cat.category} under dtype {policy.dtype}, level {policy.level}")
    print(f"why: {cat.reason}")
    return 0


# -- diff -------------------------------------------------------------------------------------

DIFF_HELP = ("print, as a Markdown table, every op whose category differs between the shared "
             "O1 preset and the native's default lists, and why")


@subcommand
def register_diff(sub: "argparse._SubParsersAction") -> None:
    p = sub.add_parser("diff", help=DIFF_HELP, description=DIFF_HELP)
    p.add_argument("--framework", required=True, choices=DIFF_FRAMEWORKS,
                   help="whose op names and native lists to compare (paddle-dygraph: "
                        "paddle.amp's lists, which paddle_amp.dygraph follows without policy=)")
    p.add_argument("--dtype", default="float16", choices=LOW_DTYPES,
                   help="the low-precision dtype")
    p.add_argument("--version", help="the native version whose lists to compare, one the data "
                                     "holds (default: the installed one, else the newest)")
    p.set_defaults(handler=_diff)


def _diff(args: argparse.Namespace) -> int:
    from .native_diff import DYGRAPH, markdown
    known = dygraph_versions() if args.framework == DYGRAPH else \
        native_versions(args.framework)
    if args.version is not None and args.version not in known:
        raise AmpConfigError(f"--version {args.version!r}: no native lists of {args.framework} "
                             f"{args.version} here; known versions: {', '.join(known)}")
    print(markdown(args.framework, args.dtype, args.version))
    return 0


# -- the parser and main ----------------------------------------------------------------------

def plugin_commands() -> dict[str, Register]:
    """{name: register} of the subcommands installed packages declare in ``COMMAND_GROUP``."""
    return {ep.name: ep.load() for ep in entry_points(group=COMMAND_GROUP)}


@subcommand
def _add_info(sub: "argparse._SubParsersAction") -> None:
    """``info``: what this machine runs in low precision (``fallback.info_text``), and with
    ``--measure`` how fast (``_measured``)."""
    def run(args: argparse.Namespace) -> int:
        from .fallback import info_text
        print(info_text(dtypes=args.dtype or LOW_DTYPES), flush=True)
        if args.measure or args.save:
            _measured(args.dtype or ["bfloat16"], args.save, args.refresh)
        return 0
    p = _speed_parser(sub, "info", "which ops have real low-precision kernels here, per "
                      "installed framework, and what AMP does with the others",
                      "only this dtype (repeatable; default: float16 and bfloat16)", run)
    p.add_argument("--measure", action="store_true",
                   help="also time the ops the lists lower, low against float32 (forward and "
                        "training step, casts included), and say what policy 'auto' decides")


@subcommand
def _add_profile(sub: "argparse._SubParsersAction") -> None:
    """``profile``: measure here and write the profile file a policy names."""
    def run(args: argparse.Namespace) -> int:
        _measured(args.dtype or ["bfloat16"], args.save, args.refresh)
        return 0
    _speed_parser(sub, "profile", "time the ops AMP lowers, low against float32, on this "
                  "machine, and save the profile a policy can name",
                  "the low dtype (default: bfloat16)", run)


def _speed_parser(sub: "argparse._SubParsersAction", name: str, what: str, dtype_help: str,
                  run: Callable[[argparse.Namespace], int]) -> argparse.ArgumentParser:
    """``info``'s and ``profile``'s parser: ``--dtype``, ``--save``, ``--refresh``; ``run``
    after the frameworks' log noise is off (before a backend imports its framework)."""
    def handler(args: argparse.Namespace) -> int:
        from .quiet import quiet_frameworks
        quiet_frameworks()
        return run(args)
    p = sub.add_parser(name, help=what)
    p.add_argument("--dtype", action="append", choices=LOW_DTYPES, help=dtype_help)
    p.add_argument("--save", metavar="PATH",
                   help="write every measurement of this machine to PATH, a profile file a "
                        "policy names (profile = \"PATH\")")
    p.add_argument("--refresh", action="store_true",
                   help="measure again what this machine's speed cache holds for the "
                        "installed frameworks and this dtype (the other entries are kept)")
    p.set_defaults(handler=handler)
    return p


def _measured(dtypes: Sequence[str], save: Optional[str], refresh: bool) -> None:
    """Print the measured-speed report per dtype (``speed_report``), saving if asked."""
    from .speed_report import installed, measure
    if refresh:
        os.environ["AMP_ADAPTERS_REFRESH"] = "1"  # before any book is made
    providers = installed()
    if not providers:
        print("no framework backend registered: install amp-adapters with a framework "
              "(pip install '.[mxnet]' or '.[paddle]')")
    for dtype in dtypes:
        print(f"\nmeasured here ({dtype}, casts included; a ratio below 1 is faster):",
              flush=True)
        print(measure(providers, dtype, save))


EXAMPLES = """examples:
  amp-adapters lists --framework paddle
  amp-adapters lists --framework paddle --policy O1
  amp-adapters explain Activation --framework mxnet --attr act_type=softrelu
  amp-adapters info --dtype bfloat16 --measure
  amp-adapters profile --save cpu.json
  amp-adapters demo --framework paddle --steps 200 --plot demo.png
  amp-adapters max-batch --framework paddle-dygraph --model cnn --memory 4GiB
  amp-adapters doctor --framework mxnet --model overflow --write fix.toml
"""


def build_parser(commands: Optional[Mapping[str, Register]] = None) -> argparse.ArgumentParser:
    """The parser; ``commands`` (default: the installed ones) add their subcommands."""
    parser = Parser(prog=PROG, formatter_class=HelpFormatter, epilog=EXAMPLES,
                    description="Inspect the AMP op lists your code gets, explain one decision, "
                                "or run the demo.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for register in SUBCOMMANDS:
        register(sub)
    for register in (plugin_commands() if commands is None else commands).values():
        register(sub)
    for action in sub._choices_actions:  # every subcommand's --help says what it does
        p = sub.choices[action.dest]
        p.description = p.description or action.help
        if "\n" not in p.description:  # kept as written (examples), so wrapped here
            p.description = textwrap.fill(p.description, width=79)
    for p in sub.choices.values():  # plain help with defaults, one-line errors, for all
        p.formatter_class = HelpFormatter
    return parser


def _quiet_broken_pipe() -> int:
    """The reader went away (``amp-adapters lists ... | head``): stop writing, quietly.
    stdout goes to /dev/null so the interpreter's final flush cannot fail again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return 0


def main(argv: Optional[Sequence[str]] = None,
         commands: Optional[Mapping[str, Register]] = None) -> int:
    args = build_parser(commands).parse_args(argv)
    try:
        status = args.handler(args)
        sys.stdout.flush()  # a closed pipe shows here, inside the try, not at exit
        return status
    except BrokenPipeError:
        return _quiet_broken_pipe()
    except (AmpConfigError, OSError) as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
