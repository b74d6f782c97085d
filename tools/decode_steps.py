"""Decode-step A/B for a genai-format LLM on the MLX EP, in one process (MLX's kernel
compilation is paid once): for each setting, a session, a prompt, then greedy steps; prints the
median step time (steps after the first 8), per run (the prompt's included) host reads, folds,
MLX arrays evaluated, segment calls and translation time, and the logits' largest difference
from the first setting's. Settings alternate for --rounds rounds.

    python tools/decode_steps.py MODEL_DIR [--device gpu] [--context 128] [--steps 40]
        [--settings "host_fold=1;host_fold=0"] [--rounds 2] [--prefill-logits]

A setting is `;`-separated from the next and holds `,`-separated key=value pairs: provider
options (host_fold, shape_family, ...), the decoder's own (share_buffer=1: genai's shared
past/present buffer, of max_length rows, by default the context and steps rounded up to 256;
provider=cuda: ORT's CUDA EP instead of this EP, the baseline) or environment variables (names in capitals, e.g.
ORT_MLX_FUSED_ROTARY=0, read by the EP per translation); `device=cpu` runs that setting on
the other MLX device (an fp32-computing reference for a GPU setting's logits). --teacher-forced
feeds every setting the same token sequence instead of its own greedy choice, so the logits are
compared on the same inputs. --prefill-logits instead times the prompt alone with its logits
copied to the host and kept in the EP's memory, alternating. --prompts times the prompt of
--context tokens under each setting instead of decoding: one session a setting (logits kept in
the device's memory, as the bench's prompts), seven untimed runs (a kept CUDA graph from then),
then per round ten timed runs a setting, settings alternating; prints the median and the
outputs' largest difference from the first setting's."""
import argparse
import gc
import json
import os
import pathlib
import tempfile
import time

import numpy as np

from onnxruntime_mlx.generate import Decoder


def parse_setting(text: str) -> tuple[dict, dict]:
    opts, env = {}, {}
    for pair in filter(None, (p.strip() for p in text.split(","))):
        key, value = pair.split("=", 1)
        (env if key.isupper() else opts)[key] = value
    return opts, env


def run_setting(model, device, opts, env, context, steps, report, teacher_forced=False):
    """The setting's environment variables hold for its own steps only."""
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        return _run_setting(model, device, opts, context, steps, report, teacher_forced)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _run_setting(model, device, opts, context, steps, report, teacher_forced):
    device = opts.pop("device", device)
    provider = opts.pop("provider", "mlx")
    share = opts.pop("share_buffer", "0") == "1"
    max_length = int(opts.pop("max_length", 0)) or -(-(context + steps + 1) // 256) * 256
    report.unlink(missing_ok=True)
    if provider == "mlx":
        opts.update(device_memory="1", report_path=str(report))
    dec = Decoder(model, provider, device, share_buffer=share, max_length=max_length, **opts)
    # Token ids inside the model's vocabulary (ids past it are an error, as on ORT's CPU EP).
    vocab = min(1000, json.loads((dec.model_path.parent / "genai_config.json").read_text())["model"]["vocab_size"])
    forced = np.random.default_rng(1).integers(3, vocab, steps)
    ids = np.random.default_rng(0).integers(3, vocab, (1, context))
    t = time.perf_counter()
    logits, past = dec.step(ids, dec.empty_past(), context)
    prompt_s = time.perf_counter() - t
    total, times = context, []
    for _ in range(steps):
        token = int(forced[len(times)]) if teacher_forced else int(np.argmax(logits[0, -1]))
        nxt = np.array([[token]], np.int64)
        total += 1
        t = time.perf_counter()
        logits, past = dec.step(nxt, past, total)
        times.append(time.perf_counter() - t)
    last = logits[0, -1].astype(np.float32)
    del dec, past, logits
    gc.collect()  # releasing the session writes its statistics to the report
    if provider != "mlx":
        return float(np.median(times[8:] or times)) * 1e3, prompt_s, None, last
    st = json.loads([x for x in report.read_text().splitlines() if '"fused_node"' in x][-1])
    return float(np.median(times[8:] or times)) * 1e3, prompt_s, st, last


def ms_per_compiled(st: dict, key: str) -> float:
    """A report time field (ns, summed over compiled runs) per compiled run, in ms."""
    return st.get(key, 0) / max(st["compiled_runs"], 1) / 1e6


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model")
    p.add_argument("--device", default="cpu", choices=["cpu", "gpu"])
    p.add_argument("--context", type=int, default=128)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--settings", default="host_fold=1;host_fold=0")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--prefill-logits", action="store_true")
    p.add_argument("--teacher-forced", action="store_true")
    p.add_argument("--prompts", action="store_true")
    a = p.parse_args()
    if a.prompts:
        return time_prompts(a)
    report = pathlib.Path(tempfile.mkdtemp()) / "report.jsonl"
    walked = {}
    if a.prefill_logits:
        dec = Decoder(a.model, "mlx", a.device, device_memory="1")
        ids = np.random.default_rng(0).integers(3, 1000, (1, a.context))
        for host in (True, False):  # warm-up
            dec.step(ids, dec.empty_past(), a.context, logits_to_host=host)
        for r in range(a.rounds):
            for host in (True, False):
                ts = []
                for _ in range(3):
                    t = time.perf_counter()
                    dec.step(ids, dec.empty_past(), a.context, logits_to_host=host)
                    ts.append(time.perf_counter() - t)
                print(f"round {r} logits_to_host={host}: prompt of {a.context} median {np.median(ts) * 1e3:.0f} ms",
                      flush=True)
        return 0
    settings = [s.strip() for s in a.settings.split(";") if s.strip()]
    first = None
    for r in range(a.rounds):
        for text in settings:
            opts, env = parse_setting(text)
            med, prompt_s, st, last = run_setting(a.model, a.device, opts, env, a.context, a.steps, report,
                                                  a.teacher_forced)
            first = last if first is None else first
            if st is None:
                print(f"round {r} [{text}]: step median {med:.2f} ms ({1e3 / med:.1f} tok/s), prompt "
                      f"{prompt_s * 1e3:.0f} ms; max |logit - first setting's| {float(np.abs(last - first).max()):.2e}",
                      flush=True)
                continue
            runs = max(st["runs"], 1)
            per_compiled = lambda key: ms_per_compiled(st, key)  # noqa: E731
            print(f"round {r} [{text}]: step median {med:.2f} ms ({1e3 / med:.1f} tok/s), prompt {prompt_s * 1e3:.0f} ms,"
                  f" per run: host reads {st['host_reads'] / runs:.1f}, folds {st.get('host_folds', 0) / runs:.1f},"
                  f" kept-graph launches {st.get('replay_runs', 0)} of {st['runs']} runs,"
                  f" MLX arrays evaluated {st.get('eval_arrays', 0) / runs:.0f}, segment calls"
                  f" {st.get('segment_calls', 0) / runs:.1f}, translation {st['translate_ns'] / runs / 1e6:.2f} ms,"
                  f" compiled runs: Compute {per_compiled('compute_ns_compiled'):.2f} ms"
                  f" (MLX eval {per_compiled('eval_ns_compiled'):.2f}, outputs {per_compiled('outputs_ns_compiled'):.2f},"
                  f" inputs {per_compiled('inputs_ns_compiled'):.2f}, compiled call {per_compiled('call_ns_compiled'):.2f});"
                  f" max |logit - first setting's| {float(np.abs(last - first).max()):.2e}", flush=True)
            if "process_caller_arrays" in st:  # process-wide counts: this setting's share since the last
                keys = ("process_caller_arrays", "process_caller_stream_arrays", "process_caller_left")
                d = [st[k] - walked.get(k, 0) for k in keys]
                walked.update({k: st[k] for k in keys})
                print(f"    walks (cpu_caller_eval) per run: on the caller {d[0] / runs:.0f}, on the stream thread"
                      f" {d[1] / runs:.0f}, left to MLX {d[2] / runs:.0f}", flush=True)
    return 0


def time_prompts(a) -> int:
    settings = [s.strip() for s in a.settings.split(";") if s.strip()]
    ids = np.random.default_rng(0).integers(3, 1000, (1, a.context))
    decoders, first = [], None
    for text in settings:
        opts, env = parse_setting(text)
        os.environ.update(env)
        provider = opts.pop("provider", "mlx")
        if provider == "mlx":
            opts.setdefault("device_memory", "1")
        dec = Decoder(a.model, provider, a.device, share_buffer=False, **opts)
        for _ in range(7):
            logits, _ = dec.step(ids, dec.empty_past(), a.context)
        logits = np.asarray(logits, np.float32)
        first = logits if first is None else first
        print(f"[{text}] max |logit - first setting's| {float(np.abs(logits - first).max()):.2e}", flush=True)
        decoders.append(dec)
    for r in range(a.rounds):
        for text, dec in zip(settings, decoders):
            ts = []
            for _ in range(10):
                t = time.perf_counter()
                dec.step(ids, dec.empty_past(), a.context, logits_to_host=False)
                ts.append(time.perf_counter() - t)
            print(f"round {r} [{text}]: prompt of {a.context} median {np.median(ts) * 1e3:.3f} ms", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
