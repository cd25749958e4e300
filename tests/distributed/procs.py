"""Process plumbing shared by the loopback launchers (mx_launch.py, pd_launch.py).

Every address is 127.0.0.1; every child runs in its own process group, which is
killed (SIGTERM, then SIGKILL) on timeout, on error and at exit.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

LOOPBACK = "127.0.0.1"


class LaunchError(RuntimeError):
    """A worker failed; the message carries every process's log tail."""


class LaunchTimeout(LaunchError):
    """The job did not finish in time (the only failure a launcher may retry)."""


def free_ports(n: int) -> list[int]:
    """``n`` distinct ephemeral TCP ports free on 127.0.0.1 right now (a small race remains
    until the processes bind them)."""
    socks, ports = [], []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((LOOPBACK, 0))
            socks.append(s)
            ports.append(s.getsockname()[1])
    finally:
        for s in socks:
            s.close()
    return ports


def raise_on_sigterm() -> None:
    """SIGTERM -> SystemExit in the main thread, so a launcher's `finally` still kills the
    process groups it started (each child has its own session, so nobody else would)."""
    import threading
    if threading.current_thread() is threading.main_thread() and \
            signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))


def kill_groups(procs, grace: float = 3.0) -> None:
    """SIGTERM every still-running child's process group, SIGKILL it after ``grace`` s."""
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + grace
    for p in procs:
        try:
            p.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()


def log_tails(logs, n: int = 3000) -> str:
    """The last ``n`` characters of each (name, binary log file) pair, for an error message."""
    parts = []
    for name, log in logs:
        log.flush()
        log.seek(0)
        parts.append(f"--- {name} ---\n" + log.read().decode(errors="replace")[-n:])
    return "\n".join(parts)
