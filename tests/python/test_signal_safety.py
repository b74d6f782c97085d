"""A process that receives signals while the EP runs keeps an intact heap.

Profilers (async-profiler, tools/host_profile.py) and some runtimes interrupt threads with
signals; a handler then runs on whatever stack the interrupted thread was using. oneDNN's JIT GEMM
kernels point the stack register into heap memory while they run (oneDNN issue 4845, in the
versions distributions ship), so a signal there corrupts the heap. The EP's default paths must not
run them: oneDNN's sgemm products are off by default (cpu_dnnl_matmul) and GEMM-based convolution
implementations are refused. Here every running thread of a worker process (MLX's stream thread,
oneDNN's OpenMP workers, ORT's thread) gets a signal every 200 us while a model of products and
convolutions above oneDNN's threshold runs; the worker must finish with outputs equal to ORT's CPU
EP and its report must show oneDNN's convolutions ran."""
import json
import os
import pathlib
import subprocess
import sys

import pytest

from oracle import DEVICE

pytestmark = pytest.mark.skipif(DEVICE != "cpu", reason="oneDNN runs on MLX's CPU device only")

ROOT = pathlib.Path(__file__).resolve().parents[2]

WORKER = r"""
import ctypes, json, subprocess, sys, tempfile, time, pathlib
import numpy as np
import onnxruntime as ort
from onnx import TensorProto as TP, helper, numpy_helper
import onnxruntime_mlx as om

root, report, options = pathlib.Path(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3])
so = pathlib.Path(tempfile.mkdtemp()) / "host_sampler.so"
subprocess.run(["g++", "-O2", "-shared", "-fPIC", "-o", str(so), str(root / "tools/host_sampler.cc"), "-ldl"], check=True)
sampler = ctypes.CDLL(str(so))
sampler.host_sampler_stop.argtypes = [ctypes.c_char_p, ctypes.c_int]
sampler.host_sampler_stop.restype = ctypes.c_long

rng = np.random.default_rng(0)
w = [numpy_helper.from_array(rng.standard_normal((256, 256)).astype(np.float32) / 16, f"w{i}") for i in range(3)]
k = [numpy_helper.from_array(rng.standard_normal((16, 16, 3, 3)).astype(np.float32) / 12, f"k{i}") for i in range(2)]
nodes = [helper.make_node("MatMul", ["x", "w0"], ["m0"]), helper.make_node("Relu", ["m0"], ["r0"]),
         helper.make_node("MatMul", ["r0", "w1"], ["m1"]), helper.make_node("MatMul", ["m1", "w2"], ["m"]),
         helper.make_node("Conv", ["img", "k0"], ["c0"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c0"], ["r1"]),
         helper.make_node("Conv", ["r1", "k1"], ["c"], pads=[1, 1, 1, 1])]
g = helper.make_graph(nodes, "signals", [helper.make_tensor_value_info("x", TP.FLOAT, [64, 256]),
                                         helper.make_tensor_value_info("img", TP.FLOAT, [1, 16, 48, 48])],
                      [helper.make_tensor_value_info("m", TP.FLOAT, [64, 256]),
                       helper.make_tensor_value_info("c", TP.FLOAT, [1, 16, 48, 48])], initializer=w + k)
model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
model.ir_version = 9
data = model.SerializeToString()
s = ort.InferenceSession(data, sess_options=om.session_options("cpu", fallback=False, report_path=report, **options))
ref = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
feeds = {"x": rng.standard_normal((64, 256)).astype(np.float32), "img": rng.standard_normal((1, 16, 48, 48)).astype(np.float32)}
want = ref.run(None, feeds)
for _ in range(3):
    s.run(None, feeds)
assert sampler.host_sampler_start(200, 2) == 0
t0, runs = time.time(), 0
while time.time() - t0 < 3:
    got = s.run(None, feeds)
    runs += 1
n = sampler.host_sampler_stop(str(pathlib.Path(tempfile.mkdtemp()) / "profile.txt").encode(), 5)
for a, b in zip(got, want):
    np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-3)
del s
print("ok", runs, n)
"""


def run_worker(tmp_path, **options):
    report = tmp_path / "report.jsonl"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT / "python"), os.environ.get("PYTHONPATH")])))
    r = subprocess.run([sys.executable, "-c", WORKER, str(ROOT), str(report), json.dumps(options)], env=env,
                       capture_output=True, text=True, timeout=600)
    stats = [json.loads(x) for x in report.read_text().splitlines() if '"fused_node"' in x] if report.exists() else []
    return r, stats


def test_signals_during_runs_leave_the_heap_intact(tmp_path):
    r, stats = run_worker(tmp_path)
    assert r.returncode == 0 and r.stdout.startswith("ok"), (r.returncode, r.stdout[-500:], r.stderr[-2000:])
    runs, samples = map(int, r.stdout.split()[1:3])
    assert runs > 10 and samples > 1000, r.stdout  # the storm reached the runs' threads
    if stats and stats[-1].get("process_dnnl_convs", 0) == 0:
        pytest.skip("oneDNN is not loaded here: no oneDNN kernel ran under the signals")
    assert stats and stats[-1]["process_dnnl_convs"] > 0 and stats[-1]["process_dnnl_matmuls"] == 0, stats[-1:]
    # on AVX-512 the two 3 x 3 convolutions of 16 channels are Winograd's kernels (cpu_dnnl_winograd)
    from onnxruntime_mlx.doctor import cpu_flags
    if {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= cpu_flags():
        assert stats[-1]["process_dnnl_winograd_runs"] > 0, stats[-1:]
