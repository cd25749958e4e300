"""Run _pd_worker modes with 2 ranks on 127.0.0.1 (gloo, CPU) and print a verdict per mode.

python tests/distributed/_pd_demo_launch.py [mode ...]      (any Python with paddle; for 3.x use
FLAGS_enable_pir_api=0 /tmp/venv3/bin/python ...)
"""
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from pd_launch import launch  # noqa: E402


def run(mode, steps=20, timeout=90, extra_env=None):
    t0 = time.monotonic()
    res = launch([sys.executable, os.path.join(HERE, "_pd_worker.py"), mode, "--steps", str(steps)],
                 nproc=2, timeout=timeout, extra_env=extra_env)
    wall = time.monotonic() - t0
    if mode == "fleet":
        return {"mode": mode, "wall_s": round(wall, 2), "ops": res[0]["ops"]}
    a, b = sorted(res, key=lambda r: r["rank"])
    first_diff = next((s["step"] for s, t in zip(a["steps"], b["steps"]) if s["digest"] != t["digest"]), None)
    return {"mode": mode, "paddle": a["paddle"], "wall_s": round(wall, 2),
            "worker_s": [r["worker_s"] for r in (a, b)],
            "identical_every_step": first_diff is None, "first_divergent_step": first_diff,
            "found_steps_by_rank": [[s["step"] for s in r["steps"] if s["found"]] for r in (a, b)],
            "final_scale": [r["final_scale"] for r in (a, b)],
            "params_finite_at_end": [r["steps"][-1]["params_finite"] for r in (a, b)],
            "step5": [{k: r["steps"][5][k] for k in ("local_found", "found", "scale", "digest")} for r in (a, b)]}


if __name__ == "__main__":
    for mode in sys.argv[1:] or ["local", "reduced", "implicit"]:
        try:
            print(json.dumps(run(mode)), flush=True)
        except Exception as e:  # one mode failing is a finding, not a crash
            print(json.dumps({"mode": mode, "error": str(e)[-2500:]}), flush=True)
