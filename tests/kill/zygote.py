"""Fork server for the kill test: import the worker (and its framework) once, fork a fresh
process for each run, so that dozens of kill-and-resume runs fit in a test.

``python zygote.py WORKER.py``; reads ``FIFO ERRFILE DIR N`` lines on stdin; for
each forks a child in its own session that writes the worker's output to the
FIFO (stderr to ERRFILE) and runs ``worker.main(DIR, N)``; prints ``PID <pid>``,
then ``EXIT <status>`` (negative: killed by that signal) when the child ends.
Nothing runs in the framework before a fork: each child builds its model,
loads its checkpoint and trains from scratch, as a newly started process would.
"""
import importlib.util
import os
import sys
import traceback


def main(worker_path):
    spec = importlib.util.spec_from_file_location("ckpt_worker", worker_path)
    worker = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(worker)
    print("READY", flush=True)
    for line in sys.stdin:
        fifo, errfile, folder, n = line.split()
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                os.setsid()
                err = os.open(errfile, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
                os.dup2(err, 2)
                out = os.open(fifo, os.O_WRONLY)
                os.dup2(out, 1)
                sys.stdout = os.fdopen(1, "w", buffering=1)
                sys.stderr = os.fdopen(2, "w", buffering=1)
                worker.main(folder, int(n))
                sys.stdout.flush()
            except BaseException:
                traceback.print_exc()
                code = 1
            finally:
                os._exit(code)
        print("PID", pid, flush=True)
        _, status = os.waitpid(pid, 0)
        code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        print("EXIT", code, flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
