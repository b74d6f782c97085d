"""`python -m onnxruntime_mlx ...` as a tool: real inputs for `run`, a model directory accepted,
and one-line errors with exit code 2 (no traceback) for bad arguments. Every test runs the CLI
as a user does, in a subprocess."""
from __future__ import annotations

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
from onnxruntime_mlx import demo_model

ROOT = pathlib.Path(__file__).resolve().parents[2]
LLM = ROOT / "tests/models/llm/llama-fp32"


def _cli(*args, cwd=ROOT, timeout=300):
    env = dict(os.environ, PYTHONPATH=str(ROOT / "python"))
    return subprocess.run([sys.executable, "-m", "onnxruntime_mlx", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


def _one_line_error(r, *fragments):
    """Exit code 2, and stderr is a single 'error: ...' line holding every fragment."""
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    for f in fragments:
        assert f in lines[0], (f, lines[0])


def _save(model: onnx.ModelProto, path: pathlib.Path) -> pathlib.Path:
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def _reshape_model(path: pathlib.Path) -> pathlib.Path:
    """y = Reshape(x, shape) * scale: `shape` (int64[2]) and `scale` (a float scalar) must be
    given: random values make Reshape fail."""
    g = helper.make_graph(
        [helper.make_node("Reshape", ["x", "shape"], ["r"], name="reshape"),
         helper.make_node("Mul", ["r", "scale"], ["y"], name="scale_it")],
        "t",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 6]),
         helper.make_tensor_value_info("shape", TensorProto.INT64, [2]),
         helper.make_tensor_value_info("scale", TensorProto.FLOAT, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["m", "k"])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return _save(m, path)


# -- run ------------------------------------------------------------------------------------

def test_run_takes_inputs_from_npy_files_and_literals(tmp_path):
    model = _reshape_model(tmp_path / "reshape.onnx")
    x = np.arange(12, dtype=np.float32).reshape(2, 6)
    np.save(tmp_path / "x.npy", x)
    r = _cli("run", str(model), "--input", f"x={tmp_path / 'x.npy'}", "--input",
             "shape=[3, 4]", "--input", "scale=0.5", "--runs", "2", "--device", "cpu")
    assert r.returncode == 0, r.stderr
    assert "x float32[2, 6], shape int64[2], scale float32[]" in r.stdout, r.stdout
    assert "nodes on MLXExecutionProvider (100.0%)" in r.stdout, r.stdout
    # Without the values, the random int64 shape cannot reshape [1, 6]: ORT's error, exit 1.
    r = _cli("run", str(model), "--runs", "1", "--device", "cpu")
    assert r.returncode == 1 and "Traceback" not in r.stderr, (r.stdout, r.stderr)


def test_run_model_uses_the_given_values(tmp_path):
    from onnxruntime_mlx import runner
    model = _reshape_model(tmp_path / "reshape.onnx")
    x = np.arange(12, dtype=np.float32).reshape(2, 6)
    np.save(tmp_path / "x.npy", x)
    res = runner.run_model(str(model), {}, runs=1, warmup=0, device="cpu",
                           out=open(os.devnull, "w"),
                           inputs={"x": str(tmp_path / "x.npy"), "shape": "[4, 3]",
                                   "scale": "2"})
    np.testing.assert_array_equal(res["feeds"]["x"], x)
    np.testing.assert_array_equal(res["feeds"]["shape"], np.array([4, 3], np.int64))
    assert res["feeds"]["scale"].dtype == np.float32 and res["feeds"]["scale"] == 2
    assert res["diffs"]["y"] == (0.0, 0.0)


def test_given_inputs_size_the_random_ones(tmp_path):
    # a and b share the symbolic dim "n": giving a (n=5) makes the random b [5, 3] too.
    g = helper.make_graph([helper.make_node("Add", ["a", "b"], ["y"])], "t",
                          [helper.make_tensor_value_info("a", TensorProto.FLOAT, ["n", 3]),
                           helper.make_tensor_value_info("b", TensorProto.FLOAT, ["n", 3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 3])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    model = _save(m, tmp_path / "add.onnx")
    np.save(tmp_path / "a.npy", np.ones((5, 3), np.float32))
    r = _cli("run", str(model), "--input", f"a={tmp_path / 'a.npy'}", "--runs", "1",
             "--device", "cpu")
    assert r.returncode == 0, r.stderr
    assert "a float32[5, 3], b float32[5, 3]" in r.stdout, r.stdout


@pytest.mark.parametrize("item, fragments", [
    ("nope=1", ["the model has no input 'nope'", "x, shape, scale"]),
    ("shape=[1, 2, 3]", ["--input shape", "shape [3] does not fit", "[2]"]),
    ("scale=abc", ["--input scale", "neither a .npy file nor a number"]),
    ("x=missing.npy", ["--input x: cannot read missing.npy"]),
    ("shape", ["--input expects NAME=FILE.npy or NAME=VALUE"]),
])
def test_run_bad_input_is_one_line(tmp_path, item, fragments):
    model = _reshape_model(tmp_path / "reshape.onnx")
    _one_line_error(_cli("run", str(model), "--input", item, "--device", "cpu"), *fragments)


def test_run_npy_of_the_wrong_dtype_is_one_line(tmp_path):
    model = _reshape_model(tmp_path / "reshape.onnx")
    np.save(tmp_path / "x.npy", np.ones((2, 6), np.float64))
    _one_line_error(_cli("run", str(model), "--input", f"x={tmp_path / 'x.npy'}",
                         "--device", "cpu"), "holds float64, the input is tensor(float)")


def test_run_accepts_a_directory_holding_model_onnx(tmp_path):
    demo_model.save(tmp_path / "model.onnx")
    r = _cli("run", str(tmp_path), "--dim", "batch=1", "--dim", "seq=4", "--runs", "1",
             "--device", "cpu")
    assert r.returncode == 0, r.stderr
    assert f"model      {tmp_path / 'model.onnx'}" in r.stdout, r.stdout
    _one_line_error(_cli("run", str(tmp_path / "nothing_here")), "no such model")
    (tmp_path / "empty").mkdir()
    _one_line_error(_cli("run", str(tmp_path / "empty")), "a directory without a model.onnx")


@pytest.mark.parametrize("option, fragments", [
    ("compil=0", ["unknown MLX EP option 'compil'", "the options are:", "compile"]),
    ("cache_size=-3", ["'cache_size': '-3' is not an integer in [1, 1048576]"]),
])
def test_run_bad_option_fails_instead_of_timing_the_cpu_ep(tmp_path, option, fragments):
    path = demo_model.save(tmp_path / "demo.onnx")
    r = _cli("run", str(path), "--option", option, "--device", "cpu")
    _one_line_error(r, *fragments)
    assert "latency" not in r.stdout


def test_run_refuses_to_report_when_nothing_runs_on_mlx(tmp_path):
    g = helper.make_graph([helper.make_node("StringNormalizer", ["s"], ["t"], name="norm",
                                            case_change_action="UPPER", locale="C")], "t",
                          [helper.make_tensor_value_info("s", TensorProto.STRING, [3])],
                          [helper.make_tensor_value_info("t", TensorProto.STRING, [3])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    model = _save(m, tmp_path / "strings.onnx")
    r = _cli("run", str(model), "--device", "cpu")
    _one_line_error(r, "no node of", "runs on MLXExecutionProvider", "StringNormalizer")
    assert "latency" not in r.stdout and "placement" not in r.stdout


def _has_gpu() -> bool:
    om.register()
    return any(d.ep_name == om.EP_NAME and d.device.type == ort.OrtHardwareDeviceType.GPU
               for d in ort.get_ep_devices())


def test_run_device_gpu_without_gpu_is_one_line(tmp_path):
    if _has_gpu():
        pytest.skip("this MLX build has a GPU backend")
    path = demo_model.save(tmp_path / "demo.onnx")
    _one_line_error(_cli("run", str(path), "--device", "gpu"), "device 'gpu'", "no GPU backend")
    _one_line_error(_cli("generate", str(LLM), "--device", "gpu", "--tokens", "2"),
                    "no GPU backend")


# -- generate, conformance, ops-doc -----------------------------------------------------------

def test_generate_with_a_text_prompt_is_one_line():
    _one_line_error(_cli("generate", str(LLM), "--prompt", "Hello world"),
                    "--prompt takes comma-separated token ids", "'Hello world'")


def test_generate_on_a_non_llm_model_is_one_line(tmp_path):
    path = demo_model.save(tmp_path / "demo.onnx")
    _one_line_error(_cli("generate", str(path)), "not a genai-format LLM", "genai_config.json")
    _one_line_error(_cli("generate", str(tmp_path / "absent")), "no such model")


def test_generate_still_decodes():
    r = _cli("generate", str(LLM), "--tokens", "3", "--prompt", "1,17,42", "--device", "cpu")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("tokens: [") and "nodes on MLXExecutionProvider" in r.stdout


def test_conformance_bad_filter_is_one_line():
    _one_line_error(_cli("conformance", "--filter", "("), "--filter '(' is not a regular "
                    "expression")


def test_ops_doc_writes_to_stdout_unless_out_is_given(tmp_path):
    tracked = ROOT / "docs/ops.md"
    before = tracked.read_bytes()
    r = _cli("ops-doc", "--no-schemas", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("# Supported operators"), r.stdout[:200]
    assert "| Add |" in r.stdout
    assert tracked.read_bytes() == before
    out = tmp_path / "ops.md"
    r = _cli("ops-doc", "--no-schemas", "--out", str(out), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert out.read_text().startswith("# Supported operators")
    assert tracked.read_bytes() == before


def test_generate_through_genai_matches_the_package_loop():
    pytest.importorskip("onnxruntime_genai")
    args = ["generate", str(LLM), "--tokens", "10", "--prompt", "1,17,42", "--device", "cpu"]
    ours = _cli(*args)
    theirs = _cli(*args, "--loop", "genai", "--kv", "shared", "--compare")
    assert ours.returncode == 0 and theirs.returncode == 0, ours.stderr + theirs.stderr
    tokens = [ln for ln in ours.stdout.splitlines() if ln.startswith("tokens: ")]
    assert tokens and tokens[0] in theirs.stdout.splitlines(), (ours.stdout, theirs.stdout)
    assert "runs [10], 0 node(s) declined" in theirs.stdout, theirs.stdout
    assert "genai on the CPU EP: tokens equal 10/10" in theirs.stdout, theirs.stdout
