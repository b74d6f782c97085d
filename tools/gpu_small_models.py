"""Small models on the GPU: the EP with kept CUDA graphs (gpu_graph_replay=1), without them (=0)
and ORT's CUDA EP (its defaults, host inputs and outputs, as the EP's sessions here), in one
process: 20 warm runs each, then rounds of timed runs per session, alternating. Prints each
session's median ms a round, the largest difference of its outputs from the first session's, and
EP / CUDA EP (median of rounds, > 1: the EP faster).

    python tools/gpu_small_models.py --chain10 chain10.onnx --silero silero_vad_16k_op15.onnx \\
        --ocr-cls CLS.onnx --ocr-rec REC.onnx --ocr-det DET.onnx [--rounds 3]

(chain10 from tools/tiny_models.py; Silero VAD from the silero-vad package; PaddleOCR's files
from rapidocr-onnxruntime.) Each given model runs with its own fixed random input."""
import argparse
import statistics
import time

import numpy as np
import onnxruntime as ort

import onnxruntime_mlx as om


def cases(a):
    rng = np.random.default_rng(0)
    img = lambda *s: {"x": rng.standard_normal(s).astype(np.float32)}  # noqa: E731
    if a.chain10:
        yield "ten-node chain", a.chain10, {"x": rng.standard_normal((1, 64)).astype(np.float32)}, 300
    if a.silero:
        yield "Silero VAD", a.silero, {"input": rng.standard_normal((1, 512)).astype(np.float32) * 0.1,
                                       "state": np.zeros((2, 1, 128), np.float32), "sr": np.array(16000, np.int64)}, 300
    if a.ocr_cls:
        yield "PaddleOCR cls", a.ocr_cls, img(1, 3, 48, 192), 100
    if a.ocr_rec:
        yield "PaddleOCR rec", a.ocr_rec, img(1, 3, 48, 320), 50
    if a.ocr_det:
        yield "PaddleOCR det", a.ocr_det, img(1, 3, 320, 320), 50


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for k in ("chain10", "silero", "ocr-cls", "ocr-rec", "ocr-det"):
        p.add_argument(f"--{k}")
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()
    for name, path, feeds, runs in cases(a):
        sessions = {"kept": om.InferenceSession(path, "gpu", gpu_graph_replay=1),
                    "not kept": om.InferenceSession(path, "gpu", gpu_graph_replay=0),
                    "CUDA EP": ort.InferenceSession(path, providers=["CUDAExecutionProvider", "CPUExecutionProvider"])}
        first = None
        for k, s in sessions.items():
            for _ in range(20):
                out = s.run(None, feeds)
            first = out if first is None else first
            diff = max(float(np.abs(np.asarray(x, np.float64) - np.asarray(y, np.float64)).max()) for x, y in zip(out, first))
            print(f"{name} [{k}] max |output - kept's| {diff:.2e}", flush=True)
        medians = {k: [] for k in sessions}
        for _ in range(a.rounds):
            for k, s in sessions.items():
                ts = []
                for _ in range(runs):
                    t = time.perf_counter()
                    s.run(None, feeds)
                    ts.append(time.perf_counter() - t)
                medians[k].append(statistics.median(ts) * 1e3)
        print(name, " | ".join(f"{k} " + ", ".join(f"{v:.3f}" for v in vs) for k, vs in medians.items()),
              f"| EP / CUDA EP {statistics.median(medians['CUDA EP']) / statistics.median(medians['kept']):.2f}x",
              flush=True)


if __name__ == "__main__":
    main()
