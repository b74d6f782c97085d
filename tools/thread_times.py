"""Where a model's run spends each thread's time on the CPU device: runs the model on the EP
(after warm runs), then prints, per thread that ran, the time it was running and the time it was
runnable but waiting for a core (the kernel's /proc/self/task/*/schedstat), and its voluntary
and involuntary context switches, all per run. Exact where `perf record`'s samples are not (a
virtual machine's timer-based sampling misses threads). Thread names are the ones their
libraries gave (MLX's stream thread and OpenMP's and OpenBLAS's workers are all `python` when
unnamed: the busiest is usually MLX's stream thread).

    python tools/thread_times.py MODEL.onnx [--dim name=value ...] [--runs 300] [--option key=value ...]
"""
import argparse
import os
import time

import onnxruntime_mlx as om
from onnxruntime_mlx import runner


def snapshot() -> dict:
    threads = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            status = open(f"/proc/self/task/{tid}/status").read()
            sched = open(f"/proc/self/task/{tid}/schedstat").read().split()
        except OSError:  # the thread ended meanwhile
            continue
        field = lambda name: int(status.split(name + ":")[1].split()[0])  # noqa: E731
        threads[tid] = (field("voluntary_ctxt_switches"), field("nonvoluntary_ctxt_switches"),
                        int(sched[0]), int(sched[1]))
    return threads


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model")
    p.add_argument("--dim", action="append", default=[])
    p.add_argument("--runs", type=int, default=300)
    p.add_argument("--option", action="append", default=[])
    a = p.parse_args()
    dims = {k: int(v) for k, v in (d.split("=", 1) for d in a.dim)}
    s = om.InferenceSession(a.model, "cpu", fallback=False, **dict(o.split("=", 1) for o in a.option))
    feeds = runner.random_feeds(s, runner.dims_of(s, {}, dims), 0, {})
    for _ in range(50):
        s.run(None, feeds)
    before, t0 = snapshot(), time.perf_counter()
    for _ in range(a.runs):
        s.run(None, feeds)
    wall = (time.perf_counter() - t0) / a.runs
    after = snapshot()
    print(f"{wall * 1e3:.3f} ms a run ({a.runs} runs); per thread, a run:")
    print("| thread | running ms | waiting for a core ms | voluntary switches | involuntary |")
    print("|---|---:|---:|---:|---:|")
    main_tid = str(os.getpid())
    for tid, b in sorted(after.items(), key=lambda kv: -(kv[1][2] - before.get(kv[0], kv[1])[2])):
        if tid not in before:
            continue
        vol, invol, run_ns, wait_ns = (b[i] - before[tid][i] for i in range(4))
        if run_ns < 0.01 * wall * 1e9 * a.runs and vol + invol < a.runs // 10:
            continue
        name = open(f"/proc/self/task/{tid}/comm").read().strip() + (" (caller)" if tid == main_tid else "")
        print(f"| {tid} {name} | {run_ns / a.runs / 1e6:.3f} | {wait_ns / a.runs / 1e6:.3f} | "
              f"{vol / a.runs:.1f} | {invol / a.runs:.1f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
