"""SIGKILL a Gluon run that checkpoints every step, at random points, >= 20 times: every
resume is bit-identical to the uninterrupted run, or a clear "no complete checkpoint" error."""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "kill"))

import driver  # noqa: E402

WORKER = os.path.join(HERE, "ckpt_kill_worker.py")
PATHS = [HERE, os.path.dirname(os.path.dirname(HERE))]
N, KILLS = 12, 20


def test_kills_at_random_points_never_corrupt_a_resume():
    ref = driver.reference(WORKER, N, PATHS)
    counts = driver.chain(WORKER, N, PATHS, ref, kills=KILLS, seed=15)
    print(counts)
    assert counts.kills >= KILLS
    assert counts.kills_in_save >= 1 and counts.exact_resumes >= 1
    assert counts.clear_errors + counts.exact_resumes + counts.completed_runs >= counts.kills
