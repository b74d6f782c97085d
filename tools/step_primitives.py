"""The MLX primitives one decode step evaluates, by name (log_level=3), for a genai-format LLM:
what a step costs on the GPU is mostly its count of kernels.

    python tools/step_primitives.py MODEL_DIR [--device gpu] [--settings "share_buffer=1,gpu_kernels=0"]
"""
import argparse
import os
import re
import subprocess
import sys

ap = argparse.ArgumentParser()
ap.add_argument("model")
ap.add_argument("--device", default="cpu")
ap.add_argument("--settings", default="share_buffer=1")
ap.add_argument("--steps", type=int, default=6)
a = ap.parse_args()
opts = dict(p.split("=", 1) for p in a.settings.split(",") if p)
share = opts.pop("share_buffer", "0") == "1"
opts.setdefault("device_memory", "1")  # KV in EP memory, as the decode loop keeps it
code = (
    "from onnxruntime_mlx.generate import DEFAULT_PROMPT, Decoder\n"
    f"d = Decoder({a.model!r}, 'mlx', {a.device!r}, share_buffer={share}, max_length=256, log_level=3, **{opts!r})\n"
    f"d.generate(DEFAULT_PROMPT, {a.steps})\n")
r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=os.environ)
lines = [x for x in r.stderr.splitlines() if " evaluates:" in x]
if not lines:
    sys.exit(r.stderr[-3000:])
counts = {k: int(v) for k, v in re.findall(r" (\w+)=(\d+)", lines[-1].split(" evaluates:")[1])}
print(f"{a.settings}: {sum(counts.values())} primitives in the last step")
for k, v in sorted(counts.items(), key=lambda kv: -kv[1]):
    print(f"  {k:28s} {v}")
