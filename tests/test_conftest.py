"""What the root conftest.py promises every test: the speed cache is the session's own (a test
that measures, the demo's bf16 rows among them, never writes the user's cache)."""
import os
import tempfile

from amp_adapters.services.speedbook import cache_dir


def test_the_suite_measures_into_its_own_cache_not_the_users():
    users = cache_dir({k: v for k, v in os.environ.items() if k != "AMP_ADAPTERS_CACHE"})
    here = cache_dir()
    assert here != users
    assert os.path.commonpath([str(here), tempfile.gettempdir()]) == tempfile.gettempdir()
