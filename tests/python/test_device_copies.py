"""Outputs of a run on MLX's CUDA backend reach ORT's buffers by one device-to-host copy each
(option device_copies, kernels/cuda/device_copy.h), not through MLX's host read, and are the
same values. On the CPU device nothing is in CUDA memory: no such copy is made."""
import json

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto as TP, helper

import onnxruntime_mlx as om
from oracle import DEVICE


def model():
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["t"]), helper.make_node("Tanh", ["t"], ["y"]),
         helper.make_node("ReduceSum", ["t"], ["s"], keepdims=0)],
        "copies", [helper.make_tensor_value_info("x", TP.FLOAT, [4, 64])],
        [helper.make_tensor_value_info("y", TP.FLOAT, [4, 32]),
         helper.make_tensor_value_info("s", TP.FLOAT, [])],
        [helper.make_tensor("w", TP.FLOAT, [64, 32],
                            np.random.default_rng(1).standard_normal((64, 32)).astype(np.float32))])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 9
    return m.SerializeToString()


def copies_after(tmp_path, name, runs=5, **options):
    """Runs the model `runs` times; returns the outputs of the last run and the process's count
    of device copies when the session ended (from its report line)."""
    report = tmp_path / f"{name}.jsonl"
    # Runs not kept as CUDA graphs: a kept graph's outputs are its own buffers, always copied.
    s = om.InferenceSession(model(), DEVICE, fallback=False, report_path=str(report), gpu_graph_replay=0,
                            **options)
    x = np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32)
    outs = None
    for _ in range(runs):
        outs = s.run(None, {"x": x})
    del s
    line = next(json.loads(ln) for ln in report.read_text().splitlines() if '"fused_node"' in ln)
    copies_after.skips = line["process_device_copy_skips"]  # why outputs took MLX's read
    return outs, line["process_device_copies"], x


# device_copies=2 (the default) copies outputs in unified memory too (by the driver, which reads
# them where they lie); 1 copies only those in device memory.
@pytest.mark.parametrize("mode", [1, 2])
def test_outputs_copied_by_the_driver_equal_mlxs_host_read(tmp_path, mode):
    # The copying session first: MLX's host reads (device_copies=0) leave managed buffers in its
    # cache, which the next session's outputs may get, and mode 1 does not copy those. The count
    # before it comes from a session that never runs.
    _, before, _ = copies_after(tmp_path, "baseline", runs=0)
    unified_before = copies_after.skips["unified_memory"]
    on, after, x = copies_after(tmp_path, f"on{mode}", device_copies=mode)
    unified = copies_after.skips["unified_memory"] - unified_before
    off, unchanged, _ = copies_after(tmp_path, "off", device_copies=0)
    assert unchanged == after, (after, unchanged)  # device_copies=0 copies nothing
    ref = ort.InferenceSession(model(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    for a, b, r in zip(on, off, ref):
        np.testing.assert_array_equal(a, b)  # the same bytes either way
        np.testing.assert_allclose(a, r, rtol=1e-4, atol=1e-4)
    if DEVICE == "gpu" and mode == 2:
        # Every output of every run: 2 outputs x 5 runs (the first run on a thread may come
        # before MLX's CUDA context is current there).
        assert after - before >= 8, (before, after, copies_after.skips)
    elif DEVICE == "gpu":
        # Mode 1 leaves outputs in managed memory to MLX's read: which buffers an output gets
        # from MLX's cache depends on what the process ran before, so each output counts once,
        # copied or left for that reason alone.
        assert after - before + unified >= 8, (before, after, copies_after.skips)
    else:
        assert before == after == 0
        assert copies_after.skips["no_driver"] > 0, copies_after.skips


def gather_model():
    g = helper.make_graph(
        [helper.make_node("Gather", ["x", "i"], ["y"], axis=0)], "flag",
        [helper.make_tensor_value_info("x", TP.FLOAT, [10, 4]), helper.make_tensor_value_info("i", TP.INT64, [2])],
        [helper.make_tensor_value_info("y", TP.FLOAT, [2, 4])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 9
    return m.SerializeToString()


def test_index_flag_is_read_by_the_driver(tmp_path):
    """A run's index check ends in a flag the host reads (engine/index_check.cc). On the GPU,
    with device_copies=2, the driver copies it out: MLX keeps buffers of up to 8 bytes in shared
    managed pages, and its host read moved that page to the host every run, so the next run's
    first kernels stalled on page faults. One more driver copy a run than with device_copies=1
    (whose output copy is the same here), and an index out of range is still an error."""
    x = np.arange(40, dtype=np.float32).reshape(10, 4)
    totals = []  # the process's count of driver copies after each session
    for i, mode in enumerate((1, 1, 2)):
        report = tmp_path / f"flag{i}.jsonl"
        s = om.InferenceSession(gather_model(), DEVICE, fallback=False, report_path=str(report), device_copies=mode)
        for _ in range(5):
            (y,) = s.run(None, {"x": x, "i": np.array([3, -1], np.int64)})
            np.testing.assert_array_equal(y, x[[3, -1]])
        with pytest.raises(Exception, match="out of range|out of data bounds|out of bounds"):
            s.run(None, {"x": x, "i": np.array([3, 10], np.int64)})
        del s
        line = next(json.loads(ln) for ln in report.read_text().splitlines() if '"fused_node"' in ln)
        totals.append(line["process_device_copies"])
    with_flag, without = totals[2] - totals[1], totals[1] - totals[0]
    if DEVICE == "gpu":
        assert with_flag >= without + 4, totals  # a flag a run (the first may precede the context)
    else:
        assert totals == [0, 0, 0], totals
