"""Paddle test setup: legacy program IR, and a fresh static program + scope per test.

``FLAGS_enable_pir_api=0`` must be set before Paddle is imported (Paddle 3.3.1
builds PIR programs otherwise). Each test gets its own programs, scope and
unique-name namespace inside static mode, and dygraph mode is restored after,
so nothing leaks into the other tests of the same pytest process.
"""
import os

os.environ.setdefault("FLAGS_enable_pir_api", "0")

import paddle  # noqa: E402
import pytest  # noqa: E402
from paddle.base import unique_name  # noqa: E402

from paddle_helpers import Static  # noqa: E402


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
