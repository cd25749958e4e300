"""Launch N Paddle static-graph data-parallel workers on CPU (gloo) on 127.0.0.1 only.

Usage:  results = launch([sys.executable, "/abs/path/WORKER.py", ...], nproc=2)
(the worker used by the tests: tests/paddle/paddle_dist_worker.py)

Sets what `python -m paddle.distributed.launch` would set for a collective job
(PADDLE_TRAINER_ID, PADDLE_TRAINERS_NUM, PADDLE_TRAINER_ENDPOINTS, PADDLE_CURRENT_ENDPOINT,
PADDLE_DISTRI_BACKEND=gloo, PADDLE_RANK_IN_NODE, PADDLE_LOCAL_DEVICE_IDS), every endpoint on
127.0.0.1 with a free ephemeral port, plus AMP_GLOO_HTTP (gloo's HTTP rendezvous store, served
on 127.0.0.1 by a thread of this launcher) and
AMP_DIST_OUT (one JSON result file per rank). Workers run in the job's temporary directory (so
nothing they write, e.g. paddle's http.log, lands in the repository), each in its own process
group, and are killed (SIGTERM, then SIGKILL) on timeout, on error and on return; the directory
is removed afterwards.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _gloo_kv import GlooRendezvous  # noqa: E402
from procs import (LOOPBACK, LaunchError, LaunchTimeout, free_ports, kill_groups,  # noqa: E402
                   log_tails, raise_on_sigterm)


def worker_env(rank, nproc, endpoints, tmp, gloo_http, extra_env=None):
    env = dict(os.environ)
    env.update({
        "PADDLE_TRAINER_ID": str(rank),
        "PADDLE_TRAINERS_NUM": str(nproc),
        "PADDLE_TRAINER_ENDPOINTS": ",".join(endpoints),
        "PADDLE_CURRENT_ENDPOINT": endpoints[rank],
        "PADDLE_DISTRI_BACKEND": "gloo",
        "PADDLE_RANK_IN_NODE": str(rank),
        "PADDLE_LOCAL_DEVICE_IDS": "",
        "PADDLE_WORLD_DEVICE_IDS": "",
        "AMP_GLOO_HTTP": gloo_http,                 # paddle 2.6 gloo rendezvous (HTTP store)
        "PADDLE_MASTER": endpoints[0],              # paddle 3.x TCPStore (rank 0 serves it)
        "GLOO_SOCKET_IFNAME": "lo",                 # paddle 3.x gloo pairs on loopback
        "AMP_DIST_OUT": os.path.join(tmp, f"rank{rank}.json"),
        "OMP_NUM_THREADS": "1",
        "CPU_NUM": "1",
        "GLOG_v": "0",
        "GLOG_minloglevel": "2",           # gloo/paddle INFO lines otherwise flood the logs
        "PYTHONUNBUFFERED": "1",
    })
    env.update(extra_env or {})
    return env


def launch(worker_argv, nproc=2, timeout=90.0, extra_env=None, keep_logs=False, cwd=None):
    """Run one job; return the ranks' JSON results (list by rank). Raises LaunchError.

    The workers' working directory is ``cwd``, by default the job's temporary directory
    (give the worker script as an absolute path)."""
    raise_on_sigterm()
    tmp = tempfile.mkdtemp(prefix="pddist_")
    endpoints = [f"{LOOPBACK}:{p}" for p in free_ports(nproc)]
    procs, logs = [], []
    t0 = time.monotonic()
    store = GlooRendezvous()
    try:
        for r in range(nproc):
            log = open(os.path.join(tmp, f"rank{r}.log"), "w+b")
            logs.append((f"rank{r}", log))
            procs.append(subprocess.Popen(list(worker_argv), env=worker_env(r, nproc, endpoints, tmp, store.endpoint, extra_env),
                                          stdout=log, stderr=subprocess.STDOUT, cwd=cwd or tmp,
                                          stdin=subprocess.DEVNULL, start_new_session=True))
        while True:
            codes = [p.poll() for p in procs]
            if any(c not in (None, 0) for c in codes):
                raise LaunchError(f"worker exited with {codes}\n" + log_tails(logs))
            if all(c == 0 for c in codes):
                break
            if time.monotonic() - t0 > timeout:
                raise LaunchTimeout(f"timeout after {timeout}s\n" + log_tails(logs))
            time.sleep(0.05)
        out = []
        for r in range(nproc):
            with open(os.path.join(tmp, f"rank{r}.json")) as f:
                out.append(json.load(f))
        return out
    finally:
        kill_groups(procs)
        store.close()
        for _, log in logs:
            log.close()
        if not keep_logs:
            shutil.rmtree(tmp, ignore_errors=True)
