"""paddle_amp's IR layering, read from the source: what differs between Paddle's two program
IRs lives in ``paddle_amp/ir/`` and nowhere else (issue 31).

Outside ``paddle_amp/ir/`` no module
- imports ``paddle.pir`` or reaches it (``paddle.pir``, ``getattr(paddle, "pir")``),
- calls ``in_pir_mode``,
- reads ``FLAGS_enable_pir_api`` (a string in code; docstrings may name it),
- takes a parameter named ``pir`` (the IR is a program's, reached by ``ir.of(program)``:
  its probe, its methods), but for the known exceptions below, each still to be moved.
"""
import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "paddle_amp"

# (file, what) -> why it is still there. Each is to move into paddle_amp/ir/ (another
# change moves them); a fixed one must leave this list (the test says which).
KNOWN: dict = {}


def _docstrings(tree) -> set[int]:
    """ids of the docstring constants of ``tree``'s module, classes and functions."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                out.add(id(body[0].value))
    return out


def _is_paddle_pir(node) -> bool:
    if isinstance(node, ast.Attribute) and node.attr == "pir":
        return isinstance(node.value, ast.Name) and node.value.id == "paddle"
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
            and node.func.id == "getattr" and len(node.args) >= 2:
        obj, name = node.args[:2]
        return isinstance(obj, ast.Name) and obj.id == "paddle" and \
            isinstance(name, ast.Constant) and name.value == "pir"
    return False


def findings(source: str) -> list[tuple[str, int]]:
    """(what, line) for every way ``source`` depends on the IR outside ``ir/``."""
    tree = ast.parse(source)
    docs = _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.Import):
            found += [("imports paddle.pir", line) for a in node.names
                      if a.name == "paddle.pir" or a.name.startswith("paddle.pir.")]
        elif isinstance(node, ast.ImportFrom) and node.module:
            if node.module == "paddle.pir" or node.module.startswith("paddle.pir.") or (
                    node.module == "paddle" and any(a.name == "pir" for a in node.names)):
                found.append(("imports paddle.pir", line))
        elif _is_paddle_pir(node):
            found.append(("reaches paddle.pir", line))
        elif isinstance(node, ast.Call):
            name = getattr(node.func, "attr", None) or getattr(node.func, "id", None)
            if name == "in_pir_mode":
                found.append(("calls in_pir_mode", line))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) \
                and "FLAGS_enable_pir_api" in node.value and id(node) not in docs:
            found.append(("reads FLAGS_enable_pir_api", line))
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            a = node.args
            if any(arg.arg == "pir" for arg in (*a.posonlyargs, *a.args, *a.kwonlyargs)):
                found.append(("takes a pir parameter", line))
    return found


@pytest.mark.parametrize("source,what", [
    ("import paddle.pir", "imports paddle.pir"),
    ("from paddle import pir", "imports paddle.pir"),
    ("from paddle.pir import core", "imports paddle.pir"),
    ("import paddle\nx = paddle.pir.Program", "reaches paddle.pir"),
    ("import paddle\nx = getattr(paddle, 'pir', None)", "reaches paddle.pir"),
    ("from paddle.base import framework\nframework.in_pir_mode()", "calls in_pir_mode"),
    ("import os\nos.environ.get('FLAGS_enable_pir_api')", "reads FLAGS_enable_pir_api"),
    ("def f(device, pir=False): pass", "takes a pir parameter"),
    ("f = lambda pir: pir", "takes a pir parameter"),
])
def test_the_check_finds_each_kind(source, what):
    assert [w for w, _ in findings(source)] == [what]


def test_a_docstring_may_name_the_flag():
    assert findings('"""Paddle 3 under FLAGS_enable_pir_api=0."""\ndef f(pir_name): pass') == []


def test_nothing_outside_ir_depends_on_the_ir():
    seen, bad = set(), []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith("paddle_amp/ir/"):
            continue
        for what, line in findings(path.read_text("utf-8")):
            if (rel, what) in KNOWN:
                seen.add((rel, what))
            else:
                bad.append(f"{rel}:{line}: {what}")
    assert not bad, ("outside paddle_amp/ir/ (move it into the IR's folder, reached through "
                     "ir.of(program)):\n" + "\n".join(bad))
    stale = sorted(set(KNOWN) - seen)
    assert not stale, f"fixed, so remove from KNOWN in {__file__}: {stale}"
