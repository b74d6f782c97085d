"""A/B of two versions of the package's Decoder (python/onnxruntime_mlx/generate.py) in one
process: the file as it is and another form of it (`--a FILE`, e.g. `git show HEAD:python/
onnxruntime_mlx/generate.py > /tmp/generate_a.py`), each with its own session of the same model
and provider options. Per round: each decoder decodes a prompt of --context tokens, then blocks
of --block greedy steps alternate between the two (the order flipping every block); prints each
round's median step per version (the step's whole Python, the caller's argmax included), the
median time outside the session's run (the Python around it, which the versions differ in;
measured where the decoder calls run_with_ortvaluevector, the resident path) and whether the
two chose the same tokens.

    python tools/decoder_versions_ab.py MODEL_DIR --a /tmp/generate_a.py [--context 128]
        [--rounds 8] [--blocks 6] [--block 6] [--option device_memory=1 ...]
"""
import argparse
import importlib.util
import time

import numpy as np

from onnxruntime_mlx import generate as current


def load(path: str):
    spec = importlib.util.spec_from_file_location("generate_a", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model")
    p.add_argument("--a", required=True, help="the other generate.py (version A; the package's is B)")
    p.add_argument("--provider", default="mlx")
    p.add_argument("--device", default="cpu", choices=["cpu", "gpu"])
    p.add_argument("--option", action="append", default=["device_memory=1"])
    p.add_argument("--context", type=int, default=128)
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--blocks", type=int, default=6)
    p.add_argument("--block", type=int, default=6)
    a = p.parse_args()
    opts = dict(o.split("=", 1) for o in a.option) if a.provider == "mlx" else {}
    decoders = {"A": load(a.a).Decoder(a.model, a.provider, a.device, **opts),
                "B": current.Decoder(a.model, a.provider, a.device, **opts)}
    times = {k: [] for k in decoders}
    outside = {k: [] for k in decoders}
    in_run = [0.0]

    class TimedSession:  # the session's binding, its run_with_ortvaluevector timed
        def __init__(self, sess):
            self._sess = sess

        def run_with_ortvaluevector(self, *args):
            t = time.perf_counter()
            try:
                return self._sess.run_with_ortvaluevector(*args)
            finally:
                in_run[0] += time.perf_counter() - t

        def __getattr__(self, name):
            return getattr(self._sess, name)
    for dec in decoders.values():
        dec.session._sess = TimedSession(dec.session._sess)
    same = True
    rng = np.random.default_rng(0)
    for r in range(a.rounds):
        ids = rng.integers(3, 1000, (1, a.context))
        state = {}
        for k, dec in decoders.items():
            logits, past = dec.step(ids, dec.empty_past(), a.context)
            state[k] = [logits, past, a.context, []]
        for b in range(a.blocks):
            for k in (list(decoders) if (r + b) % 2 == 0 else list(decoders)[::-1]):
                dec, st = decoders[k], state[k]
                for _ in range(a.block):
                    in_run[0] = 0.0
                    t = time.perf_counter()
                    token = int(np.argmax(st[0][0, -1]))
                    st[2] += 1
                    st[0], st[1] = dec.step(np.array([[token]], np.int64), st[1], st[2])
                    times[k].append(time.perf_counter() - t)
                    if in_run[0] > 0:
                        outside[k].append(times[k][-1] - in_run[0])
                    st[3].append(token)
        same = same and state["A"][3] == state["B"][3]
        n = a.blocks * a.block
        print(f"round {r}: " + ", ".join(f"{k} {np.median(v[-n:]) * 1e3:.3f} ms" for k, v in times.items())
              + "; outside the run " + ", ".join(f"{k} {np.median(v[-n:]) * 1e6:.0f} us" for k, v in outside.items()
                                                 if v), flush=True)
    ratios = [np.median(times["B"][i:i + a.blocks * a.block]) / np.median(times["A"][i:i + a.blocks * a.block])
              for i in range(0, len(times["A"]), a.blocks * a.block)]
    print("all rounds: " + ", ".join(f"{k} median step {np.median(v) * 1e3:.3f} ms" for k, v in times.items())
          + f"; B/A per round {', '.join(f'{x:.3f}' for x in ratios)}; B faster in "
          f"{sum(x < 1 for x in ratios)} of {len(ratios)}; outside the run "
          + ", ".join(f"{k} {np.median(v) * 1e6:.0f} us" for k, v in outside.items() if v) + f"; same tokens: {same}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
