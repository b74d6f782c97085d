"""Writes the cases tools/ep_churn.cc and tools/ep_threads.cc run: <out>/<name>/model.onnx +
inputs.bin, from the mixed model set of tools/reliability.py (ONNX node tests of several op
families + the demo encoder), and a shape family: inputs.1.bin ... more input sets of other
shapes, options.txt provider options (key=value lines; ep_threads reads both, ep_churn the first
set only).

    python tools/sanitize_cases.py OUT_DIR      # prints the case dirs, one per line"""
from __future__ import annotations

import pathlib
import struct
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
from onnx import helper, numpy_helper  # noqa: E402

from reliability import load_cases  # noqa: E402
from tiny_models import attention_nodes  # noqa: E402


def write_inputs(path: pathlib.Path, feeds: dict) -> None:
    with open(path, "wb") as f:
        for name, arr in feeds.items():
            arr = np.ascontiguousarray(arr)
            raw = name.encode()
            f.write(struct.pack("<I", len(raw)) + raw)
            f.write(struct.pack("<iI", helper.np_dtype_to_tensor_dtype(arr.dtype), arr.ndim))
            f.write(struct.pack(f"<{arr.ndim}q", *arr.shape))
            data = arr.astype(arr.dtype.newbyteorder("<")).tobytes()
            f.write(struct.pack("<Q", len(data)) + data)


def shape_family_case():
    """A decode-like loop of signatures: x [1, L] with L from 2 to 17, its Shape picking a row of a
    table (host-folded, eager) that enters a chain over h [1, 8] ending in a product by a
    constant [8, 4096] (compiled segments, their walks kept and computed again: cache_size=1
    makes every run a new signature)."""
    from onnx import TensorProto
    table = (np.arange(64 * 8, dtype=np.float32).reshape(64, 8) % 13) / 10.0
    w = ((np.arange(8 * 4096, dtype=np.float32).reshape(8, 4096) % 7) - 3) / 4
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Gather", ["s", "one"], ["l"], axis=0),
             helper.make_node("Add", ["l", "one"], ["l1"]),
             helper.make_node("Slice", ["table", "l", "l1", "zero"], ["row"]),
             helper.make_node("Mul", ["h", "two"], ["h1"]),
             helper.make_node("Add", ["h1", "row"], ["h2"]),
             helper.make_node("Tanh", ["h2"], ["h3"]),
             helper.make_node("ReduceSum", ["x"], ["r"], keepdims=1),
             helper.make_node("Add", ["h3", "r"], ["h4"]),
             helper.make_node("Sigmoid", ["h4"], ["h5"]),
             helper.make_node("Mul", ["h5", "h4"], ["y"]),
             helper.make_node("MatMul", ["y", "w"], ["yw"])]
    inits = [numpy_helper.from_array(table, "table"), numpy_helper.from_array(w, "w"),
             numpy_helper.from_array(np.array([1], np.int64), "one"),
             numpy_helper.from_array(np.array([0], np.int64), "zero"),
             numpy_helper.from_array(np.array(2.0, np.float32), "two")]
    g = helper.make_graph(nodes, "shape_family",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "L"]),
                           helper.make_tensor_value_info("h", TensorProto.FLOAT, [1, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8]),
                           helper.make_tensor_value_info("yw", TensorProto.FLOAT, [1, 4096])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    rng = np.random.default_rng(4)
    h = rng.uniform(-1, 1, (1, 8)).astype(np.float32)
    sets = [{"x": rng.uniform(-1, 1, (1, L)).astype(np.float32), "h": h} for L in range(2, 18)]
    return "shape_family", m.SerializeToString(), sets, "cache_size=1\n"


def llm_prompt_case():
    """A Llama layer's prompt kernels: GroupQueryAttention over a packed projection with rotary
    caches (272 rows of 8 heads and 2 KV heads of 64: the prompt layout kernel's rows split over
    the threads), its output into the MLP's products (272 rows: split by rows) and gate,
    Sigmoid -> Mul -> Mul(up), over 272 x 1536 values (the gate kernel, split too)."""
    from onnx import TensorProto
    S, N, Nkv, H, F = 272, 8, 2, 64, 1536
    rng = np.random.default_rng(9)
    pos = np.arange(S + 8, dtype=np.float32)[:, None] / (10000 ** (np.arange(H // 2, dtype=np.float32) / (H // 2)))
    inits = [numpy_helper.from_array(np.cos(pos).astype(np.float32), "cos"),
             numpy_helper.from_array(np.sin(pos).astype(np.float32), "sin"),
             numpy_helper.from_array((rng.standard_normal((N * H, F)) / 16).astype(np.float32), "wg"),
             numpy_helper.from_array((rng.standard_normal((N * H, F)) / 16).astype(np.float32), "wu"),
             numpy_helper.from_array(np.array([S - 1], np.int32), "seqlens"),
             numpy_helper.from_array(np.array(S, np.int32), "total")]
    nodes = [helper.make_node("GroupQueryAttention", ["qkv", "", "", "", "", "seqlens", "total", "cos", "sin"],
                              ["a"], domain="com.microsoft", num_heads=N, kv_num_heads=Nkv, do_rotary=1),
             helper.make_node("MatMul", ["a", "wg"], ["g"]), helper.make_node("MatMul", ["a", "wu"], ["u"]),
             helper.make_node("Sigmoid", ["g"], ["sg"]), helper.make_node("Mul", ["g", "sg"], ["silu"]),
             helper.make_node("Mul", ["silu", "u"], ["y"])]
    g = helper.make_graph(nodes, "llm_prompt",
                          [helper.make_tensor_value_info("qkv", TensorProto.FLOAT, [1, S, (N + 2 * Nkv) * H])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, S, F])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    m.ir_version = 8
    feeds = {"qkv": rng.standard_normal((1, S, (N + 2 * Nkv) * H)).astype(np.float32)}
    return "llm_prompt", m.SerializeToString(), [feeds], ""


def _float_case(name, nodes, inits, x_shape, y_shape, rng):
    """A case of one float32 input x and output y: (name, model bytes, [feeds], options)."""
    from onnx import TensorProto
    g = helper.make_graph(nodes, name, [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(y_shape))], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return name, m.SerializeToString(), [{"x": rng.standard_normal(x_shape).astype(np.float32)}], ""


def row_tile_products_case():
    """A decode step's products: 3 rows (one row tile) by constant weights of 200 and 80 columns,
    their columns split over the threads in 16s with a panel of 48 shared at the boundary
    (cpu_packed_stream's walk), a fused bias and a Relu between them."""
    rng = np.random.default_rng(11)
    inits = [numpy_helper.from_array((rng.standard_normal((256, 200)) / 16).astype(np.float32), "w1"),
             numpy_helper.from_array(rng.standard_normal(200).astype(np.float32), "b1"),
             numpy_helper.from_array((rng.standard_normal((200, 80)) / 16).astype(np.float32), "w2")]
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["p"]), helper.make_node("Add", ["p", "b1"], ["h"]),
             helper.make_node("Relu", ["h"], ["r"]), helper.make_node("MatMul", ["r", "w2"], ["y"])]
    return _float_case("row_tile_products", nodes, inits, (3, 256), (3, 80), rng)


def gelu_products_case():
    """An encoder's feed-forward products: 40 rows (five row tiles, panels split between the
    threads, each tile asking ahead: cpu_packed_ahead) by a constant of 200 columns (a ragged last
    panel) with a fused bias and the GELU written out after it, which the kernel applies to each
    tile as it stores it (cpu_product_gelu), then a product of 700 deep (two K blocks of 512)."""
    rng = np.random.default_rng(13)
    inits = [numpy_helper.from_array((rng.standard_normal((96, 200)) / 8).astype(np.float32), "w1"),
             numpy_helper.from_array(rng.standard_normal(200).astype(np.float32), "b1"),
             numpy_helper.from_array(np.array(np.sqrt(2), np.float32), "c"),
             numpy_helper.from_array(np.array(1, np.float32), "one"),
             numpy_helper.from_array(np.array(0.5, np.float32), "half"),
             numpy_helper.from_array((rng.standard_normal((200, 700)) / 16).astype(np.float32), "w2"),
             numpy_helper.from_array((rng.standard_normal((700, 64)) / 32).astype(np.float32), "w3")]
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["p"]), helper.make_node("Add", ["p", "b1"], ["h"]),
             helper.make_node("Div", ["h", "c"], ["d"]), helper.make_node("Erf", ["d"], ["e"]),
             helper.make_node("Add", ["e", "one"], ["a"]), helper.make_node("Mul", ["h", "a"], ["m"]),
             helper.make_node("Mul", ["m", "half"], ["g"]), helper.make_node("MatMul", ["g", "w2"], ["q"]),
             helper.make_node("MatMul", ["q", "w3"], ["y"])]
    name, model, feeds, _ = _float_case("gelu_products", nodes, inits, (40, 96), (40, 64), rng)
    return name, model, feeds, "cpu_packed_depth=512\n"  # (K in blocks of 512: 700 deep takes two)


def encoder_attention_case():
    """An encoder layer's attention and residual norm: 2 x 20 rows of 72 (two heads of 36), Q, K
    and V products, scores divided by sqrt(36), softmax, times V (cpu_attention: query rows eight
    at a time and a block of four, K transposed in 16 x 16 blocks with edges), then the residual
    Add and LayerNormalization as one row kernel (16 lanes, a masked tail of 8)."""
    from onnx import TensorProto
    rng = np.random.default_rng(17)
    B, S, N, H = 2, 20, 2, 36
    E = N * H
    w = lambda n: numpy_helper.from_array((rng.standard_normal((E, E)) / 8).astype(np.float32), n)  # noqa: E731
    nodes, inits = attention_nodes(B, S, N, H, mask=False, out="a")
    inits += [w("wq"), w("wk"), w("wv"), numpy_helper.from_array(rng.standard_normal(E).astype(np.float32), "g"),
              numpy_helper.from_array(rng.standard_normal(E).astype(np.float32), "b")]
    nodes = [helper.make_node("MatMul", ["x", "w" + n], [n]) for n in "qkv"] + nodes
    nodes += [helper.make_node("Add", ["a", "x"], ["r"]),
              helper.make_node("LayerNormalization", ["r", "g", "b"], ["y"], axis=-1, epsilon=1e-5)]
    g = helper.make_graph(nodes, "encoder_attention", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [B, S, E])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [B, S, E])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return "encoder_attention", m.SerializeToString(), [{"x": rng.standard_normal((B, S, E)).astype(np.float32)}], ""


def main() -> int:
    out = pathlib.Path(sys.argv[1])
    cases = [(name, model, [feeds], "") for name, model, feeds in load_cases()]
    cases.append(shape_family_case())
    cases.append(llm_prompt_case())
    cases.append(row_tile_products_case())
    cases.append(gelu_products_case())
    cases.append(encoder_attention_case())
    for name, model, sets, options in cases:
        d = out / name
        d.mkdir(parents=True, exist_ok=True)
        (d / "model.onnx").write_bytes(model)
        for k, feeds in enumerate(sets):
            write_inputs(d / ("inputs.bin" if k == 0 else f"inputs.{k}.bin"), feeds)
        if options:
            (d / "options.txt").write_text(options)
        print(d)
    return 0


if __name__ == "__main__":
    sys.exit(main())
