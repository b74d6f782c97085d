"""The EP sizes MLX's CUDA graphs at registration: MLX_MAX_OPS_PER_BUFFER=20 on MLX's CUDA
backend (a graph is launched once it holds that many kernels; MLX's own Hopper default of 100
leaves the GPU idle longer: docs/performance.md, "CUDA graph size"), unless the user exported a
value; untouched on other backends (Metal reads the same variable)."""
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]

WORKER = r"""
import ctypes
import onnxruntime_mlx as om
libc = ctypes.CDLL(None)
libc.getenv.restype = ctypes.c_char_p
before = libc.getenv(b"MLX_MAX_OPS_PER_BUFFER")
om.register()
after = libc.getenv(b"MLX_MAX_OPS_PER_BUFFER")
try:
    import mlx.core as mx
    cuda = bool(mx.cuda.is_available())
except Exception:
    cuda = False
print(repr(before), repr(after), cuda)
"""


def registered_value(**env):
    full = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT / "python"),
                                                                    os.environ.get("PYTHONPATH")])))
    full.pop("MLX_MAX_OPS_PER_BUFFER", None)
    full.update(env)
    r = subprocess.run([sys.executable, "-c", WORKER], env=full, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    before, after, cuda = r.stdout.split()
    return before, after, cuda == "True"


def test_registration_sets_the_graph_size_on_cuda_only():
    before, after, cuda = registered_value()
    assert before == "None"
    assert after == ("b'20'" if cuda else "None")


def test_a_value_the_user_exported_wins():
    assert registered_value(MLX_MAX_OPS_PER_BUFFER="7")[1] == "b'7'"
