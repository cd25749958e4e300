"""SIGKILL a Paddle static run that checkpoints every step, at random points, >= 20 times: every
resume is bit-identical to the uninterrupted run, or a clear "no complete checkpoint" error.

In the IR the suite builds (``AMP_TEST_IR``: the legacy IR, or PIR under Paddle 3, which
``make test-paddle3`` runs): the worker processes inherit it. One checkpoint API for both."""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "kill"))

import driver  # noqa: E402

WORKER = os.path.join(HERE, "paddle_ckpt_kill_worker.py")
PATHS = [HERE, os.path.dirname(os.path.dirname(HERE))]


def test_kills_at_random_points_never_corrupt_a_resume():
    driver.check_kills_never_corrupt(WORKER, PATHS)
