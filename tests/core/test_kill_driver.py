"""The kill tests' driver (tests/kill/driver.py): a kill that lands after the worker ended.

The MXNet kill test failed now and then (2 in 16 runs) with
``ProcessLookupError: [Errno 3] No such process`` from ``Run.kill``: a kill aimed
just after the last save (``after_save`` at step N, or a startup timer) landed
after the worker had printed DONE, exited and been reaped by the fork server.
Whether it lands before or after the exit depends on the scheduler; the verdict
must not. Here the worker has certainly ended and been reaped before the kill.
"""
import os
import sys
import time
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TESTS / "kill"))

import driver  # noqa: E402

WORKER = '''
def main(directory, n):
    print("START 0 x", flush=True)
    print("DONE", flush=True)
'''


def _reaped(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_a_kill_after_the_worker_exited_kills_nothing_and_the_run_completes(tmp_path):
    worker = tmp_path / "worker.py"
    worker.write_text(WORKER)
    zygote = driver.Zygote(str(worker), [], tmp_path)
    try:
        run = zygote.start(tmp_path / "ckpt", 1)
        assert [kind for kind, _ in run.lines()] == ["START", "DONE"]  # its output ended
        for _ in range(10_000):  # the fork server reaps it right after it exits
            if _reaped(run.pid):
                break
            time.sleep(0.001)
        assert _reaped(run.pid)
        run.kill()  # before: ProcessLookupError, failing the kill test
        assert not run.killed
        assert run.finish() == (0, "")
    finally:
        zygote.abort()


def test_a_kill_of_a_running_worker_is_a_sigkill(tmp_path):
    worker = tmp_path / "worker.py"
    worker.write_text(WORKER.replace('print("DONE"', 'import time; time.sleep(60)\n    print("DONE"'))
    zygote = driver.Zygote(str(worker), [], tmp_path)
    try:
        run = zygote.start(tmp_path / "ckpt", 1)
        lines = run.lines()
        assert next(lines)[0] == "START"
        run.kill()
        assert run.killed
        assert list(lines) == []
        assert run.finish()[0] == -9
    finally:
        zygote.abort()
