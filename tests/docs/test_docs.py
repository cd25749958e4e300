"""The documentation: its runnable examples run, the site builds in strict mode (a broken
link, a missing API reference or an unknown anchor fails), and the README's links exist.

A fenced ``python`` block right after an HTML comment ``<!-- runnable -->`` is run as
written, in a fresh interpreter (``<!-- runnable: mxnet -->`` names the frameworks it needs:
it skips, naming them, where one is not installed)."""
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
RUNNABLE = re.compile(r"^<!-- runnable(?::([^>]*))? -->\n```python\n(.*?)^```", re.M | re.S)


def runnable_blocks():
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for m in RUNNABLE.finditer(text):
            line = text[:m.start()].count("\n") + 2
            needs = (m.group(1) or "").split()
            yield pytest.param(m.group(2), needs, id=f"{page.relative_to(ROOT)}:{line}")


BLOCKS = list(runnable_blocks())


def test_the_docs_have_runnable_examples_for_the_core_and_both_frameworks():
    needs = {n for p in BLOCKS for n in p.values[1]}
    assert len(BLOCKS) >= 4 and {"mxnet", "paddle"} <= needs


@pytest.mark.parametrize("code,needs", BLOCKS)
def test_a_runnable_example_runs_as_written(code, needs, tmp_path):
    for module in needs:
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"needs {module}, which is not installed here")
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                       text=True, timeout=300,
                       env={**os.environ, "PYTHONPATH": os.pathsep.join(
                           filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))})
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]


def test_the_site_builds_in_strict_mode(tmp_path):
    pytest.importorskip("mkdocs", reason="the docs extra is not installed (pip install .[docs])")
    pytest.importorskip("mkdocstrings", reason="the docs extra is not installed")
    r = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir",
                        str(tmp_path / "site")], cwd=ROOT, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    api = (tmp_path / "site" / "api" / "index.html").read_text(encoding="utf-8")
    for name in ("resolve_policy", "init_trainer", "OptimizerWithMixedPrecision", "DoctorReport",
                 "Recommendation", "mxnet_amp.doctor", "paddle_amp.doctor"):
        assert name in api, name


def test_every_page_is_in_the_nav():
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    for page in (ROOT / "docs").glob("*.md"):
        assert f" {page.name}\n" in nav, page.name


def test_the_readme_links_to_files_that_exist_and_fits_a_few_screens():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 150
    links = re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", text)
    assert any(link.startswith("docs/") for link in links)
    for link in links:
        assert (ROOT / link).exists(), link


def test_the_index_topics_link_every_page():
    """A reader starts at the index: every page has a way in from it (the doctor and bf16
    pages had none), and a user with a NaN finds the doctor from the troubleshooting page."""
    index = (ROOT / "docs" / "index.md").read_text(encoding="utf-8")
    for page in (ROOT / "docs").glob("*.md"):
        if page.name != "index.md":
            assert f"]({page.name}" in index, f"docs/index.md does not link {page.name}"
    trouble = (ROOT / "docs" / "troubleshooting.md").read_text(encoding="utf-8")
    titles = {e.split("**")[1]: e for e in trouble.split("\n- ") if e.count("**") >= 2}
    entry = next(e for title, e in titles.items() if "NaN" in title)
    assert "](doctor.md)" in entry, entry
