"""On MLX's CUDA backend an input of at most `pinned_inputs` bytes is copied into pinned host memory
that kernels read in place (kernels/cuda/pinned_inputs.h), not into MLX's managed memory. The
values are the same, a buffer goes back to the pool only once MLX lets go of it, and an input above
the threshold takes MLX's own copy. On the CPU device no such copy is made."""
import json
import threading

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto as TP, helper

import onnxruntime_mlx as om
from oracle import DEVICE


def model():
    # Gather (ids read by a kernel), a product, and the small input passed through as an output
    # (its bytes read back from the pinned buffer).
    w = np.random.default_rng(1).standard_normal((50, 16)).astype(np.float32)
    g = helper.make_graph(
        [helper.make_node("Gather", ["w", "ids"], ["e"]),
         helper.make_node("MatMul", ["e", "x"], ["y"]),
         helper.make_node("Identity", ["ids"], ["ids_out"])],
        "pinned", [helper.make_tensor_value_info("ids", TP.INT64, [None]),
                   helper.make_tensor_value_info("x", TP.FLOAT, [16, None])],
        [helper.make_tensor_value_info("y", TP.FLOAT, [None, None]),
         helper.make_tensor_value_info("ids_out", TP.INT64, [None])],
        [helper.make_tensor("w", TP.FLOAT, [50, 16], w)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 9
    return m.SerializeToString()


def report_line(path):
    return next(json.loads(ln) for ln in path.read_text().splitlines() if '"fused_node"' in ln)


def run_many(tmp_path, name, feeds_list, **options):
    report = tmp_path / f"{name}.jsonl"
    s = om.InferenceSession(model(), DEVICE, fallback=False, report_path=str(report), **options)
    outs = [s.run(None, f) for f in feeds_list]
    del s
    return outs, report_line(report)


def feeds(seed, n=3, cols=8):
    r = np.random.default_rng(seed)
    return {"ids": r.integers(0, 50, n).astype(np.int64), "x": r.standard_normal((16, cols)).astype(np.float32)}


def reference(f):
    return ort.InferenceSession(model(), providers=["CPUExecutionProvider"]).run(None, f)


def test_small_inputs_are_pinned_and_read_right(tmp_path):
    fl = [feeds(i) for i in range(12)]  # new values every run: a stale or reused buffer shows
    # (gpu_graph_replay=0: a kept graph's runs copy their inputs into its own buffers instead)
    outs, line = run_many(tmp_path, "pinned", fl, gpu_graph_replay=0)
    for o, f in zip(outs, fl):
        ref = reference(f)
        np.testing.assert_allclose(o[0], ref[0], rtol=1e-4, atol=1e-4)
        np.testing.assert_array_equal(o[1], f["ids"])
    if DEVICE == "gpu":
        # Two inputs a run; the first run on a thread may precede MLX's CUDA context there.
        assert line["process_pinned_inputs"] >= 2 * 11, line
        assert line["process_pinned_bytes"] > 0, line
    else:
        assert line["process_pinned_inputs"] == 0, line


def test_threshold_and_off_leave_inputs_to_mlx(tmp_path):
    fl = [feeds(i, cols=64) for i in range(4)]  # x: 4 KiB, ids: 24 bytes
    _, first = run_many(tmp_path, "first", fl[:1])
    _, small = run_many(tmp_path, "small", fl, pinned_inputs=1024)  # ids only
    _, off = run_many(tmp_path, "off", fl, pinned_inputs=0)
    before = first["process_pinned_inputs"]
    if DEVICE == "gpu":
        assert 3 <= small["process_pinned_inputs"] - before <= 4, (before, small)
        assert off["process_pinned_inputs"] == small["process_pinned_inputs"], (small, off)
    else:
        assert small["process_pinned_inputs"] == off["process_pinned_inputs"] == 0


def test_sessions_on_threads_keep_their_values(tmp_path):
    # Buffers go back to the pool from whichever thread MLX releases them on; runs on several
    # threads at once must each read their own bytes.
    s = om.InferenceSession(model(), DEVICE, fallback=False)
    errors = []

    def work(k):
        try:
            for i in range(20):
                f = feeds(1000 * k + i, n=1 + (i % 5))
                o = s.run(None, f)
                np.testing.assert_allclose(o[0], reference(f)[0], rtol=1e-4, atol=1e-4)
                np.testing.assert_array_equal(o[1], f["ids"])
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    ts = [threading.Thread(target=work, args=(k,)) for k in range(3)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors, errors


@pytest.mark.parametrize("value", ["-1", "x"])
def test_bad_threshold_fails_session_creation(value):
    with pytest.raises(Exception, match="pinned_inputs"):
        om.InferenceSession(model(), DEVICE, pinned_inputs=value)
