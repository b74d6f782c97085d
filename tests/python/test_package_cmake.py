"""The CMake package and the C example: `cmake --install` puts the library and
onnxruntime_mlxConfig(Version).cmake under a prefix, examples/c builds against it with
find_package (and with the plain compiler line of examples/c/README.md), and the program runs a
model with every node on MLX, matching ORT's CPU EP."""
from __future__ import annotations

import os
import pathlib
import re
import shutil
import subprocess

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import onnxruntime_mlx as om
from onnxruntime_mlx import demo_model

ROOT = pathlib.Path(__file__).resolve().parents[2]
BUILD = ROOT / "build"
ORT_INCLUDE = ROOT / ".deps/libonnxruntime-dev/usr/include/onnxruntime"
ORT_LIB = next(iter(sorted((pathlib.Path(ort.__file__).parent / "capi").glob("libonnxruntime.so.1.*"))),
               None)

pytestmark = pytest.mark.skipif(
    not (BUILD / "CMakeCache.txt").is_file() or ORT_LIB is None or shutil.which("cc") is None,
    reason="needs the configured build folder, a C compiler and onnxruntime's shared library")


def _run(cmd, **kw):
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=300, **kw)
    assert r.returncode == 0, f"{' '.join(map(str, cmd))}\n{r.stdout}\n{r.stderr}"
    return r


@pytest.fixture(scope="module")
def prefix(tmp_path_factory):
    p = tmp_path_factory.mktemp("prefix")
    _run(["cmake", "--install", BUILD, "--prefix", p])
    return p


def test_install_layout(prefix):
    lib = prefix / "lib/libonnxruntime_mlx_ep.so"
    cfg = prefix / "lib/cmake/onnxruntime_mlx"
    assert lib.is_file()
    assert (cfg / "onnxruntime_mlxConfig.cmake").is_file()
    version = (cfg / "onnxruntime_mlxConfigVersion.cmake").read_text()
    project_version = re.search(r"project\(onnxruntime_mlx_ep VERSION ([0-9.]+)",
                                (ROOT / "CMakeLists.txt").read_text()).group(1)
    assert f'set(PACKAGE_VERSION "{project_version}")' in version
    # Only the two symbols ORT looks up are exported.
    syms = _run(["nm", "-D", "--defined-only", lib]).stdout
    exported = {line.split()[-1] for line in syms.splitlines() if " T " in line}
    assert exported == {"CreateEpFactories", "ReleaseEpFactory"}, exported


def test_find_package_checks_the_version(prefix, tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "CMakeLists.txt").write_text(
        "cmake_minimum_required(VERSION 3.20)\nproject(v LANGUAGES NONE)\n"
        "find_package(onnxruntime_mlx ${WANT} CONFIG REQUIRED)\n"
        'message(STATUS "lib=${onnxruntime_mlx_LIBRARY} ep=${onnxruntime_mlx_EP_NAME}")\n')
    ok = _run(["cmake", "-S", src, "-B", tmp_path / "b1", f"-DCMAKE_PREFIX_PATH={prefix}",
               "-DWANT=0.1"])
    assert f"lib={prefix}/lib/libonnxruntime_mlx_ep.so ep=MLXExecutionProvider" in ok.stdout
    bad = subprocess.run(["cmake", "-S", str(src), "-B", str(tmp_path / "b2"),
                          f"-DCMAKE_PREFIX_PATH={prefix}", "-DWANT=9.0"],
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode != 0 and "onnxruntime_mlx" in bad.stderr


def _expected(model_path: pathlib.Path) -> list[np.ndarray]:
    """ORT's CPU EP on the inputs mlx_run.c makes: (i % 7) * 0.25 - 0.75, symbolic dims 2."""
    s = ort.InferenceSession(str(model_path), providers=["CPUExecutionProvider"])
    feeds = {}
    for i in s.get_inputs():
        shape = [d if isinstance(d, int) and d >= 0 else 2 for d in i.shape]
        n = int(np.prod(shape))
        feeds[i.name] = ((np.arange(n) % 7) * 0.25 - 0.75).astype(np.float32).reshape(shape)
    return s.run(None, feeds)


def _check_output(stdout: str, expected: list[np.ndarray]):
    assert "every node on MLXExecutionProvider" in stdout, stdout
    lines = [x for x in stdout.splitlines() if x.startswith("output ")]
    assert len(lines) == len(expected), stdout
    for line, e in zip(lines, expected):
        m = re.search(r"shape \[([0-9,]*)\] sum (\S+) abs_sum (\S+) first (.*)", line)
        assert m, line
        assert [int(d) for d in m.group(1).split(",")] == list(e.shape)
        first = np.array([float(v) for v in m.group(4).split()], np.float32)
        np.testing.assert_allclose(first, e.ravel()[:8], atol=1e-4)
        np.testing.assert_allclose(float(m.group(3)), np.abs(e).sum(dtype=np.float64), rtol=1e-5)
        np.testing.assert_allclose(float(m.group(2)), e.sum(dtype=np.float64),
                                   atol=1e-5 * np.abs(e).sum())


@pytest.fixture(scope="module")
def cmake_example(prefix, tmp_path_factory):
    b = tmp_path_factory.mktemp("example")
    _run(["cmake", "-S", ROOT / "examples/c", "-B", b, f"-DCMAKE_PREFIX_PATH={prefix}",
          f"-DORT_INCLUDE_DIR={ORT_INCLUDE}", f"-DORT_LIBRARY={ORT_LIB}"])
    out = _run(["cmake", "--build", b])
    assert "warning" not in out.stdout + out.stderr, out.stdout + out.stderr
    return b / "mlx_run"


def _env():
    env = dict(os.environ)
    env.pop("ORT_MLX_EP_LIBRARY", None)  # the program uses the installed library it was built with
    return env


def test_c_example_built_with_find_package_runs_on_mlx(cmake_example, tmp_path):
    model = demo_model.save(tmp_path / "demo.onnx")
    r = _run([cmake_example, model, "cpu"], env=_env())
    _check_output(r.stdout, _expected(model))


def test_c_example_from_the_compiler_line(prefix, tmp_path):
    libdir = tmp_path / "ortlib"
    libdir.mkdir()
    for name in ("libonnxruntime.so.1", "libonnxruntime.so"):
        (libdir / name).symlink_to(ORT_LIB)
    exe = tmp_path / "mlx_run"
    lib = prefix / "lib/libonnxruntime_mlx_ep.so"
    _run(["cc", "-std=c11", "-O2", "-Wall", "-Wextra", "-Werror", ROOT / "examples/c/mlx_run.c",
          f"-I{ORT_INCLUDE}", f"-L{libdir}", "-lonnxruntime", f"-Wl,-rpath,{libdir}",
          f'-DORTMLX_LIBRARY="{lib}"', "-o", exe])
    model = demo_model.save(tmp_path / "demo.onnx")
    r = _run([exe, model], env=_env())
    _check_output(r.stdout, _expected(model))


def test_c_example_fails_when_a_node_cannot_run_on_mlx(cmake_example, tmp_path):
    g = helper.make_graph(
        [helper.make_node("Cast", ["x"], ["s"], to=TensorProto.STRING),
         helper.make_node("Cast", ["s"], ["y"], to=TensorProto.FLOAT)], "t",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    path = tmp_path / "strings.onnx"
    onnx.save(m, str(path))
    r = subprocess.run([str(cmake_example), str(path), "cpu"], capture_output=True, text=True,
                       timeout=120, env=_env())
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert "CreateSession" in r.stderr and "output " not in r.stdout
    r = subprocess.run([str(cmake_example), str(path), "tpu"], capture_output=True, text=True,
                       timeout=120, env=_env())
    assert r.returncode == 2 and "device 'tpu' is not auto, cpu or gpu" in r.stderr, r.stderr
    om.register()
    if not any(d.ep_name == om.EP_NAME and d.device.type == ort.OrtHardwareDeviceType.GPU
               for d in ort.get_ep_devices()):
        r = subprocess.run([str(cmake_example), str(path), "gpu"], capture_output=True,
                           text=True, timeout=120, env=_env())
        assert r.returncode == 1 and "the MLX EP has no 'gpu' device" in r.stderr, r.stderr
