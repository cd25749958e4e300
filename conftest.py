"""The whole suite: run as the CPU class ``AMP_ADAPTERS_CPU`` names (importing ``amp_adapters``
limits oneDNN to match, here before any test module loads a framework, and in every child),
and never in the user's speed cache (each session measures into its own). At the root, not
in tests/: pytest puts a conftest's folder on sys.path, where tests/mxnet and tests/paddle
would pass for the frameworks themselves in a venv without them."""
import os
import shutil
import tempfile

from amp_adapters.rules.isa import describe_bf16
from amp_adapters.rules.isa import machine

CACHE = tempfile.mkdtemp(prefix="amp-adapters-test-cache-")
os.environ["AMP_ADAPTERS_CACHE"] = CACHE


def pytest_report_header(config):
    return describe_bf16(machine())


def pytest_unconfigure(config):
    shutil.rmtree(CACHE, ignore_errors=True)
