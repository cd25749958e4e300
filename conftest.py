"""The whole suite: run as the CPU class ``AMP_ADAPTERS_CPU`` names (importing ``amp_adapters``
limits oneDNN to match, here before any test module loads a framework, and in every child),
and never in the user's speed cache (each session measures into its own). At the root, not
in tests/: pytest puts a conftest's folder on sys.path, where tests/mxnet and tests/paddle
would pass for the frameworks themselves in a venv without them. Under pytest-xdist (make test:
two workers) each worker is a session of its own, so each measures into its own cache too."""
import os
import shutil
import tempfile

import pytest

from amp_adapters.rules.isa import describe_bf16, machine
from amp_adapters.services import speed_source

CACHE = tempfile.mkdtemp(prefix="amp-adapters-test-cache-")
os.environ["AMP_ADAPTERS_CACHE"] = CACHE


def pytest_report_header(config):
    return describe_bf16(machine())


def pytest_unconfigure(config):
    shutil.rmtree(CACHE, ignore_errors=True)


@pytest.fixture
def own_speed_cache(tmp_path, monkeypatch):
    """Every speed book the test makes reads and writes a cache of its own, and is made
    afresh (``speed_source.forget``: the process's books dropped before and after)."""
    monkeypatch.setenv("AMP_ADAPTERS_CACHE", str(tmp_path / "cache"))
    speed_source.forget()
    yield
    speed_source.forget()


@pytest.fixture
def child_asked(monkeypatch):
    """The questions sent to the measuring child (the real one: counted, then delegated), as
    (function name, *arguments): what the device-book tests of each backend check."""
    from amp_adapters.services import measure_process
    sent = []
    call = measure_process.call

    def counted(server, fn, *args):
        sent.append((fn.__name__,) + args)
        return call(server, fn, *args)
    monkeypatch.setattr(measure_process, "call", counted)
    return sent
