"""Writes the small models the per-run floor is measured on (fixed weights from a seed):
chain10.onnx, ten nodes over a [1, 64] input (MatMul, Add, Relu, MatMul, Add, Tanh, Mul,
Sigmoid, Mul, Softmax), the size of a wake-word head.

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


if __name__ == "__main__":
    out = pathlib.Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    onnx.save(chain10(), out / "chain10.onnx")
    print(out / "chain10.onnx")
