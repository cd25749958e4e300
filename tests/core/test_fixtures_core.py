"""Loss-scale state dicts written by every earlier version load here and resume exactly.

``tests/fixtures/v*/core/`` holds state dicts that ``write_fixtures.py core`` wrote with that
version; each must load (through whatever upgrade the format needs) into the same kind and
state, and its next steps must follow DESIGN's rule run from the saved numbers."""
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))
from reference import next_state, versions  # noqa: E402

from amp_adapters import loss_scale_from_state_dict  # noqa: E402

CASES = [(v, p) for v in versions() for p in sorted((v / "core").glob("*.json"))
         if p.name != "recipe.json"]


def test_there_are_fixtures_of_every_kind():
    kinds = {json.loads(p.read_text())["kind"] for _, p in CASES}
    assert kinds == {"dynamic", "static", "none"}
    assert any(v.name == "v0_1_0" for v, _ in CASES)


@pytest.mark.parametrize("version, path", CASES, ids=lambda x: getattr(x, "name", x))
def test_saved_state_dict_loads_and_resumes_exactly(version, path):
    saved = json.loads(path.read_text())
    recipe = json.loads((version / "core" / "recipe.json").read_text())[path.stem]
    value = loss_scale_from_state_dict(saved)
    assert value.kind == saved["kind"]
    assert value.state.as_dict() == saved["state"]
    expected = saved
    for flag in recipe["next_flags"]:
        value = value.adjust(bool(flag))
        expected = {**expected, "state": next_state(expected, bool(flag))}
        assert value.state.as_dict() == expected["state"], (path.name, flag)
    assert value.state.total_steps == saved["state"]["total_steps"] + len(recipe["next_flags"])
