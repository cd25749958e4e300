"""One role, one name, across the three runtimes (``mxnet_amp``, ``paddle_amp``,
``paddle_amp/dygraph``): the role table of docs/design.md names files that exist in each,
a file the other two have under a role's name bears it in the third too, and the kernel
tables' functions have one name each. Read from the source: no framework is imported."""
import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RUNTIMES = ("mxnet_amp", "paddle_amp", "paddle_amp/dygraph")


def role_table() -> dict[str, list[str]]:
    """{role: [its cell in each runtime's column]} from docs/design.md."""
    text = (ROOT / "docs" / "design.md").read_text("utf-8")
    head = next(line for line in text.splitlines() if line.startswith("| role |"))
    columns = [c.strip() for c in head.strip("|").split("|")]
    assert columns[1:] == list(RUNTIMES), "docs/design.md: the role table has a column a runtime"
    rows = {}
    for line in text.splitlines():
        if line.startswith("| ") and not line.startswith(("| role |", "|---")):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            rows[cells[0].split(":")[0]] = cells[1:]
    return rows


def test_the_role_table_has_every_role_for_every_runtime():
    rows = role_table()
    assert {"config", "kernels", "lists", "rewrite", "scaling", "masters", "layer paths",
            "speed", "speed_child", "doctor", "memory", "report", "checkpoint"} <= set(rows)
    for role, cells in rows.items():
        assert len(cells) == len(RUNTIMES) and all(cells), role


@pytest.mark.parametrize("column", range(len(RUNTIMES)))
def test_the_role_table_names_files_that_exist(column):
    runtime = RUNTIMES[column]
    for role, cells in role_table().items():
        cell = cells[column]
        own = re.sub(r"Paddle's `[^`]*`", "", cell)  # a file the runtime shares: Paddle's
        for name in re.findall(r"`(\w+\.py|\w+/)`", own):
            assert (ROOT / runtime / name.rstrip("/")).exists(), f"{role}: {runtime}/{name}"


def test_a_role_the_others_name_alike_bears_that_name_in_each():
    """Where two runtimes give a role's file the same name, the third's own file for that
    role has it too (paths.py or native_lists.py beside layer_paths.py and lists.py, no)."""
    for role, cells in role_table().items():
        first = [re.findall(r"`(\w+\.py|\w+/)`", re.sub(r"Paddle's `[^`]*`", "", c))[:1]
                 for c in cells]
        names = {f[0] for f in first if f}
        if role not in ("specific", "framework glue", "rewrite") and len(names) > 1:
            stems = {n.rstrip("/").removesuffix(".py") for n in names}
            assert len(stems) == 1, f"{role}: {sorted(names)}"


def defs(path: Path) -> set[str]:
    return {n.name for n in ast.parse(path.read_text("utf-8")).body
            if isinstance(n, ast.FunctionDef)}


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_the_kernel_tables_name_their_answers_alike(runtime):
    found = defs(ROOT / runtime / "kernels.py")
    assert {"lowp_kernels", "device_profile"} <= found, runtime
    assert not found & {"low_kernels", "profile", "inference_profile"}, runtime
