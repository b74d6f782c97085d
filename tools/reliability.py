"""Reliability gates, long forms (docs/performance.md "Reliability gates"; the fast forms run in scripts/test).

    python tools/reliability.py leak    [--sessions 500 --runs 2]   RSS + MLX memory over session churn
    python tools/reliability.py threads [--threads 16 --iters 200]  shared + separate sessions

The leak gate creates, runs and destroys sessions over a mixed model set (the demo encoder and
ONNX node-test models of several op families) in one process and reports RSS growth after
warm-up and MLX's active/cache memory against its baseline (same libmlx as the EP's, so
mlx.core sees the EP's allocator)."""
from __future__ import annotations

import argparse
import gc
import glob
import json
import os
import pathlib
import sys
import threading
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))

import numpy as np  # noqa: E402
import onnx  # noqa: E402
import onnxruntime as ort  # noqa: E402
from onnx import helper, numpy_helper  # noqa: E402

import onnxruntime_mlx as om  # noqa: E402

NODE_DIR = ROOT / ".deps/libonnx-testdata/usr/share/libonnx-testdata/data/node"
MIXED = ["test_add_bcast", "test_matmul_4d", "test_softmax_axis_1", "test_conv_with_strides_padding",
         "test_layer_normalization_4d_axis1", "test_reshape_extended_dims", "test_gather_0",
         "test_reduce_mean_keepdims_example", "test_maxpool_2d_pads", "test_concat_3d_axis_1",
         "test_slice", "test_transpose_all_permutations_3", "test_gemm_all_attributes",
         "test_sigmoid", "test_cast_FLOAT_to_FLOAT16", "test_where_example",
         "test_rotary_embedding", "test_rotary_embedding_with_rotary_dim"]


def shape_chain_case():
    """An exporter's shape arithmetic (host-folded: engine/host_fold/host_fold.cc): x [2, 6, 8] reshaped to
    [B, S, H / 2, 2] through Shape -> Gather -> Div -> Unsqueeze -> Concat, plus Range(0, S)."""
    from onnx import TensorProto

    def i64(name, v):
        return numpy_helper.from_array(np.array(v, np.int64), name)
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Gather", ["s", "c0"], ["b"], axis=0),
             helper.make_node("Gather", ["s", "c1"], ["n"], axis=0),
             helper.make_node("Gather", ["s", "c2"], ["h"], axis=0),
             helper.make_node("Div", ["h", "c2"], ["h2"]),
             helper.make_node("Unsqueeze", ["b", "ax0"], ["b_"]),
             helper.make_node("Unsqueeze", ["n", "ax0"], ["n_"]),
             helper.make_node("Unsqueeze", ["h2", "ax0"], ["h2_"]),
             helper.make_node("Concat", ["b_", "n_", "h2_", "two"], ["shape4"], axis=0),
             helper.make_node("Reshape", ["x", "shape4"], ["y"]),
             helper.make_node("Range", ["c0", "n", "c1"], ["pos"])]
    g = helper.make_graph(nodes, "shape_chain",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", "S", "H"])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
                           helper.make_tensor_value_info("pos", TensorProto.INT64, None)],
                          [i64("c0", 0), i64("c1", 1), i64("c2", 2), i64("ax0", [0]), i64("two", [2])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    x = np.random.default_rng(1).standard_normal((2, 6, 8)).astype(np.float32)
    return "shape_chain", m.SerializeToString(), {"x": x}


def fp16_decoder_case():
    """A prompt of onnxruntime-genai's fp16 Llama (tests/models/llm/llama-fp16, the
    MultiHeadAttention form): half-precision weights prepared once, RotaryEmbedding's shared
    tables, the grouped KV cache under the exporter's repeat_kv chain (ops/contrib/attention.cc).
    (A prompt, not a decode step: ORT's CPU EP, the gates' reference, cannot run this model's
    decode steps: its buffer reuse fails.)"""
    model = onnx.load(ROOT / "tests/models/llm/llama-fp16/model.onnx")  # external data inlined
    n = 4
    feeds = {"input_ids": np.array([[7, 30, 2, 99]], np.int64), "attention_mask": np.ones((1, n), np.int64),
             "position_ids": np.arange(n, dtype=np.int64)[None]}
    for inp in model.graph.input:
        if inp.name.startswith("past_key_values."):
            feeds[inp.name] = np.zeros((1, 2, 0, 16), np.float16)
    return "llama_fp16_prompt", model.SerializeToString(), feeds


def gqa_decode_case():
    """A decode step of onnxruntime-genai's int4 Llama (tests/models/llm/llama-int4: 4-bit
    products, GroupQueryAttention over a growing cache of 200 rows): the CPU's decode kernels
    (kernels/cpu/decode_attention.cc, int4_gemv.cc), inputs read and presents written in place
    (kernels/cpu/buffers.h)."""
    model = onnx.load(ROOT / "tests/models/llm/llama-int4/model.onnx")
    past = 200
    rng = np.random.default_rng(3)
    feeds = {"input_ids": np.array([[42]], np.int64), "attention_mask": np.ones((1, past + 1), np.int64)}
    for inp in model.graph.input:
        if inp.name.startswith("past_key_values."):
            feeds[inp.name] = rng.standard_normal((1, 2, past, 16)).astype(np.float32)
    return "llama_int4_decode", model.SerializeToString(), feeds


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def conv_case():
    """Conv (+ Relu) and a stride-2 ConvTranspose, each above cpu_dnnl_min_flops: on MLX's CPU
    device they run through oneDNN (kernels/cpu/dnnl_conv.cc), plans and weights per session."""
    from onnx import TensorProto
    rng = np.random.default_rng(2)
    w = numpy_helper.from_array(rng.standard_normal((16, 16, 3, 3)).astype(np.float32), "w")
    wt = numpy_helper.from_array(rng.standard_normal((16, 8, 4, 4)).astype(np.float32), "wt")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("ConvTranspose", ["r", "wt"], ["y"], strides=[2, 2], pads=[1, 1, 1, 1])]
    g = helper.make_graph(nodes, "conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 32, 32])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w, wt])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    x = rng.standard_normal((1, 16, 32, 32)).astype(np.float32)
    return "conv_onednn", m.SerializeToString(), {"x": x}


def cnn_head_case():
    """A CNN neck and head as the CPU kernels take it: Conv + BatchNormalization (folded into the
    convolution), an average pool on oneDNN's blocked output (DnnlBlockedPool), a kernel-2
    stride-2 ConvTranspose (PatchDeconv) and a nearest x2 Resize (NearestUpsample), each split
    over the OpenMP threads."""
    from onnx import TensorProto
    rng = np.random.default_rng(3)
    C = 24
    inits = [numpy_helper.from_array(v.astype(np.float32), n) for n, v in (
        ("w", rng.standard_normal((C, C, 3, 3)) * 0.2), ("s", rng.uniform(0.5, 2, C)), ("b", rng.standard_normal(C)),
        ("mu", rng.standard_normal(C)), ("var", rng.uniform(0.5, 2, C)), ("wt", rng.standard_normal((C, 8, 2, 2))),
        ("sc", np.array([1, 1, 2, 2])))]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "s", "b", "mu", "var"], ["n"]),
             helper.make_node("Relu", ["n"], ["r"]),
             helper.make_node("AveragePool", ["r"], ["p"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             helper.make_node("ConvTranspose", ["p", "wt"], ["t"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Resize", ["t", "", "sc"], ["y"], mode="nearest")]
    g = helper.make_graph(nodes, "cnn_head", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, C, 40, 40])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    x = rng.standard_normal((1, C, 40, 40)).astype(np.float32)
    return "cnn_head", m.SerializeToString(), {"x": x}


def fire_case():
    """A squeezenet fire module in 16-channel blocks on AVX-512 CPUs: a squeeze 1 x 1, its 1 x 1
    and 3 x 3 (Winograd) expansions computed into their concatenation (DnnlConvsConcat), a max
    pooling and a 10-channel classifier averaged from its padded last block."""
    from onnx import TensorProto
    rng = np.random.default_rng(4)
    inits = [numpy_helper.from_array(v.astype(np.float32), n) for n, v in (
        ("ws", rng.standard_normal((16, 32, 1, 1)) * 0.25), ("e1", rng.standard_normal((32, 16, 1, 1)) * 0.35),
        ("e3", rng.standard_normal((32, 16, 3, 3)) * 0.12), ("wc", rng.standard_normal((10, 64, 1, 1)) * 0.18))]
    nodes = [helper.make_node("Conv", ["x", "ws"], ["s"]), helper.make_node("Relu", ["s"], ["sr"]),
             helper.make_node("Conv", ["sr", "e1"], ["c1"]), helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["sr", "e3"], ["c3"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c3"], ["r3"]),
             helper.make_node("Concat", ["r1", "r3"], ["f"], axis=1),
             helper.make_node("MaxPool", ["f"], ["p"], kernel_shape=[3, 3], strides=[2, 2]),
             helper.make_node("Conv", ["p", "wc"], ["c"]), helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("GlobalAveragePool", ["r"], ["y"])]
    g = helper.make_graph(nodes, "fire", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 32, 27, 27])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    x = rng.standard_normal((1, 32, 27, 27)).astype(np.float32)
    return "fire_blocked16", m.SerializeToString(), {"x": x}


def load_cases():
    cases = []
    for name in MIXED:
        d = NODE_DIR / name
        if not (d / "model.onnx").exists():
            continue
        feeds = {}
        m = onnx.load(d / "model.onnx")
        for i, inp in enumerate(m.graph.input):
            t = onnx.TensorProto()
            t.ParseFromString((d / "test_data_set_0" / f"input_{i}.pb").read_bytes())
            feeds[inp.name] = numpy_helper.to_array(t)
        cases.append((name, m.SerializeToString(), feeds))
    cases.append(shape_chain_case())
    cases.append(fp16_decoder_case())
    cases.append(gqa_decode_case())
    cases.append(conv_case())
    cases.append(cnn_head_case())
    cases.append(fire_case())
    demo = ROOT / "build/demo_model.onnx"
    if demo.exists():
        x = np.random.default_rng(0).standard_normal((2, 32, 128)).astype(np.float32)
        cases.append(("demo", demo.read_bytes(), {"input": x}))
    return cases


def leak(args) -> int:
    import mlx.core as mx
    cases = load_cases()

    def churn(n, trace=None):
        for i in range(n):
            name, model, feeds = cases[i % len(cases)]
            # fallback=False: every node of every case runs on MLX (else the session fails).
            s = ort.InferenceSession(model, sess_options=om.session_options("cpu", fallback=False))
            for _ in range(args.runs):  # run 1 probes eagerly, later runs are compiled
                s.run(None, feeds)
            del s
            if trace is not None and (i + 1) % 100 == 0:
                gc.collect()
                trace.append(round(rss_mb(), 1))
        gc.collect()

    churn(3 * len(cases))  # warm-up: JIT kernels, allocator pools, ORT arenas
    base_cache = mx.get_cache_memory()
    mx.clear_cache()
    base_rss, base_active = rss_mb(), mx.get_active_memory()
    t0 = time.time()
    trace = []
    churn(args.sessions, trace)
    cache = mx.get_cache_memory()  # before clearing: MLX's buffer cache must not grow either
    mx.clear_cache()
    grown = rss_mb() - base_rss
    active = mx.get_active_memory() - base_active
    result = {"sessions": args.sessions, "runs_per_session": args.runs, "models": len(cases),
              "rss_growth_mb": round(grown, 2), "rss_mb_every_100": trace,
              "mlx_active_growth_bytes": int(active), "mlx_cache_bytes_warm": int(base_cache),
              "mlx_cache_bytes_after": int(cache), "seconds": round(time.time() - t0, 1),
              "bound_mb": args.bound_mb}
    print(json.dumps(result))
    return 0 if grown < args.bound_mb and active == 0 and cache <= base_cache + (1 << 20) else 1


def variants(feeds: dict, k: int) -> list[dict]:
    """k different feeds of the same shapes: float inputs scaled and shifted per variant (integer
    inputs are indices/shapes and stay as they are)."""
    out = []
    for v in range(k):
        f = {}
        for n, a in feeds.items():
            a = np.asarray(a)
            f[n] = (a * (1 + 0.1 * v) + 0.01 * v).astype(a.dtype) if a.dtype.kind == "f" else a
        out.append(f)
    return out


def threads(args) -> int:
    names = ("demo", "test_matmul_4d", "test_softmax_axis_1", "test_conv_with_strides_padding",
             "test_layer_normalization_4d_axis1", "test_gather_0")
    cases = [c for c in load_cases() if c[0] in names]
    failures = []
    status = 0
    for name, model, feeds in cases:
        cpu = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
        feeds_k = variants(feeds, 8)
        refs = [cpu.run(None, f) for f in feeds_k]
        shared = ort.InferenceSession(model, sess_options=om.session_options("cpu", fallback=False))

        def work(tid, sess, checked):
            for it in range(args.iters):
                k = (tid + it) % len(feeds_k)  # threads run different inputs at the same time
                outs = sess.run(None, feeds_k[k])
                for a, b in zip(outs, refs[k]):
                    if not np.allclose(a, b, rtol=1e-4, atol=1e-5):
                        failures.append((name, tid, it))
                        return
                checked[tid] += 1

        for mode in ("shared", "separate"):
            checked = [0] * args.threads
            ts = [threading.Thread(target=work, args=(
                t, shared if mode == "shared" else
                ort.InferenceSession(model, sess_options=om.session_options("cpu", fallback=False)),
                checked)) for t in range(args.threads)]
            t0 = time.time()
            for t in ts:
                t.start()
            for t in ts:
                t.join()
            ok = sum(checked) == args.threads * args.iters
            status |= 0 if ok else 1
            print(json.dumps({"model": name, "mode": mode, "threads": args.threads,
                              "iters": args.iters, "runs_checked": sum(checked),
                              "seconds": round(time.time() - t0, 1), "failures": len(failures)}),
                  flush=True)
    return 1 if failures or status else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("leak")
    p.add_argument("--sessions", type=int, default=500)
    p.add_argument("--bound-mb", type=float, default=5.0)
    p.add_argument("--runs", type=int, default=2)
    p.set_defaults(fn=leak)
    p = sub.add_parser("threads")
    p.add_argument("--threads", type=int, default=16)
    p.add_argument("--iters", type=int, default=200)
    p.set_defaults(fn=threads)
    a = ap.parse_args()
    return a.fn(a)


if __name__ == "__main__":
    sys.exit(main())
