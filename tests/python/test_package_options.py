"""The package fails loudly: provider options are validated before ORT sees them, a session made
through the package cannot silently end up on the CPU EP, the library and EP names are exposed
the way ORT's plugin-EP packages expose them, and an old onnxruntime is refused by name."""
from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import onnxruntime_mlx as om

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _add_model() -> bytes:
    g = helper.make_graph([helper.make_node("Add", ["a", "b"], ["y"], name="the_add")], "t",
                          [helper.make_tensor_value_info("a", TensorProto.FLOAT, [2, 3]),
                           helper.make_tensor_value_info("b", TensorProto.FLOAT, [3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m.SerializeToString()


def _feeds():
    return {"a": np.arange(6, dtype=np.float32).reshape(2, 3),
            "b": np.array([1, 2, 3], np.float32)}


# -- validation in Python -------------------------------------------------------------------

@pytest.mark.parametrize("options, key, allowed", [
    ({"compil": 0}, "compil", "the options are: cache_limit_mb, cache_size, compile,"),
    ({"cache_size": -3}, "cache_size", "an integer in [1, 1048576]"),
    ({"cache_size": "many"}, "cache_size", "an integer in [1, 1048576]"),
    ({"compile": 2}, "compile", "an integer in [0, 1]"),
    ({"compile": 0.5}, "compile", "an integer in [0, 1]"),
    ({"log_level": "debug"}, "log_level", "an integer in [0, 3]"),
    ({"int8_emulation": "on"}, "int8_emulation", "an integer in [0, 1] or auto"),
    ({"device": "GPU"}, "device", "auto, cpu, gpu"),
    ({"report_path": 3}, "report_path", "a path"),
])
def test_bad_option_is_a_value_error_naming_key_and_allowed_values(options, key, allowed):
    with pytest.raises(ValueError) as err:
        om.session_options(**({"device": "cpu"} | options))
    assert isinstance(err.value, om.OptionError)
    msg = str(err.value)
    assert repr(key) in msg and allowed in msg, msg


def test_bad_device_argument_is_a_value_error():
    with pytest.raises(om.OptionError, match=r"'device': 'GPU' is not one of auto, cpu, gpu"):
        om.session_options("GPU")
    with pytest.raises(om.OptionError, match="'device'"):
        om.InferenceSession(_add_model(), device="Cpu")


def test_good_options_are_normalized_to_strings():
    assert om.validate_options({"compile": False, "cache_size": "8", "log_level": 3,
                                "int8_emulation": "auto", "report_path": pathlib.Path("/tmp/r")}) \
        == {"compile": "0", "cache_size": "8", "log_level": "3", "int8_emulation": "auto",
            "report_path": "/tmp/r"}


def test_python_table_matches_the_eps_option_list():
    # The EP's parser (src/ep/options.cc) is the authority: its list of known keys and the
    # Python table must be the same set.
    src = (ROOT / "src/ep/options.cc").read_text()
    known = re.search(r"known\[\]\s*=\s*\{(.*?)\};", src, re.S)
    assert known, "the known[] option list moved out of src/ep/options.cc"
    keys = set(re.findall(r'"([a-z0-9_]+)"', known.group(1)))
    assert keys == set(om.OPTIONS)


def _int_options():
    # device_memory is chosen at registration, once per process (test_device_memory.py).
    return [(k, v) for k, v in om.OPTIONS.items()
            if any(isinstance(x, int) for x in v) and k != "device_memory"]


@pytest.mark.parametrize("key, spec", _int_options())
def test_python_ranges_match_the_eps_ranges(key, spec):
    # Both ends of the Python range are accepted by the EP (the session is on MLX and runs),
    # and one past either end is rejected by the EP's own parser when Python is bypassed.
    lo, hi = [x for x in spec if isinstance(x, int)]
    for value in (lo, hi):
        s = om.InferenceSession(_add_model(), "cpu", **{key: value})
        np.testing.assert_array_equal(s.run(None, _feeds())[0], _feeds()["a"] + _feeds()["b"])
    for value in (lo - 1, hi + 1):
        with pytest.raises(om.OptionError):
            om.validate_options({key: value})
        so = ort.SessionOptions()
        so.add_provider_for_devices(om.ep_devices("cpu"), {key: str(value)})
        with pytest.raises(Exception, match=f"option '{key}'"):
            ort.InferenceSession(_add_model(), sess_options=so, enable_fallback=0)


# -- no silent CPU fallback -----------------------------------------------------------------

def test_package_session_runs_on_mlx():
    s = om.InferenceSession(_add_model(), "cpu", fallback=False)
    assert om.EP_NAME in s.get_providers()
    np.testing.assert_array_equal(s.run(None, _feeds())[0], _feeds()["a"] + _feeds()["b"])


def test_ep_rejecting_its_options_raises_instead_of_falling_back(monkeypatch, capfd):
    # An option Python cannot see (the EP reads ORT_MLX_<KEY> from the environment) makes the
    # EP's CreateEp fail. Plain ORT answers that by printing the error and retrying on the CPU
    # EP alone; the package's session raises it.
    monkeypatch.setenv("ORT_MLX_CACHE_SIZE", "-3")
    with pytest.raises(Exception, match="cache_size"):
        om.InferenceSession(_add_model(), "cpu")
    out, err = capfd.readouterr()
    assert "Falling back" not in out + err
    # What plain ORT does with the same options, and how check_session detects it.
    with pytest.warns(UserWarning):
        plain = ort.InferenceSession(_add_model(), sess_options=om.session_options("cpu"))
    assert "Falling back" in capfd.readouterr().out
    with pytest.raises(om.NotOnMLXError, match="CPUExecutionProvider"):
        om.check_session(plain)


def test_unknown_option_never_reaches_ort(capfd):
    with pytest.raises(om.OptionError):
        om.InferenceSession(_add_model(), "cpu", compil=0)
    out, err = capfd.readouterr()
    assert "EP Error" not in out + err


# -- the library and the EP names ------------------------------------------------------------

def test_get_library_path_and_aliases():
    p = pathlib.Path(om.get_library_path())
    assert p.is_absolute() and p.is_file() and p.name.startswith("libonnxruntime_mlx_ep")
    assert om.library_path() == om.get_library_path()
    assert om.ep_names() == om.get_ep_names() == [om.EP_NAME]


def test_ep_names_are_what_the_library_registers():
    om.register()
    names = {d.ep_name for d in ort.get_ep_devices() if d.ep_vendor == "onnxruntime-mlx"}
    assert names == set(om.get_ep_names())


def test_library_path_prefers_the_package_folder(monkeypatch, tmp_path):
    # An installed wheel holds the library inside the package folder.
    monkeypatch.delenv("ORT_MLX_EP_LIBRARY", raising=False)
    pkg = tmp_path / "onnxruntime_mlx"
    pkg.mkdir()
    for name in ("__init__.py", "cpu_info.py"):  # (what the package reads at import)
        (pkg / name).write_text((ROOT / "python/onnxruntime_mlx" / name).read_text())
    (pkg / "libonnxruntime_mlx_ep.so").write_bytes(b"")
    code = "import onnxruntime_mlx as om; print(om.get_library_path())"
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                       text=True, env=dict(os.environ, PYTHONPATH=str(tmp_path)), timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(pkg / "libonnxruntime_mlx_ep.so")


# -- the ORT version ---------------------------------------------------------------------------

def test_ort_version_check():
    om.check_ort_version("1.23.0")
    om.check_ort_version("1.31.1")
    om.check_ort_version("2.0.0")
    with pytest.raises(ImportError, match=r"needs onnxruntime >= 1\.23.*1\.22\.2 is installed"):
        om.check_ort_version("1.22.2")
    with pytest.raises(ImportError):
        om.check_ort_version("garbage")


def test_old_onnxruntime_is_refused_at_import(tmp_path):
    fake = tmp_path / "onnxruntime"
    fake.mkdir()
    (fake / "__init__.py").write_text("__version__ = '1.20.1'\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), str(ROOT / "python")]))
    r = subprocess.run([sys.executable, "-c", "import onnxruntime_mlx"], capture_output=True,
                       text=True, env=env, timeout=120)
    assert r.returncode != 0
    assert "onnxruntime_mlx needs onnxruntime >= 1.23" in r.stderr
    assert "onnxruntime 1.20.1 is installed" in r.stderr


def test_unwritable_report_path_fails_session_creation(tmp_path):
    """A report_path the EP cannot append to fails the session, naming the path (instead of the
    report lines being dropped silently at the end)."""
    from onnx import TensorProto, helper
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])
    model = helper.make_model(helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y]),
                              opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    bad = tmp_path / "no such folder" / "report.jsonl"
    with pytest.raises(Exception, match="report_path.*no such folder"):
        om.InferenceSession(model.SerializeToString(), "cpu", report_path=str(bad))
    good = tmp_path / "report.jsonl"
    sess = om.InferenceSession(model.SerializeToString(), "cpu", report_path=str(good))
    assert sess.run(None, {"x": np.array([-1.0, 2.0], np.float32)})[0].tolist() == [0.0, 2.0]
