"""A session's first runs on the CPU device, as `scripts/demo` meets them: each process creates
ORT's CPU EP session (the demo's baseline) and the MLX EP's session of one model, runs the
first once, then times the MLX session's first RUNS runs one by one. Settings alternate over
fresh processes; per setting and round it prints the median of runs 1-20, how many of runs
1-30 took over twice the last 20 runs' median, and that median (the steady state).

    python3 tools/early_runs.py MODEL [--dim name=value ...] --env-a K=V --env-b K=V [--rounds 3]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

CHILD = r"""
import json, sys, time, numpy as np, onnxruntime as ort, onnxruntime_mlx as om
model, dims, runs = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
cpu = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
mlx = ort.InferenceSession(model, sess_options=om.session_options("cpu", fallback=False))
rng = np.random.default_rng(0)
kinds = {"tensor(float)": np.float32, "tensor(int64)": np.int64, "tensor(int32)": np.int32}
feeds = {}
for i in mlx.get_inputs():
    shape = [d if isinstance(d, int) else dims.get(d, 1) for d in i.shape]
    feeds[i.name] = rng.standard_normal(shape).astype(kinds.get(i.type, np.float32))
cpu.run(None, feeds)
times = []
for _ in range(runs):
    t0 = time.perf_counter()
    mlx.run(None, feeds)
    times.append((time.perf_counter() - t0) * 1e3)
print(json.dumps(times))
"""


def median(v: list[float]) -> float:
    s = sorted(v)
    return s[len(s) // 2] if len(s) % 2 else (s[len(s) // 2 - 1] + s[len(s) // 2]) / 2


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--dim", action="append", default=[], help="name=value for a symbolic input dim")
    ap.add_argument("--env-a", action="append", default=[], help="KEY=VALUE for setting A")
    ap.add_argument("--env-b", action="append", default=[], help="KEY=VALUE for setting B")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--runs", type=int, default=60)
    args = ap.parse_args()
    dims = {k: int(v) for k, v in (d.split("=", 1) for d in args.dim)}
    settings = {"A": dict(e.split("=", 1) for e in args.env_a), "B": dict(e.split("=", 1) for e in args.env_b)}
    print("| round | setting | median of runs 1-20 (ms) | runs 1-30 over 2x steady | steady (last 20, ms) |")
    print("|---:|---|---:|---:|---:|")
    for r in range(args.rounds):
        for name, extra in settings.items():
            env = dict(os.environ, **extra)
            out = subprocess.run([sys.executable, "-c", CHILD, args.model, json.dumps(dims), str(args.runs)],
                                 capture_output=True, text=True, env=env, check=True)
            t = json.loads(out.stdout.strip().splitlines()[-1])
            steady = median(t[-20:])
            slow = sum(v > 2 * steady for v in t[:30])
            label = " ".join(f"{k}={v}" for k, v in extra.items()) or "-"
            print(f"| {r + 1} | {name} {label} | {median(t[:20]):.2f} | {slow} | {steady:.2f} |")


if __name__ == "__main__":
    main()
