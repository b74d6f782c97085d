"""Alternating A/B of EP option settings on a model whose input has dims without names (e.g.
PaddleOCR's files), with one fixed random float32 input, against ORT's CPU EP in the same process.

    python tools/ab_fixed_input.py MODEL 1x3x48x192 "fuse_conv_activation=0;fuse_conv_activation=1" ROUNDS RUNS

Prints, per setting and for ORT's CPU EP, the median ms of each round (RUNS runs a round).
"""
import statistics
import sys
import time

import numpy as np
import onnxruntime as ort

import onnxruntime_mlx as om


def main():
    model, shape, settings, rounds, runs = sys.argv[1:6]
    x = np.random.default_rng(0).standard_normal(tuple(int(v) for v in shape.split("x"))).astype(np.float32)
    names = settings.split(";")
    opts = [dict(a.split("=") for a in s.split(",") if a) for s in names]
    sessions = [om.InferenceSession(model, "cpu", fallback=False, **o) for o in opts]
    sessions.append(ort.InferenceSession(model, providers=["CPUExecutionProvider"]))
    names.append("ORT CPU EP")
    feeds = {sessions[0].get_inputs()[0].name: x}
    for s in sessions:
        for _ in range(20):
            s.run(None, feeds)
    medians = {n: [] for n in names}
    for _ in range(int(rounds)):
        for n, s in zip(names, sessions):
            times = []
            for _ in range(int(runs)):
                t0 = time.perf_counter()
                s.run(None, feeds)
                times.append(time.perf_counter() - t0)
            medians[n].append(statistics.median(times) * 1e3)
    for n in names:
        print(n, " ".join(f"{v:.3f}" for v in medians[n]))


if __name__ == "__main__":
    main()
