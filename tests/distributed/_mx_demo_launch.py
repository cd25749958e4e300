"""Run every _mx_worker mode with 2 workers + 1 server on 127.0.0.1 and print a verdict per mode.

python tests/distributed/_mx_demo_launch.py [mode ...] [--devices 2]
"""
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from mx_launch import launch  # noqa: E402


def run(mode, devices=1, steps=20, timeout=90):
    t0 = time.monotonic()
    res = launch([sys.executable, os.path.join(HERE, "_mx_worker.py"), mode, "--steps", str(steps),
                  "--devices", str(devices)], num_workers=2, timeout=timeout)
    wall = time.monotonic() - t0
    res.sort(key=lambda r: r["rank"])
    a, b = res
    first_diff = next((s["step"] for s, t in zip(a["steps"], b["steps"]) if s["digest"] != t["digest"]), None)
    inj = [(r["rank"], [s["step"] for s in r["steps"] if s["skipped"]]) for r in res]
    return {"mode": mode, "devices": devices, "wall_s": round(wall, 2),
            "worker_s": [r["worker_s"] for r in res],
            "identical_every_step": first_diff is None, "first_divergent_step": first_diff,
            "skipped_steps_by_rank": inj,
            "final_scale": [r["final_scale"] for r in res],
            "params_finite_at_end": [r["steps"][-1]["params_finite"] for r in res],
            "step5": [{k: r["steps"][5][k] for k in ("local_found", "found", "skipped", "digest")} for r in res],
            **({"flag_key_after": [r.get("flag_key_after") for r in res]} if mode == "server" else {})}


if __name__ == "__main__":
    args = sys.argv[1:]
    devices = 1
    if "--devices" in args:
        i = args.index("--devices"); devices = int(args[i + 1]); del args[i:i + 2]
    for mode in args or ["local", "implicit", "reduced", "server", "contrib"]:
        try:
            print(json.dumps(run(mode, devices)), flush=True)
        except Exception as e:  # keep going: one mode failing is a finding, not a crash
            print(json.dumps({"mode": mode, "error": str(e)[-1500:]}), flush=True)
