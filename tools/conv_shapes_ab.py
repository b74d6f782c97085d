#!/usr/bin/env python3
"""One CNN's convolutions shape by shape, the EP's against ORT's CPU EP's, in the same minutes.

One process holds both sessions and alternates rounds: the EP's runs with oneDNN's verbose mode
switched on at run time (`dnnl_set_verbose`, in the library the EP loaded: each convolution's
execution time, printed to stdout, which is sent to a file meanwhile), then ORT's runs with its
profiler on (each Conv node's kernel time). A round starts with a few untimed runs of its
session: ORT's pool threads spin for a while after its runs, and the EP's first runs after them
are slowed. Prints each session's ms a run per round, both EPs' other ops' time a run, and the
convolutions by shape (input channels, output channels, input size, output size, kernel), worst
first (the EP's time a run over ORT's).

    LD_LIBRARY_PATH=build python3 tools/conv_shapes_ab.py MODEL [--runs 30] [--rounds 3] [--shape 1x3x224x224] [--top 12]
"""
import argparse
import collections
import ctypes
import json
import os
import re
import sys
import tempfile
import time

import numpy as np
import onnxruntime as ort

import onnxruntime_mlx as om


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--shape", default="1x3x224x224")
    ap.add_argument("--top", type=int, default=12)
    args = ap.parse_args()
    so = ort.SessionOptions()
    so.enable_profiling = True
    cpu = ort.InferenceSession(args.model, so, providers=["CPUExecutionProvider"])
    mlx = om.InferenceSession(args.model, "cpu", fallback=False)
    name = cpu.get_inputs()[0].name
    feeds = {name: np.random.default_rng(0).standard_normal([int(v) for v in args.shape.split("x")]).astype(np.float32)}
    warm = 10
    for _ in range(20):
        cpu.run(None, feeds)
        mlx.run(None, feeds)
    dnnl = ctypes.CDLL("libdnnl.so.2")  # (the library the EP loaded: one instance a process)
    log = tempfile.NamedTemporaryFile(delete=False)
    stdout = os.dup(1)
    per_round = collections.defaultdict(list)
    for _ in range(args.rounds):
        for _ in range(warm):
            mlx.run(None, feeds)
        sys.stdout.flush()
        os.dup2(log.fileno(), 1)
        dnnl.dnnl_set_verbose(2)
        t0 = time.perf_counter()
        for _ in range(args.runs):
            mlx.run(None, feeds)
        per_round["EP (verbose)"].append((time.perf_counter() - t0) / args.runs * 1e3)
        dnnl.dnnl_set_verbose(0)
        os.dup2(stdout, 1)
        for _ in range(warm):
            cpu.run(None, feeds)
        t0 = time.perf_counter()
        for _ in range(args.runs):
            cpu.run(None, feeds)
        per_round["ORT (profiled)"].append((time.perf_counter() - t0) / args.runs * 1e3)
    print("ms a run by round:", {k: [round(v, 2) for v in vs] for k, vs in per_round.items()})
    runs_ort = 20 + args.rounds * (warm + args.runs)
    prof = cpu.end_profiling()
    with open(prof) as f:
        events = json.load(f)
    os.remove(prof)
    ort_conv, ort_ops = collections.defaultdict(list), collections.defaultdict(float)
    for e in events:
        if e.get("cat") != "Node" or not e["name"].endswith("_kernel_time"):
            continue
        a = e["args"]
        ort_ops[a.get("op_name")] += e["dur"] / runs_ort
        if a.get("op_name") == "Conv":
            x, w = (list(d.values())[0] for d in a["input_type_shape"][:2])
            y = list(a["output_type_shape"][0].values())[0]
            ort_conv[(x[1], y[1], x[2], y[2], w[2])].append(e["dur"])
    ep_conv, ep_other = collections.defaultdict(list), collections.defaultdict(float)
    with open(log.name) as f:
        for line in f:
            if ",exec," not in line:
                continue
            fields = line.strip().split(",")
            us = float(fields[-1]) * 1e3
            m = re.search(r"ic(\d+)oc(\d+)_ih(\d+)oh(\d+)kh(\d+)", fields[-2]) if ",convolution," in line else None
            if m:
                ep_conv[tuple(int(v) for v in m.groups())].append(us)
            else:
                ep_other[fields[3]] += us / (args.rounds * args.runs)
    os.remove(log.name)
    print("ORT's ops, us a run:", {k: round(v) for k, v in sorted(ort_ops.items(), key=lambda t: -t[1])})
    print("oneDNN's other primitives on the EP, us a run:", {k: round(v) for k, v in ep_other.items()})
    rows = []
    for k in set(ep_conv) | set(ort_conv):
        a = float(np.median(ep_conv[k])) * len(ep_conv[k]) / (args.rounds * args.runs) if ep_conv[k] else 0.0
        b = float(np.median(ort_conv[k])) * len(ort_conv[k]) / runs_ort if ort_conv[k] else 0.0
        rows.append((a - b, k, a, b))
    print(f"convolutions, us a run: EP {sum(r[2] for r in rows):.0f}, ORT's CPU EP {sum(r[3] for r in rows):.0f}"
          " (a shape ORT pads, e.g. 1000 -> 1008 channels, is listed under each)")
    for d, k, a, b in sorted(rows, reverse=True)[:args.top]:
        print(f"  {str(k):28s} EP {a:8.1f}  ORT {b:8.1f}  EP - ORT {d:+7.1f}")


if __name__ == "__main__":
    main()
