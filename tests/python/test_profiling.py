"""Seeing inside the EP: ORT's profiler (enable_profiling), the EP's own trace file
(ORT_MLX_TRACE, Chrome trace JSON), profile_ops, and what log_level says of control flow."""
import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto as TP, helper

import onnxruntime_mlx as om
from oracle import DEVICE
from test_control_flow import if_on_int64_model

ROOT = pathlib.Path(__file__).resolve().parents[2]
PHASES = {"read inputs", "build graph", "evaluate", "write outputs"}
PATHS = {"compiled", "compiled (new trace)", "eager (new signature)", "eager", "shape family"}


def chain_model():
    """MatMul -> Tanh -> Softmax over a [2, 16] input, the weight a constant initializer."""
    w = np.linspace(-1, 1, 256, dtype=np.float32)
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["t"], name="mm"),
         helper.make_node("Tanh", ["t"], ["u"], name="tanh"),
         helper.make_node("Softmax", ["u"], ["y"], axis=-1, name="softmax")],
        "chain", [helper.make_tensor_value_info("x", TP.FLOAT, [2, 16])],
        [helper.make_tensor_value_info("y", TP.FLOAT, [2, 16])],
        [helper.make_tensor("w", TP.FLOAT, [16, 16], w)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 9
    return m


def profiled_events(tmp_path, runs=4, **options):
    so = om.session_options(DEVICE, fallback=False, **options)
    so.enable_profiling = True
    so.profile_file_prefix = str(tmp_path / "ort_profile")
    s = ort.InferenceSession(chain_model().SerializeToString(), sess_options=so, enable_fallback=0)
    x = np.random.default_rng(0).standard_normal((2, 16)).astype(np.float32)
    for _ in range(runs):
        s.run(None, {"x": x})
    events = json.loads(pathlib.Path(s.end_profiling()).read_text())
    ours = [e for e in events if e.get("args", {}).get("ep") == om.EP_NAME]
    return events, ours


def test_ort_profile_holds_the_eps_phases_per_run(tmp_path):
    events, ours = profiled_events(tmp_path, runs=4)
    runs = [e for e in ours if e["args"]["category"] == "fused_node"]
    assert len(runs) == 4, [e["name"] for e in ours]
    assert {r["args"]["path"] for r in runs} <= PATHS
    assert runs[-1]["args"]["path"] == "compiled"  # the steady state: a compiled hit
    assert all(r["args"]["inputs"] == "float32[2,16]" for r in runs)
    for name in PHASES:
        assert sum(e["name"] == name for e in ours) >= (4 if name != "build graph" else 1), name
    # Each phase lies inside one of ORT's own kernel events for the fused node, within the
    # error of mapping the EP's steady clock onto ORT's profiling clock (a few µs).
    kernels = [e for e in events if e.get("cat") == "Node" and "args" in e
               and e["args"].get("provider") == om.EP_NAME]
    assert kernels, "ORT's profile has no event for the fused node"
    for e in ours:
        if e["args"]["category"] != "phase":
            continue
        assert any(k["ts"] - 25 <= e["ts"] and e["ts"] + e["dur"] <= k["ts"] + k["dur"] + 25
                   for k in kernels), e
    # Graph building records a span per ONNX node, with its shapes (ORT's NODE category).
    ops = [e for e in ours if e["args"]["category"] == "op"]
    assert {e["name"] for e in ops} == {"MatMul", "Tanh", "Softmax"}
    mm = next(e for e in ops if e["name"] == "MatMul")
    assert mm["cat"] == "Node" and mm["args"]["node"] == "mm"
    assert mm["args"]["outputs"] == "float32[2,16]" and mm["args"]["output_bytes"] == "128"
    # Session creation too: claiming nodes and preparing the fused node.
    assert {"claim nodes", "prepare fused node"} <= {e["name"] for e in ours}


def test_profile_ops_times_every_node_of_every_run(tmp_path):
    _, ours = profiled_events(tmp_path, runs=4, profile_ops=1)
    runs = [e for e in ours if e["args"]["category"] == "fused_node"]
    assert all(not r["args"]["path"].startswith("compiled") for r in runs), runs
    timed = [e for e in ours if e["args"]["category"] == "op" and e["args"].get("evaluated") == "1"]
    # The first run is a probe (not evaluated node by node); each later one times all three.
    assert sorted(e["name"] for e in timed) == sorted(["MatMul", "Tanh", "Softmax"] * 3), timed
    assert all(int(e["args"]["eval_us"]) >= 0 for e in timed)


def test_a_profiled_session_leaves_other_sessions_out(tmp_path):
    other = om.InferenceSession(chain_model().SerializeToString(), DEVICE, fallback=False)
    so = om.session_options(DEVICE, fallback=False)
    so.enable_profiling = True
    so.profile_file_prefix = str(tmp_path / "ort_profile")
    s = ort.InferenceSession(chain_model().SerializeToString(), sess_options=so, enable_fallback=0)
    x = np.ones((2, 16), np.float32)
    for _ in range(3):
        s.run(None, {"x": x})
        other.run(None, {"x": x})
        other.run(None, {"x": x})
    events = json.loads(pathlib.Path(s.end_profiling()).read_text())
    runs = [e for e in events if e.get("args", {}).get("category") == "fused_node"]
    assert len(runs) == 3, len(runs)


def _trace_cli(tmp_path, *extra, env=None):
    out = tmp_path / "trace.json"
    model = tmp_path / "chain.onnx"
    model.write_bytes(chain_model().SerializeToString())
    r = subprocess.run([sys.executable, "-m", "onnxruntime_mlx", "trace", str(model), "--out",
                        str(out), "--runs", "4", "--device", DEVICE, *extra],
                       capture_output=True, text=True, timeout=300, cwd=tmp_path,
                       env=dict(os.environ, PYTHONPATH=str(ROOT / "python"), **(env or {})))
    return r, out


def test_trace_file_is_chrome_trace_json_with_spans_counters_and_summary(tmp_path):
    r, out = _trace_cli(tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    doc = json.loads(out.read_text())
    events = doc["traceEvents"]
    spans = [e for e in events if e["ph"] == "X"]
    assert {"fused_node", "phase", "op", "session"} <= {e["cat"] for e in spans}
    pids = {e["pid"] for e in events}
    assert len(pids) == 1 and pids != {0}
    assert all(e["tid"] > 0 for e in spans)
    runs = [e for e in spans if e["cat"] == "fused_node"]
    assert len(runs) == 4 and all(e["args"]["path"] in PATHS for e in runs)
    # The phases nest inside their run, on the same thread (µs with ns decimals).
    for e in spans:
        if e["cat"] == "phase":
            assert any(k["tid"] == e["tid"] and k["ts"] <= e["ts"] + 1e-3
                       and e["ts"] + e["dur"] <= k["ts"] + k["dur"] + 1e-3 for k in runs), e
    counters = {e["name"] for e in events if e["ph"] == "C"}
    assert counters == {"mlx_active_bytes", "mlx_peak_bytes", "mlx_cache_bytes"}
    assert all(isinstance(e["args"]["value"], (int, float)) for e in events if e["ph"] == "C")
    summary = next(e for e in events if e["ph"] == "M" and e["name"] == "slowest_ops")
    assert "MatMul (mm)" in summary["args"]["summary"]
    assert "slowest ONNX nodes" in r.stderr and "MatMul (mm)" in r.stderr
    assert "phases" in r.stdout and "evaluate" in r.stdout


def test_trace_with_profile_ops_names_the_slowest_evaluated_nodes(tmp_path):
    r, out = _trace_cli(tmp_path, "--profile-ops")
    assert r.returncode == 0, r.stderr[-2000:]
    events = json.loads(out.read_text())["traceEvents"]
    timed = [e for e in events if e["ph"] == "X" and e["cat"] == "op"
             and e["args"].get("evaluated") == "1"]
    assert len(timed) == 9, len(timed)  # 3 nodes x the 3 runs after the probe
    assert "each evaluated on its own" in r.stderr


def test_unwritable_trace_path_fails_registration_with_the_path(tmp_path):
    bad = tmp_path / "no_such_dir" / "trace.json"
    code = "import onnxruntime_mlx as om; om.register()"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, ORT_MLX_TRACE=str(bad),
                                PYTHONPATH=str(ROOT / "python")))
    assert r.returncode != 0
    assert str(bad) in r.stderr, r.stderr[-2000:]


def test_log_level_reports_control_flow_once_per_node(capfd):
    m = if_on_int64_model()
    m.graph.node[-1].name = "branch"
    s = om.InferenceSession(m.SerializeToString(), DEVICE, fallback=False, log_level=2)
    s.run(None, {"k": np.array(3, np.int64), "x": np.ones((2, 3), np.float32)})
    err = capfd.readouterr().err
    # ORT folds the branches' Constant nodes into initializers first: Add, Mul and Mul remain.
    assert "claimed If 'branch' whole: its bodies' 3 node(s) run on MLX inside it" in err, err
    assert "and the 3 inside the bodies of 1 control-flow node(s)" in err, err
    # No line per body node: the bodies were claimed with their If.
    assert "declined" not in err, err
