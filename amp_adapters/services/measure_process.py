"""Measurements in a child process: timing an op leaves the process that plans as it was.

Timing an op allocates its operands at a model's sizes (a 2048x2048 GEMM: 16 MB arrays)
and frees them, and that changes where the model's own arrays land afterwards. Measured
on MXNet 1.9.1 (oneDNN limited to AVX512_CORE): an MLP 4x2048 whose training step was
planned after a measurement in the same process ran at 1.4x of float32 in about a third
of the processes (its optimizer update, ``multi_sgd_update`` over gradients placed in
memory the measurement had freed, took 59 ms in place of 21 ms), and at 1.00x in every
process that read the answer from the cache. So a backend's measurement runs here, in a
child process: one per environment, started at the first measurement and kept until
this process exits (the parent waits for each answer: nothing of it runs meanwhile).

``call(server, fn, *args)`` runs ``fn(*args)`` there and returns its result; arguments
and results are JSON values, or a ``Cost`` (sent as its fields). ``server`` is the
backend's child module (``mxnet_amp.speed_child``, ``paddle_amp.speed_child``), run as
``python -m server`` with this process's ``sys.path`` and environment (so the same
oneDNN ISA limits and thread settings); it hands the functions it serves to ``serve``,
which reads a JSON request per line and answers one per line on a private descriptor
(what a framework prints goes to stderr).

Two kinds of failure, told apart because only one is an answer about the op:

- a call that raises there (the framework refused the op) raises ``MeasureError`` here
  with the exception's type and message: the op's answer ("no kernel");
- a child that crashed (``CRASHES``: a kernel that aborts or segfaults) raises
  ``MeasureError`` too, naming its signal and the last line it printed: the op's answer
  as well (retried, it would crash again and again);
- a failure of the measuring itself raises ``ChildFailed`` (a ``MeasureError`` and a
  ``speedbook.MeasuringFailed``): the child was killed (the kernel's OOM killer), ended
  otherwise, did not answer in ``ANSWER_TIMEOUT_S`` (it is ended), or could not start
  (``Popen`` failed: no memory, no processes left). The speed book keeps that as no
  measurement, retried later. The next call starts another child.

A process that has no Python to start one (no ``sys.executable``) warns once and calls
``fn`` in itself.
"""
from __future__ import annotations

import atexit
import json
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
from typing import Any, Callable, Mapping

from ..rules.device import Cost
from ..rules.isa import onednn_env
from .speedbook import TIMING_ENV, MeasuringFailed, warn_once

ANSWER_TIMEOUT_S = 600.0  # one call: an import and a timing budget take seconds; a hang ends


# the signals of a child the measured op crashed (not the OOM killer's SIGKILL)
CRASHES = frozenset({signal.SIGABRT, signal.SIGSEGV, signal.SIGILL, signal.SIGFPE,
                     signal.SIGBUS})


class MeasureError(RuntimeError):
    """A measurement failed in the child process: its exception (the op's answer), or, as
    ``ChildFailed``, the child itself."""


class ChildFailed(MeasureError, MeasuringFailed):
    """The measuring child died, did not answer in time, or could not start: a failure of
    the measuring, not of the op (``speedbook.MeasuringFailed``)."""


def _encode(value: Any) -> Any:
    if isinstance(value, Cost):
        return {"cost": value.to_dict()}  # the fields a profile file keeps, as it keeps them
    return {"value": value}


def _decode(answer: Mapping[str, Any]) -> Any:
    if "error" in answer:
        raise MeasureError(answer["error"])
    if "cost" in answer:
        return Cost(**answer["cost"])
    return answer["value"]


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return str(number)


class _Child:
    """One child process and its pipes; ``ask`` sends a request and waits for its answer
    (a reader thread hands the child's lines over, so a wait can time out on every OS)."""

    def __init__(self, server: str, env: Mapping[str, str]):
        self.stderr = tempfile.TemporaryFile()
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", server], env=dict(env),
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr)
        except (OSError, ValueError, subprocess.SubprocessError) as e:
            self.stderr.close()
            raise ChildFailed(f"the measuring process could not start ({type(e).__name__}: "
                              f"{e})") from None
        self.lines: "queue.Queue[bytes]" = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self.timed_out = False

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(b"")  # end of output: the child is gone

    def ask(self, request: dict) -> dict:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(json.dumps(request).encode() + b"\n")
            self.proc.stdin.flush()
        except OSError:
            pass  # it died: the read below says how
        try:
            line = self.lines.get(timeout=ANSWER_TIMEOUT_S)
        except queue.Empty:
            self.timed_out, line = True, b""
            self.proc.kill()
        if not line:
            how = self._death()
            if not self.timed_out and -self.proc.returncode in CRASHES:
                raise MeasureError(how)  # the op crashed it: an answer
            raise ChildFailed(how)
        return json.loads(line)

    def _death(self) -> str:
        code = self.proc.wait()
        if self.timed_out:
            return f"the measuring process did not answer in {ANSWER_TIMEOUT_S:g} s"
        how = f"signal {_signal_name(-code)}" if code < 0 else f"exit code {code}"
        self.stderr.seek(0)
        lines = [ln for ln in self.stderr.read().decode(errors="replace").splitlines()
                 if ln.strip()]
        said = f": {lines[-1].strip()[:200]}" if lines else ""
        return f"the measuring process ended ({how}){said}"

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.close()
                self.proc.wait(timeout=5)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
        self.stderr.close()


_children: dict[tuple, _Child] = {}
_lock = threading.Lock()
serving = False  # this process is a measuring child (``serve``): it asks no child of its own


def child_env() -> dict:
    """This environment, with this process's ``sys.path`` (the child imports what we do) and
    the oneDNN limits of the simulated CPU class (``isa.onednn_env``)."""
    path = [os.path.abspath(p or os.curdir) for p in sys.path]
    return {**os.environ, **onednn_env(), "PYTHONPATH": os.pathsep.join(dict.fromkeys(path))}


def call(server: str, fn: Callable, *args: Any) -> Any:
    """``fn(*args)`` in this process's child ``server`` (a module that ``serve``s ``fn``),
    started now if there is none for the oneDNN ISA limits and thread settings in
    ``os.environ`` now; its result (``MeasureError``: it raised there; ``ChildFailed``:
    the child died, did not answer, or could not start). Blocks until the answer (host
    syncs: the child's)."""
    # a child per what changes a timing (``speedbook.TIMING_ENV``), not per variable
    timing = {**os.environ, **onednn_env()}  # the simulated CPU class's limits included
    key = (os.getpid(), server, tuple(timing.get(k) for k in TIMING_ENV))
    with _lock:
        child = _children.get(key)
        if child is not None and child.proc.poll() is not None:
            child.close()
            child = None
        if child is None:
            if not sys.executable:
                warn_once("measure_process", "amp_adapters: no Python executable to start a "
                          "measuring process (sys.executable is empty): measuring in this "
                          "process")
                return fn(*args)
            child = _children[key] = _Child(server, child_env())
        return _decode(child.ask({"fn": fn.__name__, "args": list(args)}))


@atexit.register
def close_all() -> None:
    """End every measuring child of this process (at exit; a test may call it)."""
    with _lock:
        for key, child in list(_children.items()):
            if key[0] == os.getpid():
                child.close()
            del _children[key]


def serve(*functions: Callable) -> None:
    """A child's loop (a server module's ``__main__``): answer each request for one of
    ``functions`` (by name) on the original stdout, which nothing else writes to (what
    the framework prints goes to stderr), until stdin ends (the parent closed it, or
    died)."""
    global serving
    serving = True
    served = {f.__name__: f for f in functions}
    answers = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    for line in sys.stdin:
        request = json.loads(line)
        try:
            answer = _encode(served[request["fn"]](*request["args"]))
        except Exception as e:  # noqa: BLE001 - sent to the parent, which raises it
            answer = {"error": f"{type(e).__name__}: {e}"}
        answers.write(json.dumps(answer) + "\n")
