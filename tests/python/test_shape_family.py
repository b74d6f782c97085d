"""Shape families (engine/program.h, Piecewise): a fused group whose input signature changes on
every run (a decode loop) runs its fixed stretches through compiled segments. A step is fixed
only if its MLX graph follows from its input shapes alone; these graphs check that a step whose
result depends on a *value* derived from a changing shape stays eager, so each run is exact."""
import gc

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

import onnxruntime_mlx as om
from onnxruntime_mlx import runner


WIDE = (np.arange(8 * 4096, dtype=np.float32).reshape(8, 4096) % 7 - 3) / 4


def _model(scaled_x=False, wide=False):
    # x: [B, L] (L changes every run, B = 1 but where said). The row of `table` at position L (a
    # Slice whose start is computed from Shape(x): a host read of a shape-derived value) enters a
    # chain of fixed elementwise steps over h: [1, 8]. `scaled_x`: a second output, x times the
    # sum of y (an eager step of B x L elements after the chain).
    table = np.arange(64 * 8, dtype=np.float32).reshape(64, 8) / 100.0
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "one_i"], ["l"], axis=0),
        helper.make_node("Add", ["l", "one_i"], ["l1"]),
        helper.make_node("Slice", ["table", "l", "l1", "zero_i"], ["row"]),
        helper.make_node("Mul", ["h", "two"], ["h1"]),
        helper.make_node("Add", ["h1", "row"], ["h2"]),
        helper.make_node("Tanh", ["h2"], ["h3"]),
        helper.make_node("Mul", ["h3", "h"], ["h4"]),
        helper.make_node("ReduceSum", ["x"], ["r"], keepdims=1),
        helper.make_node("Add", ["h4", "r"], ["h5"]),
        helper.make_node("Sigmoid", ["h5"], ["h6"]),
        helper.make_node("Mul", ["h6", "h5"], ["y"]),
    ]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])]
    if wide:  # y's product with a constant [8, 4096]: an EP kernel's 16 KB output
        nodes.append(helper.make_node("MatMul", ["y", "w"], ["yw"]))
        outputs.append(helper.make_tensor_value_info("yw", TensorProto.FLOAT, [1, 4096]))
    if scaled_x:
        nodes += [helper.make_node("ReduceSum", ["y", "one_i"], ["ys"], keepdims=1),
                  helper.make_node("Mul", ["x", "ys"], ["z"])]
        outputs.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, ["B", "L"]))
    inits = [numpy_helper.from_array(table, "table"),
             numpy_helper.from_array(np.array([1], np.int64), "one_i"),
             numpy_helper.from_array(np.array([0], np.int64), "zero_i"),
             numpy_helper.from_array(np.array(2.0, np.float32), "two")]
    if wide:
        inits.append(numpy_helper.from_array(WIDE, "w"))
    g = helper.make_graph(nodes, "family",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", "L"]),
                           helper.make_tensor_value_info("h", TensorProto.FLOAT, [1, 8])],
                          outputs, inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m.SerializeToString(), table


def _reference(x, h, table):
    h5 = np.tanh(h * 2 + table[x.shape[1]][None]) * h + x.sum(keepdims=True)
    return h5 / (1 + np.exp(-h5))


def test_shape_derived_host_read_stays_eager(tmp_path):
    model, table = _model()
    report = tmp_path / "report.jsonl"
    so = om.record_assignment(om.session_options("cpu", report_path=str(report)))
    s = ort.InferenceSession(model, sess_options=so)
    placed = om.placement(s)
    assert set(placed) == {om.EP_NAME}, placed
    rng = np.random.default_rng(3)
    h = rng.uniform(-1, 1, (1, 8)).astype(np.float32)
    for L in range(2, 14):  # a new signature every run, as in decoding
        x = rng.uniform(-1, 1, (1, L)).astype(np.float32)
        (y,) = s.run(None, {"x": x, "h": h})
        np.testing.assert_allclose(y, _reference(x, h, table), rtol=1e-5, atol=1e-6, err_msg=f"L={L}")
    del s
    gc.collect()
    st = runner.read_fused_node_stats(report)[0]
    # Runs 1-2 find the family; runs 3-12 take the segments (the Slice, the Shape/ReduceSum of
    # x stay eager).
    assert st["piecewise_runs"] == 10, st
    assert st["segment_calls"] + st["segment_walks"] >= 10 and st["segment_traces"] <= 3, st


def test_segments_replay_their_kept_walks(tmp_path):
    """From a segment's third call its walk is kept and later runs compute it again inside the
    run's own walk (cpu_caller_replay); the eager steps before it that the walk cannot compute
    (ReduceSum over two axes) MLX evaluates first. A run whose graph cannot be walked after a
    kept segment (here an eager step of 2^20 elements, beyond the walk's size rule) is done
    again through the compiled segments, exact, and the family keeps those from then on. An
    output an EP kernel of a kept segment computes is written into ORT's tensor, as a compiled
    segment's is."""
    model, table = _model(scaled_x=True, wide=True)
    report = tmp_path / "report.jsonl"
    s = ort.InferenceSession(model, sess_options=om.session_options("cpu", report_path=str(report)))
    rng = np.random.default_rng(5)
    h = rng.uniform(-1, 1, (1, 8)).astype(np.float32)
    for B, L in [(1, L) for L in range(2, 14)] + [(1 << 16, 16)] + [(1, L) for L in range(14, 18)]:
        x = (rng.integers(-2, 3, (B, L)) / 2).astype(np.float32)  # sums exact in float32
        y, yw, z = s.run(None, {"x": x, "h": h})
        y_ref = _reference(x, h, table)
        np.testing.assert_allclose(y, y_ref, rtol=1e-5, atol=1e-5, err_msg=f"L={L}")
        np.testing.assert_allclose(yw, y @ WIDE, rtol=1e-5, atol=1e-5, err_msg=f"L={L}")
        np.testing.assert_allclose(z, x * y.sum(), rtol=1e-6, atol=0, err_msg=f"L={L}")
    del s
    gc.collect()
    st = runner.read_fused_node_stats(report)[0]
    assert st["piecewise_runs"] == 15, st
    # Runs 3-5 call the compiled segment (the fifth keeps its walk), 6-12 walk it; the large run
    # misses and is done again; the last four call the compiled segment.
    assert st["segment_walks"] == 7 + 1 and st["segment_walk_misses"] == 1, st
    assert st["segment_calls"] == 3 + 1 + 4, st
    # yw written in place in every run of the family, its segment walked or called (16 of 17 here).
    assert st["outputs_in_place"] >= st["piecewise_runs"], st


def test_family_runs_from_many_threads(tmp_path):
    """One session, 4 threads, each running its own sequence of lengths: the family's state is
    the fused node's (runs are serialised per node), and every output stays exact whatever the
    interleaving of signatures."""
    import threading
    model, table = _model()
    report = tmp_path / "report.jsonl"
    s = ort.InferenceSession(model, sess_options=om.session_options("cpu", report_path=str(report)))
    h = np.linspace(-1, 1, 8, dtype=np.float32)[None]
    errors = []

    def worker(seed):
        rng = np.random.default_rng(seed)
        try:
            for L in rng.permutation(np.arange(2, 40)):
                x = rng.uniform(-1, 1, (1, int(L))).astype(np.float32)
                (y,) = s.run(None, {"x": x, "h": h})
                np.testing.assert_allclose(y, _reference(x, h, table), rtol=1e-5, atol=1e-6)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(repr(e))

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:2]
    del s
    gc.collect()
    st = runner.read_fused_node_stats(report)[0]
    assert st["runs"] == 4 * 38 and st["piecewise_runs"] > 100 and st["segment_calls"] > 100, st
