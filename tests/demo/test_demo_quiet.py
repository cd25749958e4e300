"""The demo as a user runs it prints its progress and table, and none of the frameworks' log
noise: no glog lines, no oneDNN probe messages, no "No ccache found" / "Cannot decide type"."""
import os
import re
import subprocess
import sys

import pytest

pytest.importorskip("mxnet", reason="the demo trains in MXNet and Paddle")
pytest.importorskip("paddle", reason="the demo trains in MXNet and Paddle")
pytest.importorskip("sklearn", reason="the demo trains on scikit-learn's digits")


def test_demo_output_has_no_framework_noise(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GLOG_", "FLAGS_call"))}
    env["AMP_DEMO_SPEED_BUDGET_S"] = "0"  # the speed rows' path runs, at 5 timed pairs a row
    r = subprocess.run([sys.executable, "-m", "amp_demo", "--steps", "5", "--no-memory"],
                       cwd=tmp_path,
                       capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "paddle          fp16 O1 (emulated)" in r.stdout and "mxnet           fp32" in r.stdout
    assert "paddle-dygraph  fp16 O1 (emulated)" in r.stdout
    assert "GEMMs in bf16" in r.stdout  # the speed table's children ran too
    assert not re.search(r"^[IW]\d{4} ", r.stderr, re.M), r.stderr[-3000:]
    for noise in ("New Executor", "primitive descriptor", "MXNET_SAFE_ACCUMULATION",
                  "No ccache found", "Cannot decide type"):
        assert noise not in r.stderr + r.stdout, noise
