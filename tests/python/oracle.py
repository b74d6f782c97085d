"""The op oracle: build a small ONNX model, run it on the MLX EP with
session.disable_cpu_ep_fallback=1 (so the session fails unless every node runs on MLX) and on
ORT's CPU EP, and compare outputs within a per-dtype tolerance.

    from oracle import check_node
    check_node("Add", {"a": x, "b": y})                    # one node, inputs from numpy
    check_node("Gemm", {"a": a, "b": b}, attrs={"transB": 1}, initializers={"c": c})
    check_model(model, feeds)                              # any model
"""
from __future__ import annotations

import os

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper, numpy_helper

import onnxruntime_mlx as om

# (rtol, atol) per output dtype; integers and bool must match exactly.
TOLERANCE = {
    np.dtype(np.float32): (1e-4, 1e-5),
    np.dtype(np.float64): (1e-7, 1e-9),
    np.dtype(np.float16): (1e-2, 1e-3),
}
BF16_TOL = (2e-2, 1e-2)

DEFAULT_OPSET = 21
# The MLX device the oracle runs on: cpu (CI) or gpu (scripts/gpu-test on a CUDA build of MLX).
DEVICE = os.environ.get("ORT_MLX_TEST_DEVICE", "cpu")
if DEVICE == "gpu":
    # The oracle is ORT's CPU EP, which quantizes MatMulNBits activations to int8 at
    # accuracy_level 4: compare like with like (the GPU's default keeps them in float).
    os.environ.setdefault("ORT_MLX_INT8_EMULATION", "1")


def tensor_type(arr: np.ndarray) -> int:
    return helper.np_dtype_to_tensor_dtype(arr.dtype)


def make_node_model(op_type: str, inputs: dict, outputs: int | list = 1, attrs: dict | None = None,
                    initializers: dict | None = None, opset: int = DEFAULT_OPSET,
                    domain: str = "", output_types: list | None = None,
                    input_order: list | None = None) -> onnx.ModelProto:
    """One-node model. `inputs`/`initializers` map names to numpy arrays (None = omitted input);
    `input_order` fixes the node's input order when both dicts are used."""
    initializers = initializers or {}
    order = input_order or (list(inputs) + list(initializers))
    graph_inputs = [helper.make_tensor_value_info(n, tensor_type(a), list(a.shape))
                    for n, a in inputs.items() if a is not None]
    inits = [numpy_helper.from_array(a, n) for n, a in initializers.items() if a is not None]
    out_names = outputs if isinstance(outputs, list) else [f"out{i}" for i in range(outputs)]
    node_inputs = [n if (inputs.get(n) is not None or initializers.get(n) is not None) else ""
                   for n in order]
    node = helper.make_node(op_type, node_inputs, out_names, domain=domain, **(attrs or {}))
    graph_outputs = [helper.make_tensor_value_info(n, (output_types or [0] * len(out_names))[i], None)
                     for i, n in enumerate(out_names)]
    g = helper.make_graph([node], f"{op_type}_test", graph_inputs, graph_outputs, inits)
    opsets = [helper.make_opsetid("", opset)]
    if domain:
        opsets.append(helper.make_opsetid(domain, 1))
    m = helper.make_model(g, opset_imports=opsets)
    m.ir_version = 10
    # Let ONNX fill the output types (shape inference), so ORT sees a valid model.
    try:
        m = onnx.shape_inference.infer_shapes(m, strict_mode=False)
        inferred = {v.name: v for v in m.graph.value_info}
        for o in m.graph.output:
            if o.type.tensor_type.elem_type == 0 and o.name in inferred:
                o.CopyFrom(inferred[o.name])
    except Exception:
        pass
    return m


def run_cpu(model: onnx.ModelProto, feeds: dict) -> list:
    s = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return s.run(None, feeds)


# Runs of each oracle model: the engine compiles on the 2nd run; on the GPU a signature is kept
# as one CUDA graph on its 4th and the graph launched on the 5th (gpu_graph_replay): every
# path's result is checked.
DEFAULT_RUNS = 5 if DEVICE == "gpu" else 3


def run_mlx(model: onnx.ModelProto, feeds: dict, fallback: bool = False, runs: int | None = None,
            **options) -> tuple[list, dict]:
    """Runs `runs` times (DEFAULT_RUNS: eager, compiled and, on the GPU, kept-graph runs) and
    returns the last outputs and ORT's placement. Every run's result must agree."""
    runs = DEFAULT_RUNS if runs is None else runs
    if DEVICE == "gpu" and not fallback and uses_float64(model, feeds):
        import pytest
        pytest.skip("float64 is declined on the GPU at claim time (MLX has no GPU float64); "
                    "check_model covers the decline")
    so = ort.SessionOptions()
    # ORT's graph optimizer would constant-fold Shape/Constant/... before the EP sees them; the
    # oracle tests what the EP does with every node of the model.
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so = om.record_assignment(om.session_options(DEVICE, fallback=fallback, so=so, **options))
    s = ort.InferenceSession(model.SerializeToString(), sess_options=so)
    first = None
    for _ in range(runs):
        outs = s.run(None, feeds)
        if first is None:
            first = outs
        else:
            for a, b in zip(first, outs):
                if DEVICE == "gpu" and uses_16bit_floats(model):
                    # compiled CUDA kernels keep fp16/bf16 intermediates in float32
                    np.testing.assert_allclose(np.asarray(a, np.float64), np.asarray(b, np.float64),
                                               rtol=2e-2, atol=2e-2, err_msg="eager vs compiled run")
                elif DEVICE == "gpu":  # fused CUDA kernels may contract to FMA: 1-ulp differences
                    assert_close(a, b, name="eager vs compiled run")
                else:
                    np.testing.assert_array_equal(a, b, err_msg="eager and compiled runs differ")
    return outs, om.placement(s)


def assert_close(actual, expected, name="output"):
    actual = np.asarray(actual)
    expected = np.asarray(expected)
    assert actual.shape == expected.shape, f"{name}: shape {actual.shape} != {expected.shape}"
    assert actual.dtype == expected.dtype, f"{name}: dtype {actual.dtype} != {expected.dtype}"
    if actual.dtype.kind in "fc" or str(actual.dtype) == "bfloat16":
        rtol, atol = TOLERANCE.get(actual.dtype, BF16_TOL)
        np.testing.assert_allclose(actual.astype(np.float64), expected.astype(np.float64),
                                   rtol=rtol, atol=atol, equal_nan=True, err_msg=name)
    else:
        np.testing.assert_array_equal(actual, expected, err_msg=name)


def uses_16bit_floats(model: onnx.ModelProto) -> bool:
    half = (onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16)
    values = list(model.graph.input) + list(model.graph.output) + list(model.graph.value_info)
    return (any(v.type.tensor_type.elem_type in half for v in values) or
            any(t.data_type in half for t in model.graph.initializer) or
            any(a.name in ("to", "output_dtype", "dtype") and a.i in half
                for n in model.graph.node for a in n.attribute))


def uses_float64(model: onnx.ModelProto, feeds: dict) -> bool:
    if any(np.asarray(v).dtype == np.float64 for v in feeds.values()):
        return True
    if any(t.data_type == onnx.TensorProto.DOUBLE for t in model.graph.initializer):
        return True
    return any(o.type.tensor_type.elem_type == onnx.TensorProto.DOUBLE for o in model.graph.output)


def check_model(model: onnx.ModelProto, feeds: dict, expected: list | None = None,
                require_all_on_mlx: bool = True, **options) -> list:
    """Compares the MLX EP with ORT's CPU EP (or `expected`). With require_all_on_mlx the
    session is created with CPU fallback disabled, and placement must show only MLX."""
    ref = expected if expected is not None else run_cpu(model, feeds)
    if DEVICE == "gpu" and uses_float64(model, feeds):
        # MLX has no float64 on GPUs: such nodes must be declined at claim time and still run
        # correctly on ORT's CPU EP.
        try:
            outs, placed = run_mlx(model, feeds, fallback=True, runs=1)
        except ort.capi.onnxruntime_pybind11_state.NotImplemented as e:
            import pytest
            pytest.skip(f"float64: declined on the GPU, and ORT's CPU EP has no kernel either ({e})")
        assert om.EP_NAME not in placed or len(placed[om.EP_NAME]) < len(model.graph.node)
        for i, (a, e) in enumerate(zip(outs, ref)):
            assert_close(a, e, name=f"output {i}")
        return outs
    outs, placed = run_mlx(model, feeds, fallback=not require_all_on_mlx, **options)
    if require_all_on_mlx:
        assert set(placed) == {om.EP_NAME}, f"nodes not on MLX: {placed}"
        n_nodes = len(model.graph.node)
        assert len(placed[om.EP_NAME]) == n_nodes, f"only {placed[om.EP_NAME]} of {n_nodes} on MLX"
    assert len(outs) == len(ref)
    for i, (a, e) in enumerate(zip(outs, ref)):
        assert_close(a, e, name=f"output {i}")
    return outs


def check_node(op_type: str, inputs: dict, attrs: dict | None = None, *, outputs: int = 1,
               initializers: dict | None = None, opset: int = DEFAULT_OPSET, domain: str = "",
               expected: list | None = None, input_order: list | None = None, **options):
    """One-node oracle test: the node must run on MLX and match the CPU EP (or `expected`)."""
    model = make_node_model(op_type, inputs, outputs, attrs, initializers, opset, domain,
                            input_order=input_order)
    feeds = {k: v for k, v in inputs.items() if v is not None}
    return check_model(model, feeds, expected=expected, **options)


def placement_of(model: onnx.ModelProto, feeds: dict) -> dict:
    """Runs with CPU fallback allowed and returns ORT's placement (for decline tests)."""
    return run_mlx(model, feeds, fallback=True, runs=1)[1]
