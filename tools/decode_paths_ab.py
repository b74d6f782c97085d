"""A/B of the package Decoder's two resident step paths (generate.py) in one session: IOBinding
(_step_resident) against the OrtValue-vector run (_step_resident_vector). Per round: a prompt of
--context tokens, then blocks of --block greedy steps alternating between the paths (the order
flipping every block), the KV cache of one path fed to the other; prints each round's median
step per path and the logits' largest difference between the paths on the same step inputs.

    python tools/decode_paths_ab.py MODEL_DIR [--context 128] [--rounds 8] [--blocks 6] [--block 6]
"""
import argparse
import time

import numpy as np

from onnxruntime_mlx.generate import Decoder


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model")
    p.add_argument("--device", default="cpu", choices=["cpu", "gpu"])
    p.add_argument("--context", type=int, default=128)
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--blocks", type=int, default=6)
    p.add_argument("--block", type=int, default=6)
    a = p.parse_args()
    dec = Decoder(a.model, "mlx", a.device, device_memory="1")
    paths = {"iobinding": lambda feeds, past: dec._step_resident({**feeds, **past}),
             "vector": dec._step_resident_vector}

    def step(path, token, past, total):
        feeds = {"input_ids": np.array([[token]], np.int64), "attention_mask": np.ones((1, total), np.int64)}
        if "position_ids" in dec.inputs:
            feeds["position_ids"] = np.array([[total - 1]], np.int64)
        return paths[path](feeds, past)

    ids = np.random.default_rng(0).integers(3, 1000, (1, a.context))
    times = {k: [] for k in paths}
    worst = 0.0
    for r in range(a.rounds):
        logits, past = dec.step(ids, dec.empty_past(), a.context)
        total = a.context
        for b in range(a.blocks):
            order = list(paths) if (r + b) % 2 == 0 else list(paths)[::-1]
            for path in order:
                for _ in range(a.block):
                    token = int(np.argmax(logits[0, -1]))
                    total += 1
                    t = time.perf_counter()
                    logits, past = step(path, token, past, total)
                    times[path].append(time.perf_counter() - t)
            # both paths on the same inputs: the same logits
            token = int(np.argmax(logits[0, -1]))
            la, _ = step("iobinding", token, past, total + 1)
            lb, _ = step("vector", token, past, total + 1)
            worst = max(worst, float(np.abs(la - lb).max()))
        n = a.blocks * a.block
        print(f"round {r}: " + ", ".join(f"{k} {np.median(v[-n:]) * 1e3:.3f} ms" for k, v in times.items()), flush=True)
    print("all rounds: " + ", ".join(f"{k} median step {np.median(v) * 1e3:.3f} ms" for k, v in times.items())
          + f"; max |logits difference| {worst:.2e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
