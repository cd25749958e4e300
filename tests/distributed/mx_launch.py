"""Launch an MXNet dist_sync job (scheduler + servers + workers) on 127.0.0.1 only.

Usage:  results = launch([sys.executable, "worker.py", ...], num_workers=2)

Every process gets MXNet's own DMLC environment (DMLC_ROLE, DMLC_PS_ROOT_URI=127.0.0.1,
DMLC_PS_ROOT_PORT=<free ephemeral port>, DMLC_NUM_SERVER, DMLC_NUM_WORKER) plus
DMLC_NODE_HOST=127.0.0.1 / DMLC_INTERFACE=lo so ps-lite never looks up another interface.
Scheduler and servers are `python -c "import mxnet"`: importing mxnet with DMLC_ROLE in
{scheduler, server} runs the server loop and exits when the workers finalize.
Each worker writes one JSON object to the file named by $AMP_DIST_OUT; launch() returns
those objects ordered by worker index (env AMP_DIST_WORKER, 0..n-1; ps-lite's own rank
may differ, the worker reports kv.rank itself). Every process runs in its own process
group and is killed (SIGTERM, then SIGKILL) on timeout, on error and at exit.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from procs import (LOOPBACK, LaunchError, LaunchTimeout, free_ports, kill_groups,  # noqa: E402
                   log_tails, raise_on_sigterm)


def base_env(role: str, port: int, num_workers: int, num_servers: int) -> dict:
    env = dict(os.environ)
    env.update({
        "DMLC_ROLE": role,
        "DMLC_PS_ROOT_URI": LOOPBACK,
        "DMLC_PS_ROOT_PORT": str(port),
        "DMLC_NUM_SERVER": str(num_servers),
        "DMLC_NUM_WORKER": str(num_workers),
        "DMLC_NODE_HOST": LOOPBACK,     # this node's own address: never auto-detect
        "DMLC_INTERFACE": "lo",
        # modest CPU: the machine is shared
        "OMP_NUM_THREADS": "1",
        "MXNET_CPU_WORKER_NTHREADS": "1",
        "MXNET_KVSTORE_REDUCTION_NTHREADS": "1",
        "MXNET_ENGINE_TYPE": env.get("MXNET_ENGINE_TYPE", "ThreadedEnginePerDevice"),
        "PYTHONUNBUFFERED": "1",
    })
    return env


def launch(worker_argv, num_workers=2, num_servers=1, timeout=90.0, extra_env=None,
           python=sys.executable, keep_logs=False, retries=0):
    """launch_once(), retried `retries` more times (fresh port, fresh processes) on a TIMEOUT only.

    Rarely (2 of ~50 jobs, only seen while the machine was loaded) a job hung with nothing in
    any log; a worker can arm faulthandler.dump_traceback_later() to show where (the research
    prototype, tests/distributed/_mx_worker.py in git history, did). A worker that fails is
    never retried.
    """
    for attempt in range(retries + 1):
        try:
            return launch_once(worker_argv, num_workers, num_servers, timeout, extra_env,
                               python, keep_logs)
        except LaunchTimeout as e:
            if attempt == retries:
                raise
            print(f"mx_launch: retrying after {e}", file=sys.stderr, flush=True)


def launch_once(worker_argv, num_workers=2, num_servers=1, timeout=90.0, extra_env=None,
                python=sys.executable, keep_logs=False):
    """Run one dist_sync job; return the workers' JSON results (list, by worker index).

    Raises LaunchError (with every process's log tail) if a worker fails or the job
    exceeds `timeout` seconds. All processes are gone when this returns or raises.
    """
    raise_on_sigterm()
    tmp = tempfile.mkdtemp(prefix="mxdist_")
    (port,) = free_ports(1)
    procs, logs, outs = [], [], []

    def start(role, argv, idx=None):
        env = base_env(role, port, num_workers, num_servers)
        env.update(extra_env or {})
        name = role if idx is None else f"{role}{idx}"
        if role == "worker":
            out = os.path.join(tmp, f"{name}.json")
            env["AMP_DIST_OUT"] = out
            env["AMP_DIST_WORKER"] = str(idx)
            outs.append(out)
        log = open(os.path.join(tmp, f"{name}.log"), "w+b")
        logs.append((name, log))
        procs.append(subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT,
                                      stdin=subprocess.DEVNULL, start_new_session=True))
        return procs[-1]

    t0 = time.monotonic()
    try:
        start("scheduler", [python, "-c", "import mxnet"])
        for i in range(num_servers):
            start("server", [python, "-c", "import mxnet"], i)
        workers = [start("worker", list(worker_argv), i) for i in range(num_workers)]
        deadline = t0 + timeout
        while True:
            codes = [w.poll() for w in workers]
            if any(c not in (None, 0) for c in codes):
                raise LaunchError(f"worker exited with {codes}\n" + log_tails(logs))
            if all(c == 0 for c in codes):
                break
            if time.monotonic() > deadline:
                raise LaunchTimeout(f"timeout after {timeout}s\n" + log_tails(logs))
            time.sleep(0.05)
        # servers/scheduler exit by themselves after the workers finalize; give them a moment
        for p in procs[: 1 + num_servers]:
            try:
                p.wait(5.0)
            except subprocess.TimeoutExpired:
                pass
        results = []
        for out in outs:
            with open(out) as f:
                results.append(json.load(f))
        for r in results:
            r.setdefault("wall_s", time.monotonic() - t0)
        return results
    finally:
        kill_groups(procs)
        for _, log in logs:
            log.close()
        if not keep_logs:
            import shutil
            shutil.rmtree(tmp, ignore_errors=True)
