"""A/B of provider-option settings on the same models, in one process: one session per setting
and model, then rounds that time each setting in turn (alternating, so drift hits all alike).
Prints per-round medians of run latency and each setting's median over rounds.

    python tools/ab_options.py MODEL.onnx... --settings "device_copies=1;device_copies=0"
        [--device gpu] [--rounds 5] [--runs 200] [--dim name=value | --shape 1x3x48x192]

A setting is `,`-separated key=value provider options; settings are `;`-separated.
`--cuda-ep` adds ORT's CUDA EP (its defaults, host inputs and outputs, as the MLX EP's sessions
here) to the alternation, as the last column; `--cpu-ep` adds ORT's CPU EP the same way."""
import argparse
import statistics
import time

import onnxruntime_mlx as om
from onnxruntime_mlx import runner


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("models", nargs="+")
    ap.add_argument("--settings", required=True)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--dim", action="append", default=[])
    ap.add_argument("--shape", default="", help="one float32 input of this shape, e.g. 1x3x48x192")
    ap.add_argument("--cuda-ep", action="store_true")
    ap.add_argument("--cpu-ep", action="store_true")
    args = ap.parse_args()
    dims = runner.parse_dims(args.dim)
    settings = [dict(kv.split("=", 1) for kv in s.split(",") if kv) for s in args.settings.split(";")]
    baselines = [("CUDAExecutionProvider", "ORT CUDA EP")] if args.cuda_ep else []
    baselines += [("CPUExecutionProvider", "ORT CPU EP")] if args.cpu_ep else []
    names = [s or "defaults" for s in args.settings.split(";")] + [label for _, label in baselines]
    print("| model | " + " | ".join(f"{n} (ms per round)" for n in names) + " | ratio 2nd/1st |")
    print("|---|" + "---|" * len(names) + "---:|")
    for model in args.models:
        sessions = [om.InferenceSession(model, args.device, fallback=False, **s) for s in settings]
        for provider, _ in baselines:
            import onnxruntime as ort
            sessions.append(ort.InferenceSession(model, providers=[provider]))
        if args.shape:  # (models whose dims have no names)
            import numpy as np
            feeds = {sessions[0].get_inputs()[0].name: np.random.default_rng(0).standard_normal(
                [int(v) for v in args.shape.split("x")]).astype(np.float32)}
        else:
            feeds = runner.random_feeds(sessions[0], runner.dims_of(sessions[0], {}, dims), 0, {})
        for s in sessions:
            for _ in range(20):
                s.run(None, feeds)
        per = [[] for _ in sessions]
        for _ in range(args.rounds):
            for i, s in enumerate(sessions):
                t = []
                for _ in range(args.runs):
                    t0 = time.perf_counter()
                    s.run(None, feeds)
                    t.append(time.perf_counter() - t0)
                per[i].append(statistics.median(t) * 1e3)
        meds = [statistics.median(p) for p in per]
        cells = [", ".join(f"{x:.3f}" for x in p) for p in per]
        ratio = meds[1] / meds[0] if len(meds) > 1 else 1.0
        print(f"| {model.split('/')[-1]} | " + " | ".join(cells) + f" | {ratio:.3f} |", flush=True)


if __name__ == "__main__":
    main()
