"""Session-creation time on the MLX EP with and without an EPContext model (ORT's compiled-model
cache): the original model (ORT's graph optimizations, the EP's partitioning and translation)
against its context model (the EP rebuilds each fused group from its saved payload), median of
N creations of each, alternating in one process. Prints a markdown table.

Models: the CNNs of the ONNX test data (.deps/libonnx-testdata, their weights made by
ConstantOfShape and folded by ORT at creation) and Llama decoders in onnxruntime-genai's graph
form. The genai models are the checked-in test Llamas (tests/models/llm/llama-{fp32,int4}, made
by genai's model builder) widened and deepened to the benchmark sizes with random weights, since
making the bench models themselves needs torch:

    .venv/bin/python tools/session_create_bench.py [--repeat 5] [--only cnn,llm]
"""
from __future__ import annotations

import argparse
import gc
import pathlib
import statistics
import sys
import time

import numpy as np
import onnx
from onnx import helper, numpy_helper

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))

import onnxruntime as ort  # noqa: E402

import onnxruntime_mlx as om  # noqa: E402

CNN_DIR = ROOT / ".deps/libonnx-testdata/usr/share/libonnx-testdata/data/light"
CNNS = ["light_squeezenet", "light_resnet50", "light_densenet121"]
# The bench's LLM sizes (tools/gen_llm_models.py SIZES): "bench" ~60M parameters, "large" ~0.44B.
SIZES = {
    "60M": dict(vocab=32000, hidden=512, inter=1536, layers=8, heads=8, kv_heads=4, max_pos=4096),
    "0.44B": dict(vocab=32000, hidden=1024, inter=4096, layers=24, heads=16, kv_heads=8,
                  max_pos=4096),
}
EMBED_LIMIT = 1 << 30  # payloads larger than this are not embedded (protobuf's 2 GiB model cap)


# ---- a genai Llama at a bench size, from the checked-in test model --------------------------

def _sub(s: str, k: int) -> str:
    return (s.replace("past_key_values.@K.", f"past_key_values.{k}.")
             .replace("present.@K.", f"present.{k}.")
             .replace("@K/", f"layers.{k}/").replace("@K.", f"layers.{k}.")
             .replace("@P/", f"layers.{k - 1}/"))


def _layer_name(s: str, k: int) -> str:
    s = s.replace("layers.1/", "@K/").replace("layers.1.", "@K.").replace("layers.0/", "@P/")
    s = s.replace("past_key_values.1.", "past_key_values.@K.").replace("present.1.", "present.@K.")
    return _sub(s, k)


def scaled_llama(src: pathlib.Path, out: pathlib.Path, size: dict, seed: int = 0) -> pathlib.Path:
    """Writes out/model.onnx: src's graph with `layers` decoder layers and `size`'s dims."""
    path = out / "model.onnx"
    if path.exists():
        return path
    out.mkdir(parents=True, exist_ok=True)
    m = onnx.load(src / "model.onnx", load_external_data=False)
    g = m.graph
    L, H, inter, V = size["layers"], size["hidden"], size["inter"], size["vocab"]
    nh, nkv = size["heads"], size["kv_heads"]
    hd = H // nh
    qkv = (nh + 2 * nkv) * hd
    rng = np.random.default_rng(seed)
    layer0 = [n for n in g.node if "layers.0/" in n.name]
    layer1 = [n for n in g.node if "layers.1/" in n.name]
    final = [n for n in g.node if "final_norm" in n.name]
    rest = [n for n in g.node if n not in layer0 and n not in layer1 and n not in final]
    head = [n for n in rest if "lm_head" in n.name]
    pre = [n for n in rest if n not in head]
    nodes = pre + layer0
    for k in range(1, L):
        for n in layer1:
            c = onnx.NodeProto()
            c.CopyFrom(n)
            c.name = _layer_name(n.name, k)
            c.input[:] = [_layer_name(x, k) for x in n.input]
            c.output[:] = [_layer_name(x, k) for x in n.output]
            nodes.append(c)
    for n in final:
        c = onnx.NodeProto()
        c.CopyFrom(n)
        c.name = n.name.replace("layers.2", f"layers.{L}")
        c.input[:] = [_layer_name(x, L - 1) if "layers.1" in x else x for x in n.input]
        c.output[:] = [x.replace("layers.2", f"layers.{L}") for x in n.output]
        nodes.append(c)
    for n in head:
        n.input[:] = [x.replace("layers.2/", f"layers.{L}/") for x in n.input]
    nodes += head
    # Attributes that carry the dims.
    for n in nodes:
        for a in n.attribute:
            if n.op_type == "GroupQueryAttention":
                if a.name == "num_heads":
                    a.i = nh
                elif a.name == "kv_num_heads":
                    a.i = nkv
                elif a.name == "scale":
                    a.f = float(hd) ** -0.5
    shapes = {}  # initializer name -> (K, N) of its projection, or a plain shape

    def proj(name):
        if "qkv_proj" in name:
            return H, qkv
        if "o_proj" in name:
            return nh * hd, H
        if "gate_proj" in name or "up_proj" in name:
            return H, inter
        if "down_proj" in name:
            return inter, H
        if "lm_head" in name:
            return H, V
        return None

    for n in nodes:
        if n.op_type == "MatMulNBits":
            K, N = proj(n.input[1])
            for a in n.attribute:
                if a.name == "K":
                    a.i = K
                elif a.name == "N":
                    a.i = N
    inits = []
    names = {x for n in nodes for x in n.input}
    templ = {i.name: i for i in g.initializer}

    def template_of(name):
        if name in templ:
            return templ[name]
        for k in range(2, L + 1):
            t = name.replace(f"layers.{k}.", "layers.1.")
            if t in templ:
                return templ[t]
        return templ.get(name.replace(f"layers.{L}.", "layers.2."))

    for name in sorted(names):
        t = template_of(name)
        if t is None:
            continue
        dt = onnx.helper.tensor_dtype_to_np_dtype(t.data_type)
        if name == "model.embed_tokens.weight":
            shape = (V, H)
        elif "layernorm" in name:
            shape = (H,)
        elif name in ("cos_cache", "sin_cache"):
            shape = (size["max_pos"], hd // 2)
        elif name.endswith("_Q4"):
            K, N = proj(name)
            shape = (N, K // 32, 16)
        elif name.endswith("_scales"):
            K, N = proj(name)
            shape = (N, K // 32)
        else:
            shape = proj(name)
        if dt == np.uint8:
            arr = rng.integers(0, 256, size=shape, dtype=np.uint8)
        else:
            arr = (rng.standard_normal(shape, dtype=np.float32) * 0.02).astype(dt)
        inits.append(numpy_helper.from_array(arr, name))
    # Inputs/outputs: one past/present pair per layer, the dims that were fixed numbers.
    def io(vs, kind):
        out_vs = []
        for v in vs:
            if ".1." in v.name and ("past_key_values" in v.name or "present" in v.name):
                continue
            if ".0." in v.name and ("past_key_values" in v.name or "present" in v.name):
                for k in range(L):
                    c = onnx.ValueInfoProto()
                    c.CopyFrom(v)
                    c.name = v.name.replace(".0.", f".{k}.")
                    c.type.tensor_type.shape.dim[1].dim_value = nkv
                    out_vs.append(c)
                continue
            c = onnx.ValueInfoProto()
            c.CopyFrom(v)
            if c.name == "logits":
                c.type.tensor_type.shape.dim[2].dim_value = V
            out_vs.append(c)
        return out_vs

    new_g = helper.make_graph(nodes, g.name, io(g.input, "in"), io(g.output, "out"), inits)
    new_m = helper.make_model(new_g, opset_imports=list(m.opset_import))
    new_m.ir_version = m.ir_version
    onnx.save(new_m, path, save_as_external_data=True, location="model.onnx.data",
              size_threshold=1024)
    return path


# ---- timing ---------------------------------------------------------------------------------

def _options(context: dict | None = None) -> ort.SessionOptions:
    so = om.session_options("cpu")
    for k, v in (context or {}).items():
        so.add_session_config_entry(k, str(v))
    return so


def _create(path: pathlib.Path, context: dict | None = None) -> tuple[float, ort.InferenceSession]:
    so = _options(context)
    t = time.perf_counter()
    s = ort.InferenceSession(str(path), sess_options=so, enable_fallback=0)
    return time.perf_counter() - t, s


def _feeds(s: ort.InferenceSession, rng, extra_dims: dict) -> dict:
    dims = {"batch_size": 1, "sequence_length": 8, "total_sequence_length": 8,
            "past_sequence_length": 0, **extra_dims}
    feeds = {}
    for i in s.get_inputs():
        shape = [d if isinstance(d, int) else dims.get(d, 1) for d in i.shape]
        if i.name == "input_ids":
            feeds[i.name] = rng.integers(0, 512, size=shape, dtype=np.int64)
        elif i.name == "attention_mask":
            feeds[i.name] = np.ones(shape, np.int64)
        elif "int64" in i.type:
            feeds[i.name] = np.zeros(shape, np.int64)
        else:
            feeds[i.name] = rng.standard_normal(shape).astype(np.float32)
    return feeds


def _payload_bytes(ctx: pathlib.Path) -> int:
    total = 0
    for n in onnx.load(ctx).graph.node:
        if n.op_type != "EPContext":
            continue
        for a in n.attribute:
            if a.name == "ep_cache_context":
                p = ctx.parent / a.s.decode(errors="replace")
                total += p.stat().st_size if p.is_file() else len(a.s)
    return total


def measure(name: str, path: pathlib.Path, work: pathlib.Path, repeat: int,
            dims: dict | None = None) -> dict:
    work.mkdir(parents=True, exist_ok=True)
    for old in work.glob(f"{name}_ctx_*"):  # ORT refuses to overwrite a context model
        old.unlink()
    variants = {"original": (path, None)}
    ctx0 = work / f"{name}_ctx_embed0.onnx"
    _, s = _create(path, {"ep.context_enable": 1, "ep.context_embed_mode": 0,
                          "ep.context_file_path": ctx0})
    del s
    variants["EPContext, side file"] = (ctx0, None)
    payload = _payload_bytes(ctx0)
    if payload < EMBED_LIMIT:
        ctx1 = work / f"{name}_ctx_embed1.onnx"
        _, s = _create(path, {"ep.context_enable": 1, "ep.context_embed_mode": 1,
                              "ep.context_file_path": ctx1})
        del s
        variants["EPContext, embedded"] = (ctx1, None)
    # Same outputs, and one creation of each before timing (page cache, MLX initialisation).
    rng = np.random.default_rng(0)
    outs = {}
    for label, (p, ctx) in variants.items():
        _, s = _create(p, ctx)
        if not outs:
            feeds = _feeds(s, rng, dims or {})
        outs[label] = s.run(None, feeds)
        del s
        gc.collect()
    ref = outs["original"]
    same = all(all(np.array_equal(a, b) for a, b in zip(ref, o)) for o in outs.values())
    times = {label: [] for label in variants}
    for _ in range(repeat):
        for label, (p, ctx) in variants.items():
            t, s = _create(p, ctx)
            times[label].append(t)
            del s
            gc.collect()
    m = onnx.load(path, load_external_data=False)
    return {"name": name, "nodes": len(m.graph.node), "payload_mb": payload / 2**20,
            "same": same, "median_s": {k: statistics.median(v) for k, v in times.items()},
            "all_s": times}


def table(results: list[dict]) -> str:
    lines = ["| model | ONNX nodes | payload (MiB) | original (s) | EPContext, side file (s) | "
             "EPContext, embedded (s) | original / side file | same outputs |",
             "|---|---:|---:|---:|---:|---:|---:|---|"]
    for r in results:
        med = r["median_s"]
        o, s0 = med["original"], med["EPContext, side file"]
        s1 = med.get("EPContext, embedded")
        lines.append(f"| {r['name']} | {r['nodes']} | {r['payload_mb']:.1f} | {o:.3f} | {s0:.3f} | "
                     f"{'-' if s1 is None else f'{s1:.3f}'} | {o / s0:.1f}x | "
                     f"{'yes' if r['same'] else 'NO'} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--only", default="cnn,llm")
    p.add_argument("--sizes", default="60M,0.44B")
    p.add_argument("--precisions", default="fp32,int4")
    p.add_argument("--work", default=str(ROOT / "build/session_create_bench"))
    args = p.parse_args(argv)
    work = pathlib.Path(args.work)
    om.register()
    results = []
    groups = set(args.only.split(","))
    if "cnn" in groups:
        for n in CNNS:
            if (CNN_DIR / f"{n}.onnx").exists():
                results.append(measure(n, CNN_DIR / f"{n}.onnx", work / "ctx", args.repeat))
                print(table(results[-1:]).splitlines()[-1], file=sys.stderr, flush=True)
    if "llm" in groups:
        for size in args.sizes.split(","):
            for prec in args.precisions.split(","):
                src = ROOT / f"tests/models/llm/llama-{prec}"
                name = f"llama-{size}-{prec}"
                path = scaled_llama(src, work / "models" / name, SIZES[size])
                dims = {"kv_cache_dim": SIZES[size]["hidden"] // SIZES[size]["heads"]}
                results.append(measure(name, path, work / "ctx", args.repeat, dims))
                print(table(results[-1:]).splitlines()[-1], file=sys.stderr, flush=True)
    print(f"Session creation on the MLX EP (CPU device), median of {args.repeat}, alternating:\n")
    print(table(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
