"""The Paddle demo prints no framework noise on any installed Paddle (2.6, or 3.x in PIR):
no glog lines, no Paddle UserWarning, no timestamped INFO lines from Paddle's root handler.
Runs in `make test` (Paddle 2.6.2) and `make test-paddle3` (3.3.1, PIR)."""
import os
import re
import subprocess
import sys

import pytest

pytest.importorskip("paddle", reason="the Paddle demo needs Paddle")
pytest.importorskip("sklearn", reason="the demo trains on scikit-learn's digits")


def test_paddle_demo_output_has_no_framework_noise(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GLOG_", "FLAGS_call"))}
    env["AMP_DEMO_SPEED_BUDGET_S"] = "0"  # the speed rows' path runs, at 5 timed pairs a row
    r = subprocess.run([sys.executable, "-m", "amp_demo", "--framework", "paddle", "--steps",
                        "5", "--no-memory"], cwd=tmp_path, capture_output=True, text=True,
                       timeout=300, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "paddle     fp16 O1 (emulated)" in r.stdout
    assert "GEMMs in bf16" in r.stdout  # the speed table's children ran too
    assert r.stderr == "", r.stderr[-3000:]  # nothing: no warning, no log line
    assert not re.search(r"^\[\d{4}-\d\d-\d\d ", r.stdout, re.M), r.stdout
