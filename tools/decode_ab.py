"""Decode steps of a genai-format LLM timed across processes: each round runs every setting once,
each in a fresh process (a setting's session never shares a process with another's, so no
spinning pool of one slows the other), in turn; prints each setting's median over the rounds of
its step time (the better of two passes of --steps greedy steps after a --context prompt, the
first four steps of a pass left out) and every round's figure.

    python tools/decode_ab.py MODEL_DIR --settings "cpu_packed_stream=0;cpu_packed_stream=6144;provider=cpu"
        [--context 128] [--steps 48] [--rounds 6]

A setting is `,`-separated provider options of the EP (the KV cache in its memory,
device_memory=1, as the bench keeps it); `provider=cpu` is ORT's CPU EP."""
import argparse
import json
import os
import statistics
import subprocess
import sys

WORKER = r"""
import json, statistics, sys, time
import numpy as np
from onnxruntime_mlx.generate import Decoder
model, setting, ctx, steps = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
opts = dict(kv.split("=", 1) for kv in setting.split(",") if kv)
provider = opts.pop("provider", "mlx")
if provider == "mlx":
    opts.setdefault("device_memory", "1")
d = Decoder(model, provider, "cpu", **(opts if provider == "mlx" else {}))
ids = np.random.default_rng(0).integers(3, 1000, (1, ctx))
best = None
for _ in range(2):
    logits, past = d.step(ids, d.empty_past(), ctx)
    n, times = ctx, []
    for _ in range(steps):
        nxt = np.array([[int(np.argmax(np.asarray(logits)[0, -1]))]], np.int64)
        n += 1
        t0 = time.perf_counter()
        logits, past = d.step(nxt, past, n)
        times.append(time.perf_counter() - t0)
    med = statistics.median(times[4:])
    best = med if best is None else min(best, med)
print(json.dumps({"step_ms": best * 1e3}))
"""


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--settings", required=True)
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--steps", type=int, default=48)
    ap.add_argument("--rounds", type=int, default=6)
    a = ap.parse_args()
    settings = a.settings.split(";")
    figures = {s: [] for s in settings}
    for _ in range(a.rounds):
        for s in settings:
            r = subprocess.run([sys.executable, "-c", WORKER, a.model, s, str(a.context), str(a.steps)],
                               env=os.environ, capture_output=True, text=True)
            if r.returncode != 0:
                sys.exit(r.stderr[-3000:])
            figures[s].append(json.loads(r.stdout.strip().splitlines()[-1])["step_ms"])
    for s, v in figures.items():
        print(f"{s or 'defaults'}: median {statistics.median(v):.3f} ms a step; rounds: "
              + " ".join(f"{x:.2f}" for x in v))
    return 0


if __name__ == "__main__":
    sys.exit(main())
