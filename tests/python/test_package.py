"""The Python package, the demo model end to end, the CPU fallback and run-time errors.

The demo test is the foundation's acceptance bar: the built-in encoder runs with ORT's CPU
fallback DISABLED (so every node provably ran on MLX; ORT's placement is asserted as well) and
matches ORT's CPU EP within 1e-4.
"""
from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import onnxruntime_mlx as om
import oracle
from onnxruntime_mlx import demo_model, runner

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _model(nodes, inputs, outputs, inits=(), opset=17):
    g = helper.make_graph(nodes, "t", inputs, outputs, list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m.SerializeToString()


def _add_model():
    return _model([helper.make_node("Add", ["a", "b"], ["y"], name="the_add")],
                  [helper.make_tensor_value_info("a", TensorProto.FLOAT, [2, 3]),
                   helper.make_tensor_value_info("b", TensorProto.FLOAT, [3])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])


# -- the package API ----------------------------------------------------------------------

def test_library_path_is_absolute_and_exists():
    p = pathlib.Path(om.library_path())
    assert p.is_absolute() and p.is_file()
    assert p.name.startswith("libonnxruntime_mlx_ep")


def test_library_path_env_override(monkeypatch, tmp_path):
    monkeypatch.setenv("ORT_MLX_EP_LIBRARY", str(tmp_path / "missing.so"))
    with pytest.raises(FileNotFoundError, match="missing.so"):
        om.library_path()


def test_register_is_idempotent():
    p1 = om.register()
    n1 = sum(d.ep_name == om.EP_NAME for d in ort.get_ep_devices())
    p2 = om.register()
    n2 = sum(d.ep_name == om.EP_NAME for d in ort.get_ep_devices())
    assert p1 == p2
    assert n1 == n2 >= 1
    # Even if our module-level flag is lost, registering again must not duplicate the devices.
    om._registered = False
    om.register()
    assert sum(d.ep_name == om.EP_NAME for d in ort.get_ep_devices()) == n1


def test_session_options_cpu_runs_on_mlx():
    so = om.session_options(device="cpu", fallback=False)
    assert isinstance(so, ort.SessionOptions)
    assert so.get_session_config_entry("session.disable_cpu_ep_fallback") == "1"
    s = ort.InferenceSession(_add_model(), sess_options=om.record_assignment(so))
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = np.array([1, 2, 3], dtype=np.float32)
    np.testing.assert_array_equal(s.run(None, {"a": a, "b": b})[0], a + b)
    assert om.EP_NAME in s.get_providers()


def test_session_options_rejects_unknown_option(capfd):
    # Checked in Python before ORT sees it (ORT's Python layer would print the EP's error and
    # retry on the CPU EP alone); test_package_options.py has the rest of the validation.
    with pytest.raises(ValueError, match="unknown MLX EP option 'no_such_option'"):
        om.session_options(device="cpu", no_such_option=1)
    out, err = capfd.readouterr()
    assert "Falling back" not in out + err


def test_placement_reports_ort_assignment():
    so = om.record_assignment(om.session_options(device="cpu"))
    s = ort.InferenceSession(_add_model(), sess_options=so)
    assert om.placement(s) == {om.EP_NAME: [("the_add", "Add")]}


# -- the demo model -------------------------------------------------------------------------

def test_demo_model_is_deterministic_and_small():
    a = demo_model.build().SerializeToString()
    b = demo_model.build().SerializeToString()
    assert a == b
    assert len(a) < 4 * 2**20
    m = onnx.load_from_string(a)
    ops = {n.op_type for n in m.graph.node}
    assert {"LayerNormalization", "MatMul", "Reshape", "Shape", "Gather", "Concat", "Transpose",
            "Softmax", "Erf"} <= ops
    dims = [d.dim_param for d in m.graph.input[0].type.tensor_type.shape.dim]
    assert dims == ["batch", "seq", ""]


@pytest.mark.parametrize("opt_level", ["all", "disable"])
def test_demo_model_runs_100_percent_on_mlx(opt_level):
    # With ORT's optimizations on, ORT folds the Shape->Gather->Concat chains into constant
    # Reshape shapes before the EP sees the graph; with them off, the EP runs the chains itself.
    model = demo_model.build().SerializeToString()
    level = runner.OPT_LEVELS[opt_level]
    so = om.record_assignment(om.session_options(device="cpu", fallback=False))
    so.graph_optimization_level = level
    mlx = ort.InferenceSession(model, sess_options=so)
    cpu_so = ort.SessionOptions()
    cpu_so.graph_optimization_level = level
    cpu = ort.InferenceSession(model, sess_options=cpu_so, providers=["CPUExecutionProvider"])
    placed = om.placement(mlx)
    assert set(placed) == {om.EP_NAME}, f"nodes off MLX: {placed}"
    if opt_level == "disable":
        assert len(placed[om.EP_NAME]) == len(onnx.load_from_string(model).graph.node)
    rng = np.random.default_rng(0)
    # Several shapes through the same session: the symbolic dims change between runs, and each
    # shape is run 3 times (the engine's eager probe run, then compiled runs).
    for batch, seq in [(2, 64), (1, 7), (3, 1), (2, 64)]:
        x = rng.standard_normal((batch, seq, demo_model.D_MODEL)).astype(np.float32)
        ref = cpu.run(None, {"input": x})[0]
        for _ in range(3):
            out = mlx.run(None, {"input": x})[0]
            assert out.shape == ref.shape
            diff = float(np.max(np.abs(out - ref)))
            assert diff <= 1e-4, f"batch={batch} seq={seq}: max abs diff {diff}"


def test_runner_reports_demo_model(tmp_path):
    path = demo_model.save(tmp_path / "demo.onnx")
    r = runner.run_model(str(path), {"batch": 2, "seq": 16}, runs=2, warmup=1, device="cpu",
                         out=open(os.devnull, "w"))
    assert r["nodes_mlx"] == r["nodes_total"] > 0
    assert r["fallback"] == []
    (abs_diff, rel_diff), = r["diffs"].values()
    assert abs_diff <= 1e-4
    assert r["mlx_ms"] > 0 and r["cpu_ms"] > 0


def _cli(*args, timeout=300):
    env = dict(os.environ, PYTHONPATH=str(ROOT / "python"))
    return subprocess.run([sys.executable, "-m", "onnxruntime_mlx", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_cli_run(tmp_path):
    path = demo_model.save(tmp_path / "demo.onnx")
    r = _cli("run", str(path), "--dim", "batch=1", "--dim", "seq=8", "--runs", "2",
             "--device", "cpu")
    assert r.returncode == 0, r.stderr
    assert "nodes on MLXExecutionProvider (100.0%)" in r.stdout, r.stdout
    assert "max abs diff" in r.stdout and "median of 2 runs" in r.stdout


def test_cli_doctor_sgemm():
    if oracle.DEVICE == "gpu":
        pytest.skip("checks this machine's mlx-cpu wheel setup (the BLAS libmlx resolves)")
    r = _cli("doctor", "--n", "256", "--runs", "2", "--warmup", "1", "--device", "cpu")
    assert r.returncode == 0, r.stderr
    assert "sgemm 256x256x256 fp32: MLX EP" in r.stdout, r.stdout
    assert "onnxruntime" in r.stdout and "EP device" in r.stdout
    # The EP's libmlx must resolve cblas_* from OpenBLAS (scripts/setup patches it), not from
    # the reference BLAS bundled in the mlx-cpu wheel.
    blas = next(line for line in r.stdout.splitlines() if line.startswith("BLAS for libmlx"))
    assert "openblas" in blas.lower() and "mlx_cpu.libs" not in blas, blas


def test_cli_doctor_names_openblas_kernels():
    """doctor names the kernel set OpenBLAS picked for libmlx, and warns when OPENBLAS_CORETYPE
    forces narrower kernels than the CPU has (a machine-wide setting that halves the EP's sgemm
    on an AVX-512 CPU); it also prints the worker threads' spin settings. Broken by a doctor
    that no longer reads OpenBLAS's choice or the variable."""
    if oracle.DEVICE == "gpu":
        pytest.skip("checks this machine's mlx-cpu wheel setup (the BLAS libmlx resolves)")
    from onnxruntime_mlx import doctor
    env = {k: v for k, v in os.environ.items()
           if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY", "OPENBLAS_THREAD_TIMEOUT", "ORT_MLX_CPU_OPENMP_POOL")}
    env.update(PYTHONPATH=str(ROOT / "python"), OPENBLAS_CORETYPE="Haswell")
    r = subprocess.run([sys.executable, "-m", "onnxruntime_mlx", "doctor", "--n", "64", "--runs", "1",
                        "--warmup", "0", "--device", "cpu"], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    assert "OpenBLAS core    Haswell (OPENBLAS_CORETYPE=Haswell)" in r.stdout, r.stdout
    # the worker threads' settings the EP and the package chose (the variables were unset here)
    threads = next(ln for ln in r.stdout.splitlines() if ln.startswith("CPU threads"))
    assert "OPENBLAS_THREAD_TIMEOUT=20" in threads, threads
    if "oneDNN           not loaded" not in r.stdout:
        assert "GOMP_SPINCOUNT=5000 OMP_WAIT_POLICY=unset" in threads and "OpenMP's threads" in threads, threads
    avx512 = all(f in doctor.cpu_flags() for f in doctor.AVX512_FLAGS)
    assert ("WARNING: OPENBLAS_CORETYPE=Haswell forces" in r.stdout) == avx512, r.stdout


def test_openblas_advice():
    from onnxruntime_mlx.doctor import AVX512_FLAGS, openblas_advice
    flags = set(AVX512_FLAGS) | {"avx2", "fma"}
    assert "OPENBLAS_CORETYPE=Haswell" in openblas_advice("Haswell", "Haswell", flags)
    assert "SkylakeX" in openblas_advice("Zen", None, flags)
    assert openblas_advice("Cooperlake", None, flags) is None
    assert openblas_advice("SkylakeX", "SkylakeX", flags) is None
    assert openblas_advice("Haswell", None, {"avx2", "fma", "avx512f"}) is None  # not all of them


_BLAS_TIMEOUT_PROBE = """
import onnxruntime_mlx
from onnxruntime_mlx.doctor import process_getenv
print(process_getenv("OPENBLAS_THREAD_TIMEOUT") or "")
"""


@pytest.mark.parametrize("user", [None, "24"])
def test_openblas_workers_sleep_soon_after_a_call(user):
    """Importing the package sets OPENBLAS_THREAD_TIMEOUT=20 (OpenBLAS's workers sleep ~0.3 ms
    after a call instead of spinning ~0.1 s beside oneDNN's OpenMP threads) before it loads
    OpenBLAS, which reads it as it loads; a user's value wins. Broken by the default dropped or
    a user's value overridden."""
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_THREAD_TIMEOUT"}
    if user:
        env["OPENBLAS_THREAD_TIMEOUT"] = user
    out = subprocess.run([sys.executable, "-c", _BLAS_TIMEOUT_PROBE], env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == (user or "20"), out.stdout


_BLAS_CORE_PROBE = """
import onnxruntime_mlx
from onnxruntime_mlx import doctor
print(doctor.process_getenv("OPENBLAS_CORETYPE") or "")
print(doctor.openblas_core(onnxruntime_mlx.blas_preload) or "")
"""


@pytest.mark.parametrize("user", [None, "Haswell"])
def test_openblas_runs_its_avx512_kernels(user):
    """On a CPU with AVX-512, importing the package sets OPENBLAS_CORETYPE=SkylakeX before it
    loads OpenBLAS (an OpenBLAS older than the CPU, Debian's 0.3.21 on an Emerald Rapids Xeon,
    picks its SSE3 Prescott kernels by itself: MLX's sgemm at ~40 GFLOP/s instead of ~190); a
    user's value wins; without AVX-512 nothing is set. Broken by the default dropped or a
    user's value overridden."""
    from onnxruntime_mlx.cpu_info import AVX512_FLAGS, cpu_flags
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_CORETYPE"}
    if user:
        env["OPENBLAS_CORETYPE"] = user
    out = subprocess.run([sys.executable, "-c", _BLAS_CORE_PROBE], env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    value, core = (out.stdout.splitlines() + ["", ""])[:2]
    avx512 = all(f in cpu_flags() for f in AVX512_FLAGS)
    assert value == (user or ("SkylakeX" if avx512 else "")), out.stdout
    if core and avx512:  # an OpenBLAS was preloaded: its kernels are the ones asked for
        assert core == (user or "SkylakeX"), out.stdout


def test_random_feeds_attend_everywhere():
    """The CLI's and tools' random inputs (runner.random_feeds): an integer input named like a
    mask is all ones (random integers there make an encoder's additive mask +inf), other
    integers stay in [0, 100)."""
    from onnxruntime_mlx import runner
    g = helper.make_graph([helper.make_node("Add", ["input_ids", "attention_mask"], ["y"])], "g",
                          [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["b", "s"]),
                           helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["b", "s"])],
                          [helper.make_tensor_value_info("y", TensorProto.INT64, None)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 9
    s = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    feeds = runner.random_feeds(s, runner.dims_of(s, {}, {"b": 2, "s": 64}), 0, {})
    assert feeds["attention_mask"].shape == (2, 64) and (feeds["attention_mask"] == 1).all()
    assert feeds["input_ids"].min() >= 0 and feeds["input_ids"].max() < 100 and feeds["input_ids"].max() > 1


# -- fallback and errors ----------------------------------------------------------------------

def _fallback_model():
    """y = float(string(x + 1)) * 2 (the string round trip cannot run on MLX, so the MLX part is
    split around a CPU segment), and a StringNormalizer on a separate string input."""
    return _model(
        [helper.make_node("Add", ["x", "one"], ["x1"], name="add"),
         helper.make_node("Cast", ["x1"], ["xs"], name="to_string", to=TensorProto.STRING),
         helper.make_node("Cast", ["xs"], ["xf"], name="to_float", to=TensorProto.FLOAT),
         helper.make_node("Mul", ["xf", "two"], ["y"], name="mul"),
         helper.make_node("StringNormalizer", ["s"], ["t"], name="normalize",
                          case_change_action="UPPER", locale="C")],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3]),
         helper.make_tensor_value_info("s", TensorProto.STRING, [3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3]),
         helper.make_tensor_value_info("t", TensorProto.STRING, [3])],
        [helper.make_tensor("one", TensorProto.FLOAT, [], [1.0]),
         helper.make_tensor("two", TensorProto.FLOAT, [], [2.0])])


def test_unsupported_nodes_run_on_cpu_fallback(tmp_path):
    report = tmp_path / "report.jsonl"
    so = om.record_assignment(om.session_options(device="cpu", report_path=str(report)))
    s = ort.InferenceSession(_fallback_model(), sess_options=so)
    x = np.array([[0.5, -1.25, 3], [4, 5.5, -6]], dtype=np.float32)
    strs = np.array(["abc", "Hello", "x y"], dtype=object)
    y, t = s.run(None, {"x": x, "s": strs})
    np.testing.assert_array_equal(y, (x + 1) * 2)
    assert list(t) == ["ABC", "HELLO", "X Y"]

    placed = om.placement(s)
    on_mlx = {op for _, op in placed.get(om.EP_NAME, [])}
    on_cpu = {op for _, op in placed.get("CPUExecutionProvider", [])}
    assert {"Add", "Mul"} <= on_mlx, placed
    assert {"Cast", "StringNormalizer"} <= on_cpu, placed
    # Each declined node comes with the EP's reason.
    recs = runner.read_report(str(report))
    declined = {r["node"]: r for r in recs}
    for name in ("to_string", "to_float", "normalize"):
        assert name in declined, recs
        assert declined[name]["reason"], declined[name]
    assert all(set(r) >= {"node", "op", "domain", "reason"} for r in recs)


def test_disabled_fallback_refuses_unsupported_model():
    so = om.session_options(device="cpu", fallback=False)
    with pytest.raises(Exception):
        ort.InferenceSession(_fallback_model(), sess_options=so)


def test_runtime_shape_mismatch_is_an_error_status_naming_the_node():
    # MatMul's contracted dims are two *different* symbolic dims, so ORT accepts the model and
    # only the run-time shapes disagree.
    model = _model(
        [helper.make_node("Abs", ["a"], ["ra"], name="abs"),
         helper.make_node("MatMul", ["ra", "b"], ["y"], name="mismatched_matmul")],
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, ["M", "K1"]),
         helper.make_tensor_value_info("b", TensorProto.FLOAT, ["K2", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["M", 4])])
    so = om.record_assignment(om.session_options(device="cpu", fallback=False))
    s = ort.InferenceSession(model, sess_options=so)
    assert set(om.placement(s)) == {om.EP_NAME}
    good = {"a": np.ones((2, 3), np.float32), "b": np.ones((3, 4), np.float32)}
    np.testing.assert_allclose(s.run(None, good)[0], np.full((2, 4), 3, np.float32))
    bad = {"a": np.ones((2, 3), np.float32), "b": np.ones((5, 4), np.float32)}
    with pytest.raises(Exception) as err:
        s.run(None, bad)
    msg = str(err.value)
    assert "mismatched_matmul" in msg, msg
    assert "MatMul" in msg, msg
    # The session survives the error: good inputs still run, after as before.
    np.testing.assert_allclose(s.run(None, good)[0], np.full((2, 4), 3, np.float32))
    # Same when the very first run of a session is the bad one.
    s2 = ort.InferenceSession(model, sess_options=so)
    with pytest.raises(Exception, match="mismatched_matmul"):
        s2.run(None, bad)
    np.testing.assert_allclose(s2.run(None, good)[0], np.full((2, 4), 3, np.float32))


def test_report_lines_are_json(tmp_path):
    report = tmp_path / "r.jsonl"
    so = om.session_options(device="cpu", report_path=str(report))
    ort.InferenceSession(_fallback_model(), sess_options=so)
    for line in report.read_text().splitlines():
        json.loads(line)
