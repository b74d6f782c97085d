"""Where a run's time goes on an NVIDIA GPU: the CUDA kernels and copies of a few warm runs,
recorded with PyTorch's profiler (CUPTI sees every kernel of the process, MLX's and ORT's
alike), against the runs' wall time. Prints per run: wall ms, GPU busy ms (the union of the
kernel and copy intervals), kernels launched, and the kernels taking the most GPU time.

    python3 tools/gpu_kernel_profile.py CASE... [--provider mlx|cuda] [--runs 10] [--top 12]
        [--option key=value ...] [--timeline]

--timeline also lists one more run's kernels in order, each with its start and end relative to
the run's start on the host (when the GPU started each one, and how late after the host began).

CASE is one of
    prefill:MODEL_DIR:LENGTH    a genai-format LLM's prompt of LENGTH tokens (empty past)
    prefill-new:MODEL_DIR:LENGTH  the same, one token longer every run (a length never seen
                                before each time, as prompts come in use: no warm signature)
    decode:MODEL_DIR:CONTEXT    its decode steps after a CONTEXT-token prompt (shared KV buffer)
    model:FILE.onnx[:name=d0xd1,...]   any model with random inputs (other dims 1)

The EP keeps the KV cache in its memory (device_memory=1) as the bench does; provider cuda runs
ORT's CUDA EP on the same files (IOBinding, KV on the GPU). A busy time well under the wall time
means the run waits on the host (launch and graph-building costs), not on the GPU. For the EP it
also prints its report's split of a compiled run's time (MLX evaluation, the compiled function's
replay, inputs, outputs)."""
from __future__ import annotations

import argparse
import collections
import gc
import json
import pathlib
import tempfile
import time

import numpy as np


def parse_case(text: str):
    kind, _, rest = text.partition(":")
    if kind in ("prefill", "prefill-new", "decode"):
        path, _, n = rest.rpartition(":")
        return kind, path, int(n)
    if kind == "model":
        path, _, dims = rest.partition(":")
        shapes = {}
        for item in filter(None, dims.split(",")):
            name, _, shape = item.partition("=")
            shapes[name] = [int(d) for d in shape.split("x")]
        return kind, path, shapes
    raise SystemExit(f"unknown case {text!r}")


def model_runner(path: str, shapes: dict, provider: str, options: dict, device: str = "gpu"):
    import onnxruntime as ort
    from onnxruntime_mlx.bench import _feeds_for
    if provider == "mlx":
        import onnxruntime_mlx as om
        s = ort.InferenceSession(path, sess_options=om.session_options(device, **options))
    elif provider == "cpu":
        s = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    else:
        s = ort.InferenceSession(path, providers=[("CUDAExecutionProvider", options), "CPUExecutionProvider"])
    feeds = _feeds_for(s, shapes)
    return lambda: s.run(None, feeds)


def llm_runner(kind: str, path: str, n: int, provider: str, options: dict):
    from onnxruntime_mlx.generate import Decoder
    if provider == "mlx":
        options = {"device_memory": "1", **options}
    dec = Decoder(path, provider, "gpu", share_buffer=kind == "decode", max_length=-(-(n + 200) // 256) * 256,
                  **options)
    ids = np.random.default_rng(0).integers(3, 1000, (1, n))
    if kind == "prefill":
        return lambda: dec.step(ids, dec.empty_past(), n, logits_to_host=False)
    if kind == "prefill-new":
        more = np.random.default_rng(1).integers(3, 1000, (1, 200))
        grown = {"k": 0}

        def prompt():
            grown["k"] = k = grown["k"] % 200 + 1
            return dec.step(np.concatenate([ids, more[:, :k]], 1), dec.empty_past(), n + k, logits_to_host=False)
        return prompt
    logits, past = dec.step(ids, dec.empty_past(), n)
    state = {"logits": logits, "past": past, "total": n}

    def step():
        nxt = np.array([[int(np.argmax(state["logits"][0, -1]))]], np.int64)
        state["total"] += 1
        state["logits"], state["past"] = dec.step(nxt, state["past"], state["total"])
    return step


def device_events(prof):
    """(name, start_us, end_us) of each kernel / copy the profiler recorded on the GPU."""
    from torch.autograd import DeviceType
    out = []
    for e in prof.events():
        if getattr(e, "device_type", None) != DeviceType.CUDA:
            continue
        out.append((e.name, e.time_range.start, e.time_range.end))
    return out


def busy_us(events) -> float:
    total, end = 0.0, -1.0
    for _, s, e in sorted(events, key=lambda x: x[1]):
        if s >= end:
            total += e - s
            end = e
        elif e > end:
            total += e - end
            end = e
    return total


def print_timeline(run) -> None:
    """One run's kernels in order: start and end (us) from the host's start of the run."""
    import torch
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile, record_function
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        with record_function("timeline_run"):
            run()
        torch.cuda.synchronize()
    host = [e for e in prof.events() if e.name == "timeline_run" and getattr(e, "device_type", None) != DeviceType.CUDA]
    if not host:
        print("   timeline: the run's host span was not recorded")
        return
    h0, h1 = host[0].time_range.start, host[0].time_range.end
    ev = sorted(device_events(prof), key=lambda x: x[1])
    print(f"   timeline: host run {h1 - h0:.0f} us, {len(ev)} kernels+copies; start/end from the host's start, us")
    prev = None
    for name, s, e in ev:
        gap = "" if prev is None else f" (+{s - prev:.0f})"
        print(f"   {s - h0:8.0f} {e - h0:8.0f} {e - s:7.1f}{gap:>9}  {name[:90]}")
        prev = e


def profile_case(case: str, provider: str, runs: int, top: int, options: dict, timeline: bool = False) -> None:
    import torch
    from torch.profiler import ProfilerActivity, profile
    kind, path, arg = parse_case(case)
    report = None
    if provider == "mlx":
        report = pathlib.Path(tempfile.mkdtemp()) / "report.jsonl"
        options["report_path"] = str(report)
    run = model_runner(path, arg, provider, options) if kind == "model" else llm_runner(kind, path, arg, provider, options)
    for _ in range(5):  # past the probe and the compile of a new signature
        run()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(runs):
        run()
    plain_ms = (time.perf_counter() - t0) / runs * 1e3
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        for _ in range(runs):
            run()
        wall_ms = (time.perf_counter() - t0) / runs * 1e3
    ev = device_events(prof)
    per = collections.defaultdict(lambda: [0, 0.0])
    for name, s, e in ev:
        per[name][0] += 1
        per[name][1] += e - s
    kernel_us = sum(v[1] for v in per.values())
    print(f"== {case} [{provider}] {runs} runs: wall {plain_ms:.3f} ms/run ({wall_ms:.3f} profiled), GPU busy "
          f"{busy_us(ev) / runs / 1e3:.3f} ms/run, kernel+copy time {kernel_us / runs / 1e3:.3f} ms/run, "
          f"{len(ev) / runs:.0f} kernels+copies/run", flush=True)
    for name, (count, us) in sorted(per.items(), key=lambda kv: -kv[1][1])[:top]:
        print(f"   {us / runs:9.1f} us/run  {count / runs:6.1f}x  {name[:110]}")
    if timeline:
        print_timeline(run)
    if report:
        del run
        gc.collect()  # the session's end writes its statistics
        lines = [json.loads(x) for x in report.read_text().splitlines() if '"fused_node"' in x]
        for st in lines:
            n = max(st["compiled_runs"], 1)
            ms = lambda key: st.get(key, 0) / n / 1e6  # noqa: E731
            print(f"   report: {st['runs']} runs, per compiled run ({st['compiled_runs']}): Compute "
                  f"{ms('compute_ns_compiled'):.3f} ms, MLX eval {ms('eval_ns_compiled'):.3f}, compiled replay "
                  f"{ms('call_ns_compiled'):.3f}, inputs {ms('inputs_ns_compiled'):.3f}, outputs "
                  f"{ms('outputs_ns_compiled'):.3f}; arrays a run {st.get('eval_arrays', 0) / max(st['runs'], 1):.0f}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("cases", nargs="+")
    p.add_argument("--provider", default="mlx", choices=["mlx", "cuda"])
    p.add_argument("--runs", type=int, default=10)
    p.add_argument("--top", type=int, default=12)
    p.add_argument("--option", action="append", default=[], help="provider option key=value")
    p.add_argument("--timeline", action="store_true", help="list one more run's kernels in order")
    a = p.parse_args()
    options = dict(o.split("=", 1) for o in a.option)
    for case in a.cases:
        try:
            profile_case(case, a.provider, a.runs, a.top, dict(options), a.timeline)
        except Exception as e:  # one case's failure (e.g. a missing model) does not end the others
            print(f"== {case} [{a.provider}] failed: {type(e).__name__}: {e}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
