"""Kill a checkpointing worker with SIGKILL at random points; check every resume is exact.

A worker (tests/mxnet/ckpt_kill_worker.py, tests/paddle/paddle_ckpt_kill_worker.py,
tests/paddle/dygraph_ckpt_kill_worker.py) resumes from a checkpoint folder if it
holds a complete checkpoint, trains to
step N and checkpoints after every step, printing fingerprints of its whole
state (see the workers). Each run is a new process forked by a fork server
(zygote.py) that has only imported the framework, so 20+ runs take seconds,
not minutes. ``reference`` runs the worker once uninterrupted. ``chain``
starts it again and again on one folder, each time killing it with SIGKILL at
a random point: while it starts up, just after it began a save (inside the
save, within a few ms), or just after a save ended.
Each new process is a resume, and the test checks that

- it resumed from a step between the last save it saw complete and the last
  one it saw begin (the save in progress may have committed), with a state
  bit-identical to the uninterrupted run's after that step;
- if it found no complete checkpoint, it said so in a clear error, and no
  save had completed in that folder (nothing was silently lost);
- every later step's state is bit-identical to the uninterrupted run's.

No verdict depends on where a kill lands (the scheduler decides that): a kill
that lands after the worker ended kills nothing, a startup kill may land before
or after the load, and the chain goes on until it has the kills it needs.
"""
from __future__ import annotations

import dataclasses
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Optional

WATCHDOG_S = 120.0  # no run of the worker takes this long


@dataclasses.dataclass
class Counts:
    kills: int = 0
    kills_in_save: int = 0      # killed after "save k began" was seen, before "ended"
    torn_saves_left: int = 0    # a killed save left its temp folder behind
    started: int = 0            # processes that got as far as loading (printed START)
    clear_errors: int = 0       # loads that found no complete checkpoint, said so, started at 0
    exact_resumes: int = 0      # resumes whose loaded state matched the reference
    completed_runs: int = 0
    processes: int = 0


def _env(paths: list[str]) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(paths + [env.get("PYTHONPATH", "")])
    return env


class Zygote:
    """A fork server (zygote.py) that has imported the worker and its framework."""

    def __init__(self, worker: str, paths: list[str], tmp: Path):
        self.tmp = tmp
        self.proc = subprocess.Popen([sys.executable, str(Path(__file__).with_name("zygote.py")),
                                      worker], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, env=_env(paths))
        assert self.proc.stdout.readline().strip() == "READY"
        self.runs = 0

    def start(self, folder: Path, n: int) -> "Run":
        self.runs += 1
        fifo, err = self.tmp / f"out{self.runs}", self.tmp / f"err{self.runs}"
        os.mkfifo(fifo)
        self.proc.stdin.write(f"{fifo} {err} {folder} {n}\n")
        self.proc.stdin.flush()
        words = self.proc.stdout.readline().split()
        assert words[0] == "PID", words
        return Run(self, int(words[1]), open(fifo), err)

    def abort(self) -> None:
        """On a failure: kill the zygote (its current child is killed by the caller)."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


class Run:
    """One forked worker process: its output lines, a SIGKILL, its exit status."""

    def __init__(self, zygote: Zygote, pid: int, out, err: Path):
        self.zygote, self.pid, self.out, self.err = zygote, pid, out, err
        self.killed = False
        try:  # a handle on this process: a signal never reaches another one that reuses its pid
            self._pidfd: Optional[int] = os.pidfd_open(pid)
        except ProcessLookupError:
            self._pidfd = None  # it already ended (and was reaped): nothing to kill
        self._lock = threading.Lock()
        self._done = False
        self.hung = False
        self.watchdog = threading.Timer(WATCHDOG_S, self._hung)  # a hung worker fails the test
        self.watchdog.daemon = True
        self.watchdog.start()

    def kill(self) -> None:
        """SIGKILL the worker, unless it has already ended: a kill aimed at a point the
        worker may have passed (after its last save, a startup timer) can land after it
        exited, even after the zygote reaped it. Then nothing is killed (``killed`` stays
        False) and the run counts as completed; it used to raise ProcessLookupError."""
        with self._lock:
            if self._done or self.killed or self._pidfd is None:
                return
            try:
                signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)
            except ProcessLookupError:
                return
            self.killed = True

    def _hung(self) -> None:
        self.hung = True
        self.kill()

    def lines(self):
        for line in self.out:
            words = line.split()
            yield (words[0] if words else ""), words

    def finish(self) -> tuple[int, str]:
        line = self.zygote.proc.stdout.readline().split()
        self.watchdog.cancel()
        with self._lock:
            self._done = True
            if self._pidfd is not None:
                os.close(self._pidfd)
                self._pidfd = None
        self.out.close()
        assert line and line[0] == "EXIT", line
        return int(line[1]), self.err.read_text()


def reference(worker: str, n: int, paths: list[str]) -> dict[int, str]:
    """{step: fingerprint after that step} of one uninterrupted run (step 0: the start)."""
    with tempfile.TemporaryDirectory() as d:
        zygote = Zygote(worker, paths, Path(d))
        try:
            run = zygote.start(Path(d) / "ckpt", n)
            ref: dict[int, str] = {}
            for kind, words in run.lines():
                if kind == "START":
                    ref[0] = words[2]
                elif kind == "F":
                    ref[int(words[1])] = words[2]
            code, err = run.finish()
            assert not run.hung, "the reference run hung"
            assert code == 0, err[-3000:]
        finally:
            zygote.abort()
    assert sorted(ref) == list(range(n + 1)), ref
    return ref


def chain(worker: str, n: int, paths: list[str], ref: dict[int, str], kills: int,
          seed: int, startup_kill_s: tuple[float, float] = (0.0, 0.4),
          weights: tuple[int, int, int] = (1, 3, 2)) -> Counts:
    """Kill-and-resume at least ``kills`` times (see the module docstring); returns the
    counts. ``weights``: how often to kill at startup, inside a save, just after a save.

    Where a kill lands is up to the scheduler (a kill aimed inside a save may land after
    it ended, a startup timer before or after the load), so the chain does not stop at a
    number of processes: it goes on until it has ``kills`` kills, one of them inside a
    save and one exact resume from a checkpoint when kills inside saves are asked for (at
    most ``20 * kills`` processes)."""
    with tempfile.TemporaryDirectory() as d:
        zygote = Zygote(worker, paths, Path(d))
        try:
            return _chain(zygote, Path(d), n, ref, kills, random.Random(seed), startup_kill_s,
                          weights)
        finally:
            zygote.abort()


def _chain(zygote: Zygote, d: Path, n: int, ref: dict[int, str], kills: int,
           rng: random.Random, startup_kill_s: tuple[float, float],
           weights: tuple[int, int, int]) -> Counts:
    counts = Counts()
    run = None
    try:
        folders = 0
        folder = Path(d) / "ckpt0"
        committed = 0    # the last step whose save this test saw complete in ``folder``
        pending = None   # a save that began but was not seen to end (it may have committed)
        while True:
            last = (counts.kills >= kills and (not weights[1] or (
                counts.kills_in_save >= 1 and counts.exact_resumes >= 1))) or \
                counts.processes >= 20 * kills
            mode = "none" if last else rng.choices(
                ["startup", "in_save", "after_save"], weights=weights)[0]
            run = zygote.start(folder, n)
            counts.processes += 1
            timer = None
            if mode == "startup":
                timer = threading.Timer(rng.uniform(*startup_kill_s), run.kill)
                timer.daemon = True
                timer.start()
            target = None
            fresh = False
            try:
                for kind, words in run.lines():
                    if kind == "FRESH":
                        assert committed == 0, (f"the save of step {committed} completed, but "
                                                f"the resume found no checkpoint: {words}")
                        fresh = True  # counted at its START: a kill may land in between
                    elif kind == "START":
                        start = int(words[1])
                        counts.started += 1
                        assert start > 0 or fresh, "started from scratch without saying why"
                        hi = pending if pending is not None else committed
                        assert committed <= start <= hi, (start, committed, hi)
                        assert words[2] == ref[start], f"the resume at step {start} is not exact"
                        counts.exact_resumes += start > 0
                        counts.clear_errors += start == 0
                        committed, pending = start, None
                        target = rng.randint(start + 1, min(n, start + 3)) if start < n else n
                    elif kind == "F":
                        k = int(words[1])
                        assert words[2] == ref[k], f"step {k} after a resume is not exact"
                    elif kind == "B":
                        pending = int(words[1])
                        if mode == "in_save" and pending == target:
                            time.sleep(rng.uniform(0, 0.004))
                            run.kill()
                    elif kind == "E":
                        committed, pending = int(words[1]), None
                        if mode == "after_save" and committed == target:
                            time.sleep(rng.uniform(0, 0.002))
                            run.kill()
            finally:
                if timer is not None:
                    timer.cancel()
            code, err = run.finish()
            assert not run.hung, "a worker hung"
            if run.killed and code == -signal.SIGKILL:
                counts.kills += 1
                counts.kills_in_save += pending is not None
                counts.torn_saves_left += folder.exists() and any(
                    p.name.startswith(".tmp-") for p in folder.iterdir())
                continue
            assert code == 0, err[-3000:]
            counts.completed_runs += 1
            if last:
                return counts
            folders += 1  # finished before the kill: go on in a new, empty folder
            folder, committed, pending = Path(d) / f"ckpt{folders}", 0, None
    finally:
        if run is not None:
            run.kill()


def check_kills_never_corrupt(worker: str, paths, n: int = 12, kills: int = 20,
                              seed: int = 15):
    """Kill ``worker`` >= ``kills`` times at random points (some inside a save); every resume
    must be bit-identical to the uninterrupted run, or a clear "no complete checkpoint"."""
    ref = reference(worker, n, paths)
    counts = chain(worker, n, paths, ref, kills=kills, seed=seed)
    print(counts)
    assert counts.kills_in_save >= 1 and counts.exact_resumes >= 1
    return verdict(counts, kills)


def verdict(counts: Counts, kills: int) -> Counts:
    """What holds wherever the kills landed: ``kills`` kills. That every process that loaded
    resumed exactly or said clearly there was nothing to resume is asserted line by line
    as the chain reads each START (``_chain``), not as a tally here: a tally failed when a
    kill landed between a FRESH and its START, or before the load."""
    assert counts.kills >= kills
    return counts
