"""Writes the small models the per-run floor is measured on (fixed weights from a seed):
chain10.onnx, ten nodes over a [1, 64] input (MatMul, Add, Relu, MatMul, Add, Tanh, Mul,
Sigmoid, Mul, Softmax), the size of a wake-word head; head3.onnx, a classifier head of that
kind's shape (16 frames x 96 features flattened, Gemm 1536 -> 128, LayerNormalization, Relu,
Gemm 128 -> 128, LayerNormalization, Relu, Gemm 128 -> 1, Sigmoid); mm_M_K_N.onnx, one MatMul of an [M, K]
input by a constant [K, N] weight, for the encoder's and a prompt's product shapes;
attention_B_S.onnx, MiniLM's attention nodes alone (q, k, v [B, S, 384] in: Reshape to 12 heads
of 32, Transposes, MatMul, Div by sqrt(32), Add of a [B, 1, 1, S] mask, Softmax, MatMul,
Transpose, Reshape); and addnorm_B_S.onnx, an encoder's residual Add and LayerNormalization over
[B, S, 384].

    python tools/tiny_models.py OUT_DIR"""
import pathlib
import sys

import numpy as np
import onnx
from onnx import TensorProto as TP, helper, numpy_helper


def chain10():
    rng = np.random.default_rng(0)
    w = lambda *s: rng.standard_normal(s).astype(np.float32) * 0.1  # noqa: E731
    inits = [numpy_helper.from_array(a, n) for n, a in
             [("w1", w(64, 64)), ("b1", w(64)), ("w2", w(64, 32)), ("b2", w(32)), ("k", w(32))]]
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["a"]), helper.make_node("Add", ["a", "b1"], ["b"]),
             helper.make_node("Relu", ["b"], ["c"]), helper.make_node("MatMul", ["c", "w2"], ["d"]),
             helper.make_node("Add", ["d", "b2"], ["e"]), helper.make_node("Tanh", ["e"], ["f"]),
             helper.make_node("Mul", ["f", "k"], ["g"]), helper.make_node("Sigmoid", ["g"], ["h"]),
             helper.make_node("Mul", ["g", "h"], ["i"]), helper.make_node("Softmax", ["i"], ["y"], axis=-1)]
    g = helper.make_graph(nodes, "chain10", [helper.make_tensor_value_info("x", TP.FLOAT, [1, 64])],
                          [helper.make_tensor_value_info("y", TP.FLOAT, [1, 32])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 9
    return m


PRODUCTS = [(16, 384, 384), (16, 384, 1536), (16, 1536, 384), (128, 384, 1536), (1024, 384, 384),
            (1024, 384, 1536), (1024, 1536, 384)]


def head3():
    rng = np.random.default_rng(1)
    w = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    inits = [numpy_helper.from_array(a, n) for n, a in
             [("w1", w(1536, 128) * 0.03), ("b1", w(128) * 0.1), ("g1", np.ones(128, np.float32)),
              ("c1", np.zeros(128, np.float32)), ("w2", w(128, 128) * 0.1), ("b2", w(128) * 0.1),
              ("g2", np.ones(128, np.float32)), ("c2", np.zeros(128, np.float32)), ("w3", w(128, 1) * 0.1),
              ("b3", np.zeros(1, np.float32)), ("shape", np.array([1, 1536], np.int64))]]
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["f"]), helper.make_node("Gemm", ["f", "w1", "b1"], ["h1"]),
             helper.make_node("LayerNormalization", ["h1", "g1", "c1"], ["n1"], axis=-1),
             helper.make_node("Relu", ["n1"], ["r1"]), helper.make_node("Gemm", ["r1", "w2", "b2"], ["h2"]),
             helper.make_node("LayerNormalization", ["h2", "g2", "c2"], ["n2"], axis=-1),
             helper.make_node("Relu", ["n2"], ["r2"]), helper.make_node("Gemm", ["r2", "w3", "b3"], ["h3"]),
             helper.make_node("Sigmoid", ["h3"], ["y"])]
    g = helper.make_graph(nodes, "head3", [helper.make_tensor_value_info("x", TP.FLOAT, [1, 16, 96])],
                          [helper.make_tensor_value_info("y", TP.FLOAT, [1, 1])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def product(m, k, n):
    w = np.random.default_rng(k * n).standard_normal((k, n)).astype(np.float32) * 0.05
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "mm",
                          [helper.make_tensor_value_info("x", TP.FLOAT, [m, k])],
                          [helper.make_tensor_value_info("y", TP.FLOAT, [m, n])], [numpy_helper.from_array(w, "w")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    return model


def attention_nodes(b, s, heads, d, mask, out):
    """An encoder's attention as exporters write it, (nodes, initializers): q, k, v [b, s, heads
    d] in, out [b, s, heads d]; the scores divided by sqrt(d), plus the [b, 1, 1, s] input "mask"
    with `mask`."""
    inits = [numpy_helper.from_array(np.array([b, s, heads, d], np.int64), "s4"),
             numpy_helper.from_array(np.array([b, s, heads * d], np.int64), "s3"),
             numpy_helper.from_array(np.array(np.sqrt(d), np.float32), "c")]
    nodes = [helper.make_node("Reshape", [n, "s4"], [n + "4"]) for n in "qkv"]
    nodes += [helper.make_node("Transpose", ["q4"], ["qt"], perm=[0, 2, 1, 3]),
              helper.make_node("Transpose", ["k4"], ["kt"], perm=[0, 2, 3, 1]),
              helper.make_node("Transpose", ["v4"], ["vt"], perm=[0, 2, 1, 3]),
              helper.make_node("MatMul", ["qt", "kt"], ["sc"]), helper.make_node("Div", ["sc", "c"], ["sd"])]
    if mask:
        nodes.append(helper.make_node("Add", ["sd", "mask"], ["sm"]))
    nodes += [helper.make_node("Softmax", ["sm" if mask else "sd"], ["p"], axis=-1),
              helper.make_node("MatMul", ["p", "vt"], ["o"]),
              helper.make_node("Transpose", ["o"], ["ot"], perm=[0, 2, 1, 3]),
              helper.make_node("Reshape", ["ot", "s3"], [out])]
    return nodes, inits


def attention(b, s, heads=12, d=32):
    e = heads * d
    nodes, inits = attention_nodes(b, s, heads, d, mask=True, out="y")
    g = helper.make_graph(nodes, "attention", [helper.make_tensor_value_info(n, TP.FLOAT, [b, s, e]) for n in "qkv"]
                          + [helper.make_tensor_value_info("mask", TP.FLOAT, [b, 1, 1, s])],
                          [helper.make_tensor_value_info("y", TP.FLOAT, [b, s, e])], inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    return model


def addnorm(b, s, e=384):
    rng = np.random.default_rng(e)
    inits = [numpy_helper.from_array(rng.standard_normal(e).astype(np.float32), n) for n in ("g", "beta")]
    nodes = [helper.make_node("Add", ["x", "r"], ["a"]),
             helper.make_node("LayerNormalization", ["a", "g", "beta"], ["y"], axis=-1, epsilon=1e-12)]
    g = helper.make_graph(nodes, "addnorm", [helper.make_tensor_value_info(n, TP.FLOAT, [b, s, e]) for n in "xr"],
                          [helper.make_tensor_value_info("y", TP.FLOAT, [b, s, e])], inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    return model


if __name__ == "__main__":
    out = pathlib.Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    onnx.save(chain10(), out / "chain10.onnx")
    print(out / "chain10.onnx")
    onnx.save(head3(), out / "head3.onnx")
    print(out / "head3.onnx")
    for m, k, n in PRODUCTS:
        onnx.save(product(m, k, n), out / f"mm_{m}_{k}_{n}.onnx")
        print(out / f"mm_{m}_{k}_{n}.onnx")
    for b, s in ((1, 128), (8, 128), (8, 256)):
        onnx.save(attention(b, s), out / f"attention_{b}_{s}.onnx")
        print(out / f"attention_{b}_{s}.onnx")
    onnx.save(addnorm(8, 128), out / "addnorm_8_128.onnx")
    print(out / "addnorm_8_128.onnx")
