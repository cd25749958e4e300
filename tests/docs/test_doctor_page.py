"""docs/doctor.md's worked example: the commands it shows print what it shows.

The page's ``$ amp-adapters doctor ...`` transcripts run in order in one folder (the second
reads the file the first writes), and every line the page shows must come out of its command,
in the page's order (``...`` on a line of its own stands for lines left out; a line that ends
in `` ...`` for the rest of that line). Lines compare token by token, whitespace-insensitive
(a column may widen), numbers to within 0.2%: Paddle 2.6.2's CPU cast to float16 rounds toward
zero and 3.x's to nearest (troubleshooting.md), so the planted matmul's max |x| differs in the
fourth digit. The ``toml`` block is the file the first
command writes. The prose's claims about the other two planted models are checked too.

The page's python blocks run in test_docs.py (they are marked ``<!-- runnable -->``).
"""
import importlib.util
import math
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "doctor.md"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)
NUMBER = re.compile(r"([(|]*)([-+]?(?:\d+\.?\d*(?:e[-+]?\d+)?|inf))([%),;]*)")

pytestmark = pytest.mark.skipif(importlib.util.find_spec("paddle") is None,
                                reason="the page's transcripts run --framework paddle; "
                                       "paddle is not installed here")


def page_blocks():
    """[(language, text)] of the page's fenced blocks, in order."""
    return [(m.group(1), m.group(2)) for m in FENCE.finditer(PAGE.read_text(encoding="utf-8"))]


def transcripts():
    """[(argv after ``amp-adapters``, the output shown)] of the page's command transcripts."""
    out = []
    for lang, text in page_blocks():
        first, _, shown = text.partition("\n")
        if not lang and first.startswith("$ amp-adapters doctor"):
            out.append((shlex.split(first[2:])[1:], shown))
    return out


def amp_adapters(argv, cwd):
    """``amp-adapters ARGV`` as a user runs it (the installed subcommands), with this checkout
    first on the path, on a CPU without bf16 kernels as the page says (oneDNN limited to
    AVX2: where bf16 runs, the doctor tries the model in bf16 before an op type)."""
    r = subprocess.run([sys.executable, "-m", "amp_adapters.services.cli", *argv], cwd=cwd,
                       capture_output=True, text=True, timeout=300,
                       env={**os.environ, "DNNL_MAX_CPU_ISA": "AVX2",
                            "ONEDNN_MAX_CPU_ISA": "AVX2", "PYTHONPATH": os.pathsep.join(
                                filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))})
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    return r.stdout


def tokens(line):
    return line.split()


def same_token(shown, printed):
    if shown == printed:
        return True
    a, b = NUMBER.fullmatch(shown), NUMBER.fullmatch(printed)
    return bool(a and b and (a.group(1), a.group(3)) == (b.group(1), b.group(3))
                and math.isclose(float(a.group(2)), float(b.group(2)), rel_tol=2e-3))


def same_line(shown, printed):
    want, got = tokens(shown), tokens(printed)
    if want[-1:] == ["..."]:  # the rest of the line is left out
        want, got = want[:-1], got[:len(want) - 1]
    return len(want) == len(got) and all(map(same_token, want, got))


def assert_shows(shown, printed, what):
    """Every line of ``shown`` (but ``...`` and blank ones) is a line of ``printed``, in order."""
    lines = printed.splitlines()
    i = 0
    for line in shown.splitlines():
        if line.strip() in ("", "..."):
            continue
        while i < len(lines) and not same_line(line, lines[i]):
            i += 1
        assert i < len(lines), f"docs/doctor.md shows\n{line}\nbut {what} gives\n{printed}"
        i += 1


def test_the_page_shows_two_transcripts_and_the_file_the_first_writes():
    runs = transcripts()
    assert len(runs) == 2
    assert "--write" in runs[0][0] and "--policy" in runs[1][0]
    assert runs[1][0][runs[1][0].index("--policy") + 1] == \
        runs[0][0][runs[0][0].index("--write") + 1]  # the second run reads the first one's file
    assert [lang for lang, _ in page_blocks()].count("toml") == 1


def test_the_worked_example_prints_what_the_page_shows(tmp_path):
    (first, first_shown), (second, second_shown) = transcripts()
    written = first[first.index("--write") + 1]
    assert_shows(first_shown, amp_adapters(first, tmp_path), "amp-adapters " + " ".join(first))
    toml = next(text for lang, text in page_blocks() if lang == "toml")
    assert_shows(toml, (tmp_path / written).read_text(encoding="utf-8"), written)
    assert_shows(second_shown, amp_adapters(second, tmp_path),
                 "amp-adapters " + " ".join(second))


@pytest.mark.parametrize("model,claims", [
    ("underflow", [("a quarter of `w1`'s gradient flushes", "w1 (25%)"),
                   ("recommends `init_scale = 8388608`", "init_scale = 8388608")]),
    ("reduction", [("measures the relative error it adds and moves `matmul` to fp32",
                    "move 'matmul' to fp32")]),
])
def test_the_other_planted_models_get_what_the_page_says(model, claims, tmp_path):
    """claims: [(what the page says, what the command prints for it)]."""
    text = " ".join(PAGE.read_text(encoding="utf-8").split())
    out = amp_adapters(["doctor", "--framework", "paddle", "--model", model], tmp_path)
    for page_says, prints in claims:
        assert f"`{model}`" in text and page_says in text, page_says
        assert prints in out, out
