"""One model's steady state on the EP in this process: runs it for --seconds (after 20 warm
runs) and prints ms a run, the report's polling counts (cpu_poll) and, with --primitives, the
MLX primitives its last run evaluated (log_level=3). Inputs are random, symbolic dims 1 unless
given. For process-level comparisons (one build or environment per process, alternating),
`perf stat -e task-clock`, `taskset` or `DNNL_VERBOSE=1` around it.

    python tools/run_loop.py MODEL.onnx [--dim name=value ...] [--seconds 3] [--runs N]
        [--option key=value ...] [--primitives] [--device cpu]
"""
import argparse
import gc
import json
import os
import re
import sys
import tempfile
import time

import onnxruntime_mlx as om
from onnxruntime_mlx import runner


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model")
    p.add_argument("--dim", action="append", default=[])
    p.add_argument("--seconds", type=float, default=3.0)
    p.add_argument("--runs", type=int, default=0, help="a fixed number of runs instead of --seconds")
    p.add_argument("--option", action="append", default=[])
    p.add_argument("--primitives", action="store_true")
    p.add_argument("--device", default="cpu")
    a = p.parse_args()
    options = dict(o.split("=", 1) for o in a.option)
    report = os.path.join(tempfile.mkdtemp(), "report.jsonl")
    if a.primitives:
        options["log_level"] = "3"
    log = tempfile.TemporaryFile()
    saved = os.dup(2)
    if a.primitives:  # the EP logs every run's primitives to stderr: kept for the last one
        os.dup2(log.fileno(), 2)
    s = om.InferenceSession(a.model, a.device, fallback=False, report_path=report, **options)
    dims = dict((d.split("=", 1)[0], int(d.split("=", 1)[1])) for d in a.dim)
    feeds = runner.random_feeds(s, runner.dims_of(s, {}, dims), 0, {})
    for _ in range(20):
        s.run(None, feeds)
    n, t0 = 0, time.perf_counter()
    while (n < a.runs) if a.runs else (time.perf_counter() - t0 < a.seconds):
        s.run(None, feeds)
        n += 1
    elapsed = time.perf_counter() - t0
    os.dup2(saved, 2)
    print(f"{n} runs, {elapsed / n * 1e3:.4f} ms a run")
    if a.primitives:
        log.seek(0)
        last = [ln for ln in log.read().decode(errors="replace").splitlines() if " evaluates:" in ln]
        if last:
            counts = dict((k, int(v)) for k, v in re.findall(r" (\w+)=(\d+)", last[-1].split(" evaluates:")[1]))
            print(f"  {sum(counts.values())} primitives in the last run: " +
                  " ".join(f"{k}={v}" for k, v in sorted(counts.items(), key=lambda kv: -kv[1])))
    del s
    gc.collect()  # the session's end writes its statistics
    for line in open(report):
        st = json.loads(line)
        if "fused_node" in st and st.get("runs", 0) > n // 2:
            print(f"  runs {st['runs']}, polled {st['polled_evals']}, after a short one {st['after_short_evals']}, "
                  f"arrays a run {st.get('eval_arrays', 0) / max(st['runs'], 1):.1f}")
            c = max(st.get("compiled_runs", 0), 1)
            print("  a compiled run, µs: " + ", ".join(
                f"{k} {st.get(f, 0) / c / 1e3:.1f}" for k, f in
                (("Compute call", "compute_ns_compiled"), ("inputs", "inputs_ns_compiled"),
                 ("compiled function", "call_ns_compiled"), ("evaluation", "eval_ns_compiled"),
                 ("outputs", "outputs_ns_compiled"))))
        if "process_caller_arrays" in st:
            print(f"  walks (cpu_caller_eval), arrays a run: on the caller {st['process_caller_arrays'] / max(n, 1):.1f}, "
                  f"on the stream thread {st['process_caller_stream_arrays'] / max(n, 1):.1f}, "
                  f"left to MLX {st['process_caller_left'] / max(n, 1):.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
