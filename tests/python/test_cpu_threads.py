"""Where the CPU device's threads run (option cpu_pin_workers): the OpenMP workers of MLX's
stream thread, which the EP's CPU kernels and oneDNN share, are each pinned to one CPU of the
process's set from the second on, once a process; the stream thread itself stays free. Each
case runs in its own process (pinning is process-wide), with ORT's own intra-op pool at one
thread so that no thread of ORT's is pinned either, and lists every thread whose affinity is
a single CPU."""
import json
import os
import subprocess
import sys

import pytest

import oracle

pytestmark = [
    pytest.mark.skipif(oracle.DEVICE != "cpu", reason="the CPU device's threads"),
    pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="pinning needs two CPUs"),
]

_CASE = r"""
import json, os, sys, numpy as np, onnxruntime as ort, onnxruntime_mlx as om
from onnx import TensorProto as TP, helper, numpy_helper
rng = np.random.default_rng(3)
w = numpy_helper.from_array(rng.standard_normal((256, 256)).astype(np.float32), "w")
graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Relu", ["m"], ["y"])],
                          "g", [helper.make_tensor_value_info("x", TP.FLOAT, [64, 256])],
                          [helper.make_tensor_value_info("y", TP.FLOAT, None)], [w])
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
so = ort.SessionOptions()
so.intra_op_num_threads = 1
so = om.session_options("cpu", fallback=False, so=so, cpu_pin_workers=sys.argv[1], report_path=sys.argv[2])
s = ort.InferenceSession(model.SerializeToString(), sess_options=so)
x = rng.standard_normal((64, 256)).astype(np.float32)
for _ in range(3):
    y = s.run(None, {"x": x})[0]
assert np.allclose(y, np.maximum(x @ numpy_helper.to_array(w), 0), atol=1e-3)
process = sorted(os.sched_getaffinity(0))
allowed = [sorted(os.sched_getaffinity(int(tid))) for tid in os.listdir("/proc/self/task")]
del s
print(json.dumps({"allowed": [a for a in allowed if a != process], "process": process}))
"""


def _run(pin, tmp_path, **env_vars):
    report = str(tmp_path / f"pin-{pin}.jsonl")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMP_", "GOMP_", "ORT_MLX_CPU_PIN"))}
    env.update(env_vars)
    out = subprocess.run([sys.executable, "-c", _CASE, str(pin), report], capture_output=True, text=True, env=env,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    threads = json.loads(out.stdout.strip().splitlines()[-1])
    with open(report) as f:
        lines = [json.loads(l) for l in f if "process_pinned_workers" in l]
    assert lines[-1]["process_pinned_stream"] == (lines[-1]["process_pinned_workers"] > 0)
    return threads, lines[-1]["process_pinned_workers"]


def test_workers_pinned_from_the_second_cpu(tmp_path):
    """On: one worker a CPU of the process's set after the first (the team is as large as the
    machine's threads, at most the set's size), the report counting them, and the stream thread
    (the team's master) kept off the workers' CPUs (the first CPU and any the team leaves); off,
    or with the user placing OpenMP's threads (OMP_PROC_BIND), every thread on the process's
    set. Broken by a pin that goes to the first CPU, by workers left unpinned, by a stream thread
    free to share a worker's CPU, or by the option or the user's placement not being honoured."""
    on, count = _run(1, tmp_path)
    cpus = on["process"]
    team = min(os.cpu_count(), len(cpus))
    assert count == team - 1
    stream = [cpus[0]] + cpus[team:]
    assert sorted(on["allowed"]) == sorted([[c] for c in cpus[1:team]] + [stream]), on
    off, count = _run(0, tmp_path)
    assert off["allowed"] == [] and count == 0
    user, count = _run(1, tmp_path, OMP_PROC_BIND="false")
    assert user["allowed"] == [] and count == 0
