"""A stream of new shapes never fails a run on the GPU.

MLX's CUDA backend keeps LRU caches keyed by shape (convolution plans, cuDNN attention graphs)
that throw "Cache thrashing" after twice their capacity of misses in a row. Serving sees exactly
that stream (varied image sizes and batch sizes, decode over thousands of tokens), so the EP turns
the check off (a value the user exports wins). Each case runs in a fresh process with a tiny
convolution cache, so a few dozen shapes are enough to thrash it; the control run keeps MLX's
check on to prove the stream does thrash. (The CUDA graph cache is keyed by a graph's topology
and updates a cached graph for new shapes, so a shape stream does not thrash that one.)"""
import os
import pathlib
import subprocess
import sys

import pytest

from oracle import DEVICE

pytestmark = pytest.mark.skipif(DEVICE != "gpu", reason="MLX's CUDA caches exist on the GPU only")

ROOT = pathlib.Path(__file__).resolve().parents[2]

WORKER = r"""
import sys
import numpy as np
import onnxruntime as ort
from onnx import TensorProto as TP, helper
import onnxruntime_mlx as om

g = helper.make_graph(
    [helper.make_node("Conv", ["x", "w"], ["t"], pads=[1, 1, 1, 1]),
     helper.make_node("Relu", ["t"], ["y"])],
    "shape_stream", [helper.make_tensor_value_info("x", TP.FLOAT, ["b", 4, "h", "w"]),
                     helper.make_tensor_value_info("w", TP.FLOAT, [8, 4, 3, 3])],
    [helper.make_tensor_value_info("y", TP.FLOAT, ["b", 8, "h", "w"])])
m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
m.ir_version = 9
s = ort.InferenceSession(m.SerializeToString(), sess_options=om.session_options("gpu", fallback=False))
ref = ort.InferenceSession(m.SerializeToString(), ort.SessionOptions(), providers=["CPUExecutionProvider"])
rng = np.random.default_rng(0)
w = rng.standard_normal((8, 4, 3, 3)).astype(np.float32)
runs = 0
for b in (1, 2, 3):
    for n in range(1, int(sys.argv[1]) + 1):
        x = rng.standard_normal((b, 4, n + 2, n + 2)).astype(np.float32)
        (y,) = s.run(None, {"x": x, "w": w})
        (r,) = ref.run(None, {"x": x, "w": w})
        np.testing.assert_allclose(y, r, rtol=1e-3, atol=1e-3)
        runs += 1
print("runs", runs)
"""


def run_stream(shapes_per_batch, **env):
    full = dict(os.environ, MLX_CUDA_CONV_CACHE_SIZE="4",
                PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT / "python"),
                                                     os.environ.get("PYTHONPATH")])))
    full.pop("MLX_ENABLE_CACHE_THRASHING_CHECK", None)
    full.update(env)
    return subprocess.run([sys.executable, "-c", WORKER, str(shapes_per_batch)], env=full,
                          capture_output=True, text=True, timeout=600)


def test_new_shapes_never_fail_a_run():
    r = run_stream(20)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "runs 60" in r.stdout


def test_the_stream_thrashes_mlx_caches_when_its_check_is_on():
    # The control: with MLX's own check on, the same stream fails, so the test above exercises
    # the thrashing path rather than a stream the cache absorbs.
    r = run_stream(20, MLX_ENABLE_CACHE_THRASHING_CHECK="1")
    assert r.returncode != 0 and "Cache thrashing" in r.stderr, (r.stdout[-500:], r.stderr[-2000:])
