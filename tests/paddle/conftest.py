"""Paddle test setup: the program IR under test, and a fresh static program + scope per test.

``AMP_TEST_IR`` picks the IR the suite builds programs in, and must be read
before Paddle is imported (``FLAGS_enable_pir_api`` is read at import):
``legacy`` (the default; Paddle 2.6.2 has only this one) or ``pir`` (Paddle
3's default IR). ``make test-paddle3`` runs the suite once per IR. Tests that
inspect legacy program internals (``op.type``, var descs) are marked
``legacy_ir`` and skipped under PIR; their PIR twins are in test_paddle_pir_*.py.
Each test gets its own programs, scope and unique-name namespace inside static
mode, and dygraph mode is restored after, so nothing leaks between tests.
"""
import os

IR = os.environ.get("AMP_TEST_IR", "legacy")
if IR not in ("legacy", "pir"):
    raise RuntimeError(f"AMP_TEST_IR must be 'legacy' or 'pir', got {IR!r}")
os.environ["FLAGS_enable_pir_api"] = "1" if IR == "pir" else "0"

import paddle  # noqa: E402
import pytest  # noqa: E402
from paddle.base import unique_name  # noqa: E402

from paddle_helpers import Static  # noqa: E402

PADDLE3 = int(paddle.__version__.split(".")[0]) >= 3


def pytest_configure(config):
    config.addinivalue_line("markers", "legacy_ir: inspects legacy program internals; "
                                       "skipped when AMP_TEST_IR=pir")


def pytest_collection_modifyitems(config, items):
    if IR != "pir":
        return
    skip = pytest.mark.skip(reason="inspects legacy program internals (op.type, var descs); "
                                   "the PIR twins are in test_paddle_pir_*.py")
    for item in items:
        if "legacy_ir" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def static():
    """Static mode with a fresh main/startup program, scope and CPU executor."""
    paddle.enable_static()
    env = Static.new()
    try:
        with paddle.static.program_guard(env.main, env.startup), \
                paddle.static.scope_guard(env.scope), unique_name.guard():
            yield env
    finally:
        paddle.disable_static()


@pytest.fixture(autouse=True)
def dygraph_mode_for_dygraph_tests(request):
    """The dygraph runtime's tests (test_dygraph_*.py) run in dynamic mode whatever an earlier
    test left on (some enable static mode for a whole module), and leave the mode as found."""
    if not request.module.__name__.startswith("test_dygraph_") or paddle.in_dynamic_mode():
        yield
        return
    paddle.disable_static()
    try:
        yield
    finally:
        paddle.enable_static()
