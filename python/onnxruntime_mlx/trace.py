"""`python -m onnxruntime_mlx trace MODEL`: run a model on the MLX EP with the EP's trace on
(ORT_MLX_TRACE) and summarize it.

The trace is Chrome's trace-event JSON: open it in Perfetto (ui.perfetto.dev, "Open trace file")
or chrome://tracing. It holds a span per fused-node run (with the path the run took: compiled,
a new compile trace, a shape family's segments, eager), the phases inside it (reading inputs,
building the MLX graph, evaluation, host reads, writing outputs), one span per ONNX node while
its graph is built (shapes, dtypes, bytes), and MLX's memory (active, peak, cache) as counter
tracks. With --profile-ops every node is evaluated on its own and timed (provider option
profile_ops=1: no compile, no fusion across nodes, so slower; for finding slow nodes). When the
session ends the EP writes the file and prints the slowest ONNX nodes to stderr.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import pathlib
import statistics
import sys
import time
from collections import Counter, defaultdict

import onnxruntime_mlx as om


def summarize(path: str | os.PathLike) -> dict:
    """Per-phase time, run paths and counters of a trace file written by the EP."""
    with open(path) as f:
        doc = json.load(f)
    events = doc["traceEvents"]
    phases: dict[str, list[float]] = defaultdict(list)
    paths: Counter = Counter()
    runs: list[float] = []
    counters: dict[str, float] = {}
    summary = ""
    for e in events:
        if e.get("ph") == "X" and e.get("cat") == "phase":
            phases[e["name"]].append(e["dur"])
        elif e.get("ph") == "X" and e.get("cat") == "fused_node":
            runs.append(e["dur"])
            paths[e["args"].get("path", "?")] += 1
        elif e.get("ph") == "C":
            counters[e["name"]] = max(counters.get(e["name"], 0), e["args"]["value"])
        elif e.get("ph") == "M" and e.get("name") == "slowest_ops":
            summary = e["args"]["summary"]
    return {"events": len(events), "phases": dict(phases), "paths": dict(paths), "runs": runs,
            "max_counters": counters, "slowest_ops": summary}


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("model", help="an .onnx model, or a directory holding model.onnx")
    ap.add_argument("--out", default="mlx_trace.json", help="the trace file (default mlx_trace.json)")
    ap.add_argument("--runs", type=int, default=5, help="runs of the model (default 5)")
    ap.add_argument("--dim", action="append", metavar="NAME=VALUE",
                    help="value of a symbolic input dim (repeatable; unnamed/unset dims are 1)")
    ap.add_argument("--input", action="append", metavar="NAME=FILE.npy|VALUE",
                    help="an input's value (repeatable); inputs not given are random")
    ap.add_argument("--device", choices=["auto", "cpu", "gpu"], default="auto",
                    help="MLX device (default: MLX's GPU when there is one)")
    ap.add_argument("--profile-ops", action="store_true",
                    help="evaluate and time every ONNX node on its own (slower; no fusion)")
    ap.add_argument("--option", action="append", metavar="KEY=VALUE", default=[],
                    help="extra MLX EP provider option (repeatable), e.g. compile=0")


def run(args: argparse.Namespace) -> int:
    from onnxruntime_mlx import runner
    if args.runs < 1:
        raise om.UsageError("--runs must be >= 1")
    opts = runner.parse_options(args.option)
    if args.profile_ops:
        opts["profile_ops"] = "1"
    out = pathlib.Path(args.out).resolve()
    if om._registered:  # the EP reads ORT_MLX_TRACE when the library is registered
        raise om.UsageError("the MLX EP is already registered in this process: set "
                            "ORT_MLX_TRACE before registering it instead")
    os.environ["ORT_MLX_TRACE"] = str(out)
    path = runner.resolve_model(args.model)
    session = om.InferenceSession(str(path), args.device, **opts)
    given = runner.load_inputs(session, runner.parse_inputs(args.input))
    feeds = runner.random_feeds(session, runner.dims_of(session, given, runner.parse_dims(args.dim)),
                                0, given)
    times = []
    for _ in range(args.runs):
        t0 = time.perf_counter()
        session.run(None, feeds)
        times.append(time.perf_counter() - t0)
    del session  # the EP writes the trace as its session ends
    gc.collect()
    sys.stderr.flush()
    s = summarize(out)
    print(f"trace      {out}  ({s['events']} events; open it in Perfetto or chrome://tracing)")
    print(f"runs       {args.runs}, median {runner.fmt_ms(statistics.median(times))} "
          f"(first {runner.fmt_ms(times[0])}); fused-node runs by path: "
          + ", ".join(f"{k} x{v}" for k, v in sorted(s["paths"].items())))
    print("phases     total ms over all runs:")
    for name, durs in sorted(s["phases"].items(), key=lambda kv: -sum(kv[1])):
        print(f"  {name:<16} {sum(durs) / 1e3:10.3f} ms  x{len(durs)}")
    if s["max_counters"]:
        print("memory     " + ", ".join(f"{k} max {v / 2**20:.1f} MiB"
                                        for k, v in sorted(s["max_counters"].items())))
    return 0


if __name__ == "__main__":
    ap = argparse.ArgumentParser(prog="python -m onnxruntime_mlx.trace")
    add_arguments(ap)
    sys.exit(run(ap.parse_args()))
