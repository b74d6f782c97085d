"""A/B of two builds of the EP library on the same models: each round runs every model once
with library A and once with B (alternating, each in a fresh process: one process can register
only one library under the EP's name) and prints the per-round medians of run latency and the
B/A ratio of their medians.

    python tools/ab_library.py --a OLD.so --b NEW.so MODEL.onnx... [--rounds 5] [--runs 500]
        [--device cpu] [--dim name=value]
    python tools/ab_library.py --env-a OMP_WAIT_POLICY=PASSIVE --env-b GOMP_SPINCOUNT=5000 MODEL.onnx...

`--b cpu-ep` runs ORT's CPU EP on the B side (each EP in its own processes, so neither one's
spinning threads run during the other's runs). `--shape 1x3x48x192`: one float32 input of that
shape (models whose dims have no names).
--env-a / --env-b (KEY=VALUE, repeatable; KEY= removes KEY) set each side's environment: settings
read once a process, such as the OpenMP runtime's, compared with one library ($ORT_MLX_EP_LIBRARY
unless --a / --b name one).

Used for changes whose cost should be nil when unused, e.g. the trace spans with tracing off.
A copy of the library loads oneDNN from its own folder: put libdnnl.so.2 and libOpenCL.so.1 (links
to build/'s) beside each copy, or its convolutions run as MLX's own."""
import argparse
import json
import os
import statistics
import subprocess
import sys

WORKER = r"""
import json, sys, time
import numpy as np
import onnxruntime_mlx as om
from onnxruntime_mlx import runner
model, device, runs, dims, shape = sys.argv[1], sys.argv[2], int(sys.argv[3]), json.loads(sys.argv[4]), sys.argv[5]
if sys.argv[6] == "cpu-ep":
    import onnxruntime as ort
    s = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
else:
    s = om.InferenceSession(model, device, fallback=False)
if shape:  # one float32 input of this shape
    feeds = {s.get_inputs()[0].name: np.random.default_rng(0).standard_normal(
        [int(v) for v in shape.split("x")]).astype(np.float32)}
else:
    feeds = runner.random_feeds(s, runner.dims_of(s, {}, dims), 0, {})
for _ in range(20):
    s.run(None, feeds)
t = []
for _ in range(runs):
    t0 = time.perf_counter()
    s.run(None, feeds)
    t.append(time.perf_counter() - t0)
print(json.dumps({"median_us": sorted(t)[len(t) // 2] * 1e6}))
"""


def one(lib, model, device, runs, dims, extra_env=(), shape=""):
    env = dict(os.environ)
    if lib != "cpu-ep":
        env["ORT_MLX_EP_LIBRARY"] = lib
    for kv in extra_env:
        key, value = kv.split("=", 1)
        if value:
            env[key] = value
        else:
            env.pop(key, None)
    r = subprocess.run([sys.executable, "-c", WORKER, model, device, str(runs), json.dumps(dims), shape,
                        "cpu-ep" if lib == "cpu-ep" else "ep"],
                       env=env, capture_output=True, text=True, check=True)
    return json.loads(r.stdout.strip().splitlines()[-1])["median_us"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--a", default=os.environ.get("ORT_MLX_EP_LIBRARY"))
    ap.add_argument("--b", default=os.environ.get("ORT_MLX_EP_LIBRARY"))
    ap.add_argument("--env-a", action="append", default=[])
    ap.add_argument("--env-b", action="append", default=[])
    ap.add_argument("models", nargs="+")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--runs", type=int, default=500)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dim", action="append", default=[])
    ap.add_argument("--shape", default="", help="one float32 input of this shape, e.g. 1x3x48x192")
    args = ap.parse_args()
    if not args.a or not args.b:
        ap.error("name the libraries (--a, --b) or set ORT_MLX_EP_LIBRARY")
    # The EP loads oneDNN from its own folder first: a build copied elsewhere without it runs
    # every convolution through MLX's own, and the A/B compares that instead.
    for lib in {args.a, args.b} - {"cpu-ep"}:
        folder = os.path.dirname(os.path.abspath(lib))
        if not os.path.exists(os.path.join(folder, "libdnnl.so.2")):
            print(f"warning: no libdnnl.so.2 beside {lib}: copy the build's libdnnl.so.2 and libOpenCL.so.1 "
                  "there, or its convolutions are MLX's", file=sys.stderr)
    dims = {k: int(v) for k, v in (d.split("=") for d in args.dim)}
    print(f"| model | A median µs (per round) | B median µs (per round) | B/A |")
    print("|---|---|---|---:|")
    for model in args.models:
        a, b = [], []
        for _ in range(args.rounds):
            a.append(one(args.a, model, args.device, args.runs, dims, args.env_a, args.shape))
            b.append(one(args.b, model, args.device, args.runs, dims, args.env_b, args.shape))
        ratio = statistics.median(b) / statistics.median(a)
        print(f"| {os.path.basename(model)} | {', '.join(f'{x:.1f}' for x in a)} | "
              f"{', '.join(f'{x:.1f}' for x in b)} | {ratio:.3f} |")


if __name__ == "__main__":
    main()
