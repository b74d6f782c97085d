"""The wheel as a user gets it: built by scripts/wheel (scripts/test builds it first), installed
with onnxruntime and mlx[cpu] into a fresh venv outside the checkout (from
build-wheel/wheelhouse, no package index), where `import onnxruntime_mlx` finds its library and
the mlx package's libmlx, runs a model with every node on MLX in three lines, and gets OpenBLAS
for libmlx. Costs ~10-20 s (the venv) once the wheel is built."""
from __future__ import annotations

import ctypes.util
import os
import pathlib
import subprocess
import sys
import zipfile

import numpy as np
import onnxruntime as ort
import pytest

from onnxruntime_mlx import demo_model

ROOT = pathlib.Path(__file__).resolve().parents[2]
DIST = ROOT / "build-wheel/dist"
HOUSE = ROOT / "build-wheel/wheelhouse"
WHEELS = sorted(DIST.glob("onnxruntime_mlx-*.whl"))

pytestmark = pytest.mark.skipif(not WHEELS or not (HOUSE / ".pins").is_file(),
                                reason="no wheel: run scripts/wheel (scripts/test does)")


def _wheel() -> pathlib.Path:
    return WHEELS[-1]


def test_wheel_holds_the_current_package_and_no_onnxruntime():
    with zipfile.ZipFile(_wheel()) as z:
        names = set(z.namelist())
        for src in sorted((ROOT / "python/onnxruntime_mlx").glob("*.py")):
            arc = f"onnxruntime_mlx/{src.name}"
            assert arc in names, arc
            assert z.read(arc) == src.read_bytes(), f"{arc} is stale: run scripts/wheel"
        assert "onnxruntime_mlx/libonnxruntime_mlx_ep.so" in names
        assert not [n for n in names if "libonnxruntime.so" in n or "libmlx" in n], names
        meta = z.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    requires = [ln for ln in meta.splitlines() if ln.startswith("Requires-Dist:")]
    assert not [r for r in requires if "onnxruntime" in r], requires  # no ORT pin
    assert any(r.startswith("Requires-Dist: mlx") for r in requires), requires


@pytest.fixture(scope="module")
def venv(tmp_path_factory):
    """A fresh venv, outside the checkout, with the wheel + onnxruntime + mlx[cpu]."""
    d = tmp_path_factory.mktemp("fresh")
    assert ROOT not in d.parents
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(d / "venv")], check=True,
                   timeout=120)
    py = d / "venv/bin/python"
    r = subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "-q",
                        "--no-index", "--find-links", str(HOUSE), f"{_wheel()}[cpu]",
                        "onnxruntime"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    return d, py


def _clean_env():
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "ORT_MLX_EP_LIBRARY", "ORT_MLX_BLAS", "LD_LIBRARY_PATH")}
    env["PYTHONNOUSERSITE"] = "1"
    return env


def _run_in_venv(py, cwd, script: str) -> str:
    """Runs `script` with the fresh venv's python in `cwd`, without this checkout's environment;
    returns its stdout (the test fails on a non-zero exit)."""
    r = subprocess.run([str(py), "-c", script], cwd=cwd, env=_clean_env(), capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


def test_three_lines_run_a_model_on_mlx(venv):
    d, py = venv
    model = demo_model.save(d / "model.onnx")
    x = np.random.default_rng(0).standard_normal((2, 5, demo_model.D_MODEL)).astype(np.float32)
    np.save(d / "x.npy", x)
    script = (
        "import numpy as np, onnxruntime_mlx as om\n"
        "sess = om.InferenceSession('model.onnx', 'cpu', fallback=False)\n"
        "np.save('y.npy', sess.run(None, {'input': np.load('x.npy')})[0])\n"
        # what it used, for the test
        "print(om.get_library_path())\n"
        "print(*sorted({l.split()[-1] for l in open('/proc/self/maps') if 'libmlx' in l}))\n")
    lib, mlx_lib = _run_in_venv(py, d, script).split()[-2:]
    site = d / "venv/lib"
    assert pathlib.Path(lib).is_relative_to(site) and lib.endswith("libonnxruntime_mlx_ep.so"), lib
    assert pathlib.Path(mlx_lib).resolve().is_relative_to(site.resolve()), mlx_lib
    ref = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"]).run(
        None, {"input": x})[0]
    y = np.load(d / "y.npy")
    assert y.shape == ref.shape
    assert float(np.max(np.abs(y - ref))) <= 1e-4


@pytest.mark.skipif(not sys.platform.startswith("linux") or not ctypes.util.find_library("openblas"),
                    reason="needs the system's OpenBLAS (Debian: libopenblas0)")
def test_fresh_venv_gets_openblas_for_libmlx(venv):
    d, py = venv
    args = [str(py), "-m", "onnxruntime_mlx", "doctor", "--n", "256", "--runs", "2", "--warmup",
            "1", "--device", "cpu"]
    r = subprocess.run(args, cwd=d, env=_clean_env(), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    blas = next(ln for ln in r.stdout.splitlines() if ln.startswith("BLAS for libmlx"))
    assert "openblas" in blas.lower() and "mlx_cpu.libs" not in blas, r.stdout
    onednn = next(ln for ln in r.stdout.splitlines() if ln.startswith("oneDNN"))
    assert str(d / "venv/lib") in onednn and "run through it" in onednn, r.stdout
    # The switch that keeps the wheel's own (reference) BLAS, to show the preload is what did it.
    r = subprocess.run(args, cwd=d, env=dict(_clean_env(), ORT_MLX_BLAS="bundled"),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    blas = next(ln for ln in r.stdout.splitlines() if ln.startswith("BLAS for libmlx"))
    assert "mlx_cpu.libs" in blas, r.stdout


def test_fresh_venv_runs_convolutions_through_the_bundled_onednn(venv):
    """The wheel carries oneDNN (and the OpenCL loader it links against) next to the EP
    library: a Conv (above cpu_dnnl_min_flops) in a fresh venv runs through it (the report
    counts it), from the wheel's folder, and equals ORT's CPU EP."""
    d, py = venv
    with zipfile.ZipFile(_wheel()) as z:
        names = set(z.namelist())
    assert {"onnxruntime_mlx/libdnnl.so.2", "onnxruntime_mlx/libOpenCL.so.1"} <= names, names
    script = (
        "import json, numpy as np, onnxruntime as ort, onnxruntime_mlx as om\n"
        "from onnx import TensorProto as TP, helper, numpy_helper\n"
        "w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((16, 16, 3, 3)).astype(np.float32), 'w')\n"
        "g = helper.make_graph([helper.make_node('Conv', ['x', 'w'], ['y'], pads=[1, 1, 1, 1])], 'c',\n"
        "    [helper.make_tensor_value_info('x', TP.FLOAT, [1, 16, 32, 32])],\n"
        "    [helper.make_tensor_value_info('y', TP.FLOAT, None)], [w])\n"
        "m = helper.make_model(g, opset_imports=[helper.make_opsetid('', 17)]); m.ir_version = 9\n"
        "x = np.random.default_rng(1).standard_normal((1, 16, 32, 32)).astype(np.float32)\n"
        "s = om.InferenceSession(m.SerializeToString(), 'cpu', fallback=False, report_path='r.jsonl')\n"
        "y = s.run(None, {'x': x})[0]\n"
        "del s\n"
        "ref = ort.InferenceSession(m.SerializeToString(), providers=['CPUExecutionProvider']).run(None, {'x': x})[0]\n"
        "line = next(json.loads(l) for l in open('r.jsonl') if 'fused_node' in l)\n"
        "print(line['process_dnnl_convs'], float(np.abs(y - ref).max()))\n"
        "print(*sorted({l.split()[-1] for l in open('/proc/self/maps') if 'libdnnl' in l}))\n")
    out = _run_in_venv(py, d, script)
    counts, lib = out.splitlines()[-2:]
    runs, err = counts.split()
    assert int(runs) >= 1 and float(err) <= 1e-4, out
    assert pathlib.Path(lib).is_relative_to(d / "venv/lib") and lib.endswith("libdnnl.so.2"), lib


def test_cli_in_the_fresh_venv_fails_in_one_line(venv):
    d, py = venv
    r = subprocess.run([str(py), "-m", "onnxruntime_mlx", "run", "missing.onnx"], cwd=d,
                       env=_clean_env(), capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stderr.strip() == "error: no such model: missing.onnx", r.stderr


def test_package_apart_from_mlx_still_finds_libmlx(venv, tmp_path):
    # The package in a folder of its own (pip --target), mlx in the venv: the library's RPATH
    # ($ORIGIN/../mlx/lib) finds nothing there, and the package loads the mlx package's libmlx.
    d, py = venv
    target = tmp_path / "apart"
    r = subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "-q",
                        "--no-index", "--no-deps", "--target", str(target), str(_wheel())],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert not (target / "mlx").exists()
    model = demo_model.save(tmp_path / "model.onnx")
    script = ("import numpy as np, onnxruntime_mlx as om\n"
              "sess = om.InferenceSession('model.onnx', 'cpu', fallback=False)\n"
              f"print(sess.run(None, {{'input': np.ones((1, 2, {demo_model.D_MODEL}), "
              "np.float32)})[0].shape, om.get_library_path())\n")
    env = dict(_clean_env(), PYTHONPATH=str(target))
    r = subprocess.run([str(py), "-c", script], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"(1, 2, {demo_model.D_MODEL}) {target}/onnxruntime_mlx/" in r.stdout, r.stdout
