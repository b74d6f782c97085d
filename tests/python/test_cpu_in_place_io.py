"""ORT's tensors read and written where they are on MLX's CPU device (cpu_in_place_io,
kernels/cpu/buffers.h): inputs are views over ORT's buffers, and outputs the EP's kernels compute
are written into ORT's output buffers, without a copy either way."""
import gc

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import onnxruntime_mlx as om
from onnxruntime_mlx import runner


def _model():
    # y: a concatenation (the EP's ChunkConcat kernel: written in place); z: Relu of it (an MLX
    # op: copied out); w: a chain over x alone, whose buffers MLX would reuse for its results
    # if it owned them.
    nodes = [helper.make_node("Concat", ["a", "b"], ["y"], axis=2), helper.make_node("Relu", ["y"], ["z"]),
             helper.make_node("Add", ["x", "x"], ["x2"]), helper.make_node("Exp", ["x2"], ["x3"]),
             helper.make_node("Neg", ["x3"], ["w"])]
    f = lambda n, s: helper.make_tensor_value_info(n, TensorProto.FLOAT, s)
    g = helper.make_graph(nodes, "g", [f("a", [1, 4, "t", 1024]), f("b", [1, 4, 1, 1024]), f("x", ["n"])],
                          [f("y", None), f("z", None), f("w", None)])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


@pytest.mark.parametrize("in_place", [1, 0])
def test_ort_buffers_read_and_written_in_place(in_place, tmp_path):
    """Every run's three inputs (each 16 KiB or more: smaller tensors are copied, which costs
    less) are read in place and the concatenation is written into ORT's
    output (a new length each run, then one length kept and replayed); the inputs ORT hands in
    are never written (their numpy arrays are the very buffers); outputs equal numpy's. With
    cpu_in_place_io=0 inputs are copied and outputs copied out."""
    report = tmp_path / "report.jsonl"
    so = om.record_assignment(om.session_options("cpu", fallback=False, report_path=str(report),
                                                cpu_in_place_io=in_place))
    s = ort.InferenceSession(_model(), sess_options=so)
    assert set(om.placement(s)) == {om.EP_NAME}
    rng = np.random.default_rng(0)
    lengths = list(range(5, 15)) + [20] * 30
    for t in lengths:
        a = rng.standard_normal((1, 4, t, 1024)).astype(np.float32)
        b = rng.standard_normal((1, 4, 1, 1024)).astype(np.float32)
        x = rng.standard_normal(8192).astype(np.float32)
        kept = [a.copy(), b.copy(), x.copy()]
        y, z, w = s.run(None, {"a": a, "b": b, "x": x})
        for before, now in zip(kept, (a, b, x)):
            np.testing.assert_array_equal(before, now)
        want = np.concatenate([a, b], 2)
        np.testing.assert_array_equal(y, want)
        np.testing.assert_array_equal(z, np.maximum(want, 0))
        np.testing.assert_allclose(w, -np.exp(x + x), rtol=1e-6)
    del s
    gc.collect()
    nodes = runner.read_fused_node_stats(report)  # (the graph's two unconnected parts: two nodes)
    runs = len(lengths)
    assert all(st["runs"] == runs for st in nodes), nodes
    inputs, outputs = (sum(st[k] for st in nodes) for k in ("inputs_in_place", "outputs_in_place"))
    assert (inputs, outputs) == ((3 * runs, runs) if in_place else (0, 0)), nodes
