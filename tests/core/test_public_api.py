"""What a user of the core needs is importable from ``amp_adapters``: every class the public
functions' signatures name, and the backends and the demo take such names from there (the
deep ``amp_adapters.rules.*`` paths stay for what is not public)."""
import ast
import typing
from pathlib import Path

import amp_adapters
from amp_adapters import OpCall, plan_op

ROOT = Path(__file__).resolve().parents[2]
SPEED_TIDY = {"mxnet_amp/speed.py", "paddle_amp/speed.py", "paddle_amp/dygraph/speed.py",
              "paddle_amp/ir/timed.py"}  # the speed sources, tidied on their own


def classes_named(hint) -> set:
    """The amp_adapters classes a type hint names (through Optional, tuples...)."""
    if isinstance(hint, type):
        return {hint} if hint.__module__.startswith("amp_adapters") else set()
    return set().union(*(classes_named(t) for t in typing.get_args(hint)))


def test_plan_op_and_op_call_name_only_exported_classes():
    hints = typing.get_type_hints(plan_op)
    hints.update(typing.get_type_hints(OpCall))
    named = set().union(*(classes_named(h) for h in hints.values()))
    assert {c.__name__ for c in named} >= {"DeviceProfile", "ShapeClass", "Policy", "OpCall"}
    missing = sorted(c.__name__ for c in named
                     if getattr(amp_adapters, c.__name__, None) is not c
                     or c.__name__ not in amp_adapters.__all__)
    assert missing == [], "amp_adapters/__init__.py: export these (and add them to __all__)"


def test_custom_lists_are_public():
    assert amp_adapters.with_custom_lists.__module__ == "amp_adapters.rules.policy"
    assert {"with_custom_lists", "OpLists"} <= set(amp_adapters.__all__)


def test_the_backends_take_public_names_from_the_package():
    public = set(amp_adapters.__all__)
    bad = []
    for package in ("mxnet_amp", "paddle_amp", "amp_demo"):
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel in SPEED_TIDY:
                continue
            for node in ast.walk(ast.parse(path.read_text("utf-8"))):
                if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                        "amp_adapters.rules"):
                    bad += [f"{rel}:{node.lineno} {a.name}" for a in node.names
                            if a.name in public and a.asname is None]
    assert bad == [], "import these from amp_adapters"
