"""The built-in demo model: a small 2-layer transformer encoder, built with onnx.helper.

It is written the way real exporters (torch.onnx, tf2onnx) write encoders, so that the demo
exercises what real models need, not a hand-tidied graph:
  - symbolic dims `batch` and `seq` on the input;
  - the head split computes its target shape at run time (Shape -> Gather -> Unsqueeze ->
    Concat -> Reshape), instead of using a constant shape;
  - GELU spelled out as x * 0.5 * (1 + Erf(x / sqrt(2))), as exporters emit it at opset 17.

Weights are drawn from a seeded numpy generator, so the model is byte-for-byte the same on every
machine. Size: d_model 128, 4 heads, MLP 512, 2 layers -> about 0.8 MB.

    python -m onnxruntime_mlx demo-model [PATH] [--force]   # default build/demo_model.onnx
"""
from __future__ import annotations

import pathlib
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

D_MODEL = 128
N_HEADS = 4
D_HEAD = D_MODEL // N_HEADS
D_MLP = 4 * D_MODEL
N_LAYERS = 2
OPSET = 17
SEED = 20241129


class _Builder:
    """Collects nodes and initializers; names every value uniquely."""

    def __init__(self, rng: np.random.Generator):
        self.rng = rng
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self._count: dict[str, int] = {}

    def name(self, base: str) -> str:
        n = self._count.get(base, 0)
        self._count[base] = n + 1
        return f"{base}_{n}" if n else base

    def const(self, base: str, value: np.ndarray) -> str:
        name = self.name(base)
        self.inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def weight(self, base: str, shape: tuple[int, ...], scale: float) -> str:
        w = (self.rng.standard_normal(shape) * scale).astype(np.float32)
        return self.const(base, w)

    def op(self, op_type: str, inputs: list[str], base: str, n_out: int = 1, **attrs) -> str | list[str]:
        node_name = self.name(base)
        outs = [f"{node_name}_out{i}" if n_out > 1 else f"{node_name}_out" for i in range(n_out)]
        self.nodes.append(helper.make_node(op_type, inputs, outs, name=node_name, **attrs))
        return outs if n_out > 1 else outs[0]

    # -- blocks --------------------------------------------------------------------------
    def linear(self, x: str, d_in: int, d_out: int, base: str) -> str:
        w = self.weight(f"{base}.weight", (d_in, d_out), 1.0 / np.sqrt(d_in))
        b = self.weight(f"{base}.bias", (d_out,), 0.02)
        y = self.op("MatMul", [x, w], f"{base}/MatMul")
        return self.op("Add", [y, b], f"{base}/Add")

    def layer_norm(self, x: str, base: str) -> str:
        gamma = self.const(f"{base}.weight",
                           (1.0 + 0.1 * self.rng.standard_normal(D_MODEL)).astype(np.float32))
        beta = self.const(f"{base}.bias", (0.05 * self.rng.standard_normal(D_MODEL)).astype(np.float32))
        return self.op("LayerNormalization", [x, gamma, beta], f"{base}/LayerNormalization",
                       axis=-1, epsilon=1e-5)

    def dim(self, shape: str, index: int, base: str) -> str:
        """Shape[index] as a 1-element int64 tensor (Gather with a scalar index + Unsqueeze)."""
        idx = self.const(f"{base}.idx", np.array(index, dtype=np.int64))
        d = self.op("Gather", [shape, idx], f"{base}/Gather", axis=0)
        axes = self.const(f"{base}.axes", np.array([0], dtype=np.int64))
        return self.op("Unsqueeze", [d, axes], f"{base}/Unsqueeze")

    def split_heads(self, x: str, base: str) -> str:
        """[B, S, D] -> [B, H, S, Dh] with the shape computed at run time."""
        shape = self.op("Shape", [x], f"{base}/Shape")
        b = self.dim(shape, 0, f"{base}/batch")
        s = self.dim(shape, 1, f"{base}/seq")
        tail = self.const(f"{base}.heads", np.array([N_HEADS, D_HEAD], dtype=np.int64))
        target = self.op("Concat", [b, s, tail], f"{base}/Concat", axis=0)
        y = self.op("Reshape", [x, target], f"{base}/Reshape")
        return self.op("Transpose", [y], f"{base}/Transpose", perm=[0, 2, 1, 3])

    def merge_heads(self, x: str, like: str, base: str) -> str:
        """[B, H, S, Dh] -> [B, S, D], the target shape taken from `like` ([B, S, D])."""
        y = self.op("Transpose", [x], f"{base}/Transpose", perm=[0, 2, 1, 3])
        shape = self.op("Shape", [like], f"{base}/Shape")
        b = self.dim(shape, 0, f"{base}/batch")
        s = self.dim(shape, 1, f"{base}/seq")
        tail = self.const(f"{base}.model", np.array([D_MODEL], dtype=np.int64))
        target = self.op("Concat", [b, s, tail], f"{base}/Concat", axis=0)
        return self.op("Reshape", [y, target], f"{base}/Reshape")

    def attention(self, x: str, base: str) -> str:
        q = self.split_heads(self.linear(x, D_MODEL, D_MODEL, f"{base}/q_proj"), f"{base}/q")
        k = self.split_heads(self.linear(x, D_MODEL, D_MODEL, f"{base}/k_proj"), f"{base}/k")
        v = self.split_heads(self.linear(x, D_MODEL, D_MODEL, f"{base}/v_proj"), f"{base}/v")
        kt = self.op("Transpose", [k], f"{base}/k/TransposeT", perm=[0, 1, 3, 2])
        scores = self.op("MatMul", [q, kt], f"{base}/scores/MatMul")
        scale = self.const(f"{base}.sqrt_dh", np.array(np.sqrt(D_HEAD), dtype=np.float32))
        scores = self.op("Div", [scores, scale], f"{base}/scores/Div")
        probs = self.op("Softmax", [scores], f"{base}/Softmax", axis=-1)
        ctx = self.op("MatMul", [probs, v], f"{base}/context/MatMul")
        ctx = self.merge_heads(ctx, x, f"{base}/merge")
        return self.linear(ctx, D_MODEL, D_MODEL, f"{base}/o_proj")

    def gelu(self, x: str, base: str) -> str:
        sqrt2 = self.const(f"{base}.sqrt2", np.array(np.sqrt(2.0), dtype=np.float32))
        one = self.const(f"{base}.one", np.array(1.0, dtype=np.float32))
        half = self.const(f"{base}.half", np.array(0.5, dtype=np.float32))
        t = self.op("Div", [x, sqrt2], f"{base}/Div")
        t = self.op("Erf", [t], f"{base}/Erf")
        t = self.op("Add", [t, one], f"{base}/Add")
        y = self.op("Mul", [x, half], f"{base}/Mul")
        return self.op("Mul", [y, t], f"{base}/Mul_1")

    def layer(self, x: str, i: int) -> str:
        base = f"/encoder/layer.{i}"
        h = self.layer_norm(x, f"{base}/ln1")
        x = self.op("Add", [x, self.attention(h, f"{base}/attention")], f"{base}/residual1/Add")
        h = self.layer_norm(x, f"{base}/ln2")
        h = self.linear(h, D_MODEL, D_MLP, f"{base}/mlp/fc1")
        h = self.gelu(h, f"{base}/mlp/gelu")
        h = self.linear(h, D_MLP, D_MODEL, f"{base}/mlp/fc2")
        return self.op("Add", [x, h], f"{base}/residual2/Add")


def build(seed: int = SEED) -> onnx.ModelProto:
    """The demo encoder as an in-memory ModelProto (deterministic for a given seed)."""
    b = _Builder(np.random.default_rng(seed))
    x = "input"
    for i in range(N_LAYERS):
        x = b.layer(x, i)
    x = b.layer_norm(x, "/encoder/final_ln")
    b.nodes[-1].output[0] = "output"
    graph = helper.make_graph(
        b.nodes, "demo_encoder",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", "seq", D_MODEL])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["batch", "seq", D_MODEL])],
        b.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name="onnxruntime_mlx.demo_model")
    model.ir_version = 8  # the IR version of opset 17's ONNX release (1.12)
    onnx.checker.check_model(model, full_check=True)
    return model


def default_path() -> pathlib.Path:
    return pathlib.Path(__file__).resolve().parents[2] / "build" / "demo_model.onnx"


def save(path: str | pathlib.Path | None = None, force: bool = False) -> pathlib.Path:
    """Writes the model to `path` (default build/demo_model.onnx) unless it exists already."""
    p = pathlib.Path(path) if path else default_path()
    if force or not p.is_file():
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp = p.with_suffix(".onnx.tmp")
        onnx.save(build(), str(tmp))
        tmp.replace(p)  # atomic: a concurrent reader never sees half a file
    return p


def add_arguments(ap) -> None:
    ap.add_argument("path", nargs="?", help="where to write it (default build/demo_model.onnx)")
    ap.add_argument("--force", action="store_true", help="rewrite it if it exists")


def run(args) -> int:
    print(save(args.path, force=args.force))
    return 0


if __name__ == "__main__":
    print(save(sys.argv[1] if len(sys.argv) > 1 else None, force=True))
