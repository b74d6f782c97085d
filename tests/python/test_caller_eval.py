"""The CPU device's evaluation in one piece (engine/caller_eval.h, option cpu_caller_eval): the
run's graph walked by one thread, views, the EP's kernels and MLX's elementwise, Gather,
Matmul and reduction primitives computed by it. Each case runs in its own process (the report's
counts are process-wide), on the EP and ORT's CPU EP, with the walk on and off; outputs must
equal MLX's own evaluation bit for bit, and ORT's CPU EP within the stated tolerance."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import oracle

pytestmark = pytest.mark.skipif(oracle.DEVICE != "cpu", reason="the walk is the CPU device's")

_CASE = r"""
import json, sys, numpy as np, onnxruntime as ort, onnxruntime_mlx as om
from onnx import TensorProto as TP, helper, numpy_helper
case, report, walk = sys.argv[1], sys.argv[2], sys.argv[3]
rng = np.random.default_rng(5)
f32 = lambda *s: rng.standard_normal(s).astype(np.float32)
init = lambda n, a: numpy_helper.from_array(np.asarray(a), n)
N = helper.make_node
if case == "elementwise":
    # Every elementwise primitive the walk computes, over values with NaN, infinities, zeros,
    # large and small magnitudes, broadcast against a row and a scalar.
    x = f32(4, 32) * 30
    x[0, :6] = [np.nan, np.inf, -np.inf, 0.0, -0.0, 88.5]
    x[1, :4] = [-88.5, 1e-30, -1e-30, 87.9]
    feeds = {"x": x, "i": rng.integers(-50, 50, (4, 32)).astype(np.int64)}
    inits = [init("r", f32(32)), init("two", np.float32(2.0)), init("ax", np.array([1], np.int64)),
             init("idx", np.array([3, -1, 0, 2], np.int64)), init("w", f32(32, 16)), init("k", np.int64(3))]
    nodes = [N("Add", ["x", "r"], ["a"]), N("Sub", ["a", "two"], ["b"]), N("Mul", ["b", "x"], ["c"]),
             N("Div", ["c", "r"], ["d"]), N("Max", ["d", "x"], ["e"]), N("Min", ["e", "a"], ["f"]),
             N("Abs", ["f"], ["g"]), N("Sqrt", ["g"], ["h"]), N("Neg", ["h"], ["h2"]), N("Exp", ["x"], ["ex"]),
             N("Sigmoid", ["x"], ["sg"]), N("Tanh", ["x"], ["th"]), N("Erf", ["x"], ["er"]), N("Log", ["g"], ["lg"]),
             N("Pow", ["g", "r"], ["pw"]), N("Greater", ["x", "r"], ["gt"]), N("Where", ["gt", "sg", "th"], ["wh"]),
             N("Equal", ["i", "k"], ["eq"]), N("Not", ["eq"], ["ne"]), N("Cast", ["ne"], ["nef"], to=TP.FLOAT),
             N("Mul", ["i", "k"], ["ik"]), N("Neg", ["ik"], ["ikn"]), N("ReduceSum", ["ikn", "ax"], ["rs"], keepdims=1),
             N("Cast", ["rs"], ["rsf"], to=TP.FLOAT), N("Gather", ["x", "idx"], ["ga"], axis=0),
             N("MatMul", ["wh", "w"], ["mm"]), N("ReduceSum", ["er", "ax"], ["es"], keepdims=1),
             N("Concat", ["b", "c", "d", "e", "f", "h2", "ex", "sg", "th", "er", "lg", "pw", "wh", "nef", "ga"], ["cat"],
               axis=1),
             N("Concat", ["rsf", "es"], ["sums"], axis=1)]
    outs = ["cat", "mm", "sums"]
    types = {"x": TP.FLOAT, "i": TP.INT64}
elif case == "chain":
    # A wake-word head's size: every array small, so the caller walks it.
    feeds = {"x": f32(1, 64)}
    inits = [init("w1", f32(64, 64) * 0.1), init("b1", f32(64)), init("w2", f32(64, 32) * 0.1), init("k", f32(32))]
    nodes = [N("MatMul", ["x", "w1"], ["a"]), N("Add", ["a", "b1"], ["b"]), N("Relu", ["b"], ["c"]),
             N("MatMul", ["c", "w2"], ["d"]), N("Tanh", ["d"], ["e"]), N("Mul", ["e", "k"], ["f"]),
             N("Sigmoid", ["f"], ["g"]), N("Softmax", ["g"], ["y"], axis=-1)]
    outs, types = ["y"], {"x": TP.FLOAT}
elif case == "gathers":
    # Gathers whose slices are whole rows of the source (an embedding's: one run of memory each)
    # and ones whose slices are not (a middle axis, a strided source), and transposed heads made
    # row-major (rows of contiguous runs, and of strided elements).
    feeds = {"x": f32(2, 16, 48), "i": rng.integers(-30, 30, (3, 5)).astype(np.int64)}
    inits = [init("emb", f32(30, 4, 12)), init("j", np.array([1, 0, 3], np.int64)), init("m", f32(12))]
    nodes = [N("Gather", ["emb", "i"], ["e"], axis=0), N("Gather", ["emb", "j"], ["g1"], axis=1),
             N("Transpose", ["emb"], ["et"], perm=[2, 0, 1]), N("Gather", ["et", "j"], ["g2"], axis=1),
             N("Reshape", ["x", "shp"], ["xh"]), N("Transpose", ["xh"], ["xt"], perm=[0, 2, 1, 3]),
             N("Mul", ["xt", "m"], ["y1"]), N("Transpose", ["xh"], ["xu"], perm=[0, 3, 2, 1]), N("Neg", ["xu"], ["y2"]),
             N("Mul", ["e", "m"], ["y3"]), N("Tanh", ["g1"], ["y4"]), N("Abs", ["g2"], ["y5"])]
    inits.append(init("shp", np.array([2, 16, 4, 12], np.int64)))
    feeds["i"] = feeds["i"] % 30
    outs, types = ["y1", "y2", "y3", "y4", "y5", "xt", "xu"], {"x": TP.FLOAT, "i": TP.INT64}
elif case in ("gemv", "gemv_split"):
    # One row by a large weight: small arrays, but the product's kernel may split over the
    # OpenMP threads, so the stream thread walks it ("gemv_split", 4.2M elements); a program of
    # less work (cpu_program_parallel_min_flops: "gemv", 786K elements) runs its kernels on one
    # thread, and the caller walks it.
    k, n = (2048, 2048) if case == "gemv_split" else (512, 1536)
    feeds = {"x": f32(1, k)}
    inits = [init("w", f32(k, n) * 0.05)]
    nodes = [N("MatMul", ["x", "w"], ["p"]), N("Tanh", ["p"], ["y"])]
    outs, types = ["y"], {"x": TP.FLOAT}
elif case == "large_plain":  # large arrays and no convolution: left to MLX's evaluation
    feeds = {"x": f32(1, 8, 64, 64)}
    inits = [init("s", f32(8, 1, 1))]
    nodes = [N("Mul", ["x", "s"], ["m"]), N("Tanh", ["m"], ["t"]), N("Add", ["t", "x"], ["y"])]
    outs, types = ["y"], {"x": TP.FLOAT}
else:  # a convolution: the stream thread walks it ("conv"), its arrays large too ("large")
    feeds = {"x": f32(1, 8, 64, 64) if case == "large" else f32(1, 8, 12, 12)}
    inits = [init("w", f32(16, 8, 3, 3) * 0.1), init("s", f32(16, 1, 1))]
    nodes = [N("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), N("Mul", ["c", "s"], ["m"]), N("Tanh", ["m"], ["t"]),
             N("Add", ["t", "c"], ["y"])]
    outs, types = ["y"], {"x": TP.FLOAT}
    if case == "large":  # the channels' means over the blocked buffer: a float sum over one axis
        nodes.append(N("GlobalAveragePool", ["c"], ["g"]))
        outs.append("g")
g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(k, types[k], list(v.shape)) for k, v in feeds.items()],
                      [helper.make_tensor_value_info(o, TP.FLOAT, None) for o in outs], inits)
m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
m.ir_version = 9
s = ort.InferenceSession(m.SerializeToString(), sess_options=om.session_options(
    "cpu", fallback=False, report_path=report, cpu_caller_eval=walk, cpu_fuse="0"))
cpu = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
got = []
for run in range(int(sys.argv[4])):  # each run its own values (a kept walk must follow them)
    feeds = {k: (v + np.float32(run) * 0.25 if v.dtype == np.float32 else v) for k, v in feeds.items()}
    outs = s.run(None, feeds)
    got += outs
    if case != "elementwise":  # (there NaN and infinities meet ops whose NaN rules ORT and MLX set apart)
        for a, b in zip(outs, cpu.run(None, feeds)):  # (a 72-term product's rounding over outputs up to ~10)
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=5e-5 if case == "large" else 1e-5)
del s
line = next(json.loads(ln) for ln in open(report) if '"fused_node"' in ln)
np.savez(report + ".npz", *got)
print(json.dumps({k: line[k] for k in ("process_caller_arrays", "process_caller_stream_arrays", "process_caller_left",
                                       "process_caller_replays", "process_reused_outputs", "process_caller_released")}))
"""


def _run(case, walk, tmp_path, runs=3, **env_vars):
    report = str(tmp_path / f"{case}-{walk}-{runs}.jsonl")
    env = dict(os.environ)
    env.pop("ORT_MLX_CPU_CALLER_EVAL", None)
    env.pop("ORT_MLX_CPU_CALLER_REPLAY", None)
    env.update(env_vars)
    out = subprocess.run([sys.executable, "-c", _CASE, case, report, str(walk), str(runs)], capture_output=True,
                         text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    counts = json.loads(out.stdout.strip().splitlines()[-1])
    with np.load(report + ".npz") as z:
        return counts, [z[k] for k in sorted(z.files, key=lambda n: int(n.split("_")[1]))]


@pytest.mark.parametrize("case,where", [("elementwise", "process_caller_arrays"),
                                        ("chain", "process_caller_arrays"),
                                        ("gathers", "process_caller_arrays"),
                                        ("conv", "process_caller_stream_arrays"),
                                        ("gemv", "process_caller_arrays"),
                                        ("gemv_split", "process_caller_stream_arrays"),
                                        ("large", "process_caller_stream_arrays"),
                                        ("large_plain", None), ("large_unwalked", None)])
def test_walk_equals_mlxs_evaluation(case, where, tmp_path):
    """With the walk on, the whole graph is computed by it (nothing left to MLX), on the caller
    for a small graph and on the stream thread for one with a convolution or an EP kernel
    reading a large input (a one-row product's weight: parallel regions opened from the caller
    would make a second OpenMP team, whose workers sleep between regions) unless the program's
    kernels all run on one thread (a wake-word head's product), its arrays large
    (65K elements each) too (cpu_walk_large; its global average pooling a float sum over one axis,
    four outputs at a time); a graph of large arrays without a convolution, or
    with one and cpu_walk_large=0, is left to MLX's evaluation whole (no walk). The
    outputs are the bits of MLX's own evaluation (the walk off), and, for the graphs without
    NaN and infinities, ORT's CPU EP's within 1e-5. Broken by any of the walk's kernels
    computing other values than MLX's, or by a primitive the walk skips."""
    env = {"ORT_MLX_CPU_WALK_LARGE": "0"} if case == "large_unwalked" else {}
    case = "large" if case == "large_unwalked" else case
    on, got = _run(case, 1, tmp_path, ORT_MLX_CPU_CALLER_REPLAY="0", **env)
    off, want = _run(case, 0, tmp_path, **env)
    assert off["process_caller_arrays"] == off["process_caller_stream_arrays"] == 0, off
    if where is None:
        assert on == off, on
    else:
        assert on[where] > 0 and on["process_caller_left"] == 0, on
    if where == "process_caller_stream_arrays":
        assert on["process_caller_arrays"] == 0, on
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)  # NaN equals NaN here


@pytest.mark.parametrize("case", ["elementwise", "chain", "conv", "large"])
def test_kept_walk_follows_each_runs_inputs(case, tmp_path):
    """A compiled signature's walk is kept from its third compiled call (cpu_caller_replay) and
    computed again over each later run's inputs: over 10 runs of different values, every output
    is the bits of MLX's own evaluation of that run, and ORT's CPU EP's within 1e-5 (the graphs
    without NaN and infinities). A replay computes its arrays into the buffers they hold, where
    nothing else holds them (process_reused_outputs: several a replay); large ones (a
    convolution's 256 KiB activations) it lets go of after their last reader, for later steps
    to take (process_caller_released: three a replay). Broken by a replay that reads the kept
    run's inputs, skips a step, hands out arrays the next replay overwrites, writes into a buffer
    a view or the last run's outputs still read, or lets go of an array before its last reader."""
    on, got = _run(case, 1, tmp_path, runs=10)
    off, want = _run(case, 0, tmp_path, runs=10)
    assert on["process_caller_replays"] >= 5 and off["process_caller_replays"] == 0, (on, off)
    if case == "large":  # (the convolution, the Mul and the Tanh: the Add's output is the run's)
        assert on["process_caller_released"] >= 3 * on["process_caller_replays"], on
    else:
        assert on["process_caller_released"] == 0, on
        assert on["process_reused_outputs"] >= on["process_caller_replays"] and off["process_reused_outputs"] == 0, (on, off)
    assert len(got) == len(want)
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)


_GATHER = r"""
import sys, numpy as np, onnxruntime as ort, onnxruntime_mlx as om
from onnx import TensorProto as TP, helper, numpy_helper
g = helper.make_graph([helper.make_node("Gather", ["x", "i"], ["g"], axis=0), helper.make_node("Tanh", ["g"], ["y"])], "g",
                      [helper.make_tensor_value_info("x", TP.FLOAT, [5, 4]), helper.make_tensor_value_info("i", TP.INT64, [3])],
                      [helper.make_tensor_value_info("y", TP.FLOAT, None)])
m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
m.ir_version = 9
s = ort.InferenceSession(m.SerializeToString(), sess_options=om.session_options("cpu", fallback=False))
cpu = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
x = np.arange(20, dtype=np.float32).reshape(5, 4) / 10
for run in range(12):
    i = np.array([run % 5, 4 - run % 5, -1], np.int64)
    if run == 8:
        i = np.array([0, 7, 1], np.int64)  # out of range: the same error as without a kept walk
        try:
            s.run(None, {"x": x, "i": i})
        except Exception as e:
            print("error:", "out of data bounds" in str(e))  # the message ORT's CPU EP gives
            continue
        raise SystemExit("an out-of-range index gave a result")
    np.testing.assert_allclose(s.run(None, {"x": x, "i": i})[0], cpu.run(None, {"x": x, "i": i})[0], rtol=1e-6, atol=1e-6)
print("ok")
"""


def test_kept_walk_index_out_of_range_is_an_error():
    """A Gather whose indices are a run input: after the walk is kept, an out-of-range index
    still fails the run with the EP's index error (the kept walk does not compute that step;
    the compiled call's index check names it), and later runs are right again. Broken by a
    replay that gathers outside the source."""
    out = subprocess.run([sys.executable, "-c", _GATHER], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["error:", "True", "ok"], out.stdout


_EP_MEMORY_DECODE = r"""
import json, sys, numpy as np
from onnxruntime_mlx.generate import DEFAULT_PROMPT, Decoder
model, report, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
n = len(DEFAULT_PROMPT) + steps + 8
want, _, _ = Decoder(model, "cpu", share_buffer=True, max_length=n).generate(DEFAULT_PROMPT, steps)
dec = Decoder(model, "mlx", "cpu", device_memory=1, share_buffer=True, max_length=n, report_path=report)
got, _, _ = dec.generate(DEFAULT_PROMPT, steps)
del dec
import gc; gc.collect()
line = next(json.loads(ln) for ln in open(report) if '"fused_node"' in ln)
print(json.dumps({"same": got == want, "replays": line["process_caller_replays"]}))
"""


@pytest.mark.parametrize("model", ["llama-fp32", "llama-int4"])
def test_kept_walk_with_ep_memory(model, tmp_path):
    """A decode step with its KV cache in EP memory (device_memory=1, genai's shared buffer) is
    replayed as a kept walk like one in host memory: its outputs are copied or written into
    ORT's buffers, never adopted nor written by an MLX evaluation, which would detach them from
    the walk (the next replay then crashed). The tokens equal ORT's CPU EP's. Broken by keeping
    walks off with EP memory (no replays) or by handing a walk's outputs to MLX."""
    path = os.path.join(os.path.dirname(__file__), "..", "models", "llm", model)
    out = subprocess.run([sys.executable, "-c", _EP_MEMORY_DECODE, path, str(tmp_path / "r.jsonl"), "16"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r["same"] and r["replays"] >= 5, r


_LONG_BUFFER_STEP = r"""
import json, sys, numpy as np, onnxruntime as ort, onnxruntime_mlx as om
from onnx import TensorProto as TP, helper
report, P = sys.argv[1], int(sys.argv[2])
N, Nkv, H = 8, 2, 64
rng = np.random.default_rng(3)
f = lambda *s: rng.standard_normal(s).astype(np.float32)
inv = 1.0 / 10000 ** (np.arange(0, H, 2) / H)
ang = np.arange(P + 4)[:, None] * inv[None]
feeds = {"q": f(1, 1, (N + 2 * Nkv) * H), "pk": f(1, Nkv, P, H), "pv": f(1, Nkv, P, H),
         "cos": np.cos(ang).astype(np.float32), "sin": np.sin(ang).astype(np.float32)}
gqa = helper.make_node("GroupQueryAttention", ["q", "", "", "pk", "pv", "sk", "tl", "cos", "sin"], ["a", "k", "v"],
                       domain="com.microsoft", num_heads=N, kv_num_heads=Nkv, do_rotary=1)
nodes = [gqa, helper.make_node("Tanh", ["a"], ["y"])]
ins = [helper.make_tensor_value_info(k, TP.FLOAT, list(v.shape)) for k, v in feeds.items()]
ins += [helper.make_tensor_value_info("sk", TP.INT32, [1]), helper.make_tensor_value_info("tl", TP.INT32, [])]
outs = [helper.make_tensor_value_info(n, TP.FLOAT, None) for n in ("y", "k", "v")]
m = helper.make_model(helper.make_graph(nodes, "g", ins, outs),
                      opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
m.ir_version = 9
s = ort.InferenceSession(m.SerializeToString(), sess_options=om.session_options("cpu", fallback=False, report_path=report))
cpu = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
pos = 100  # (seqlens_k is read on the host: one position keeps one compiled signature)
for run in range(16):
    feeds.update(sk=np.array([pos], np.int32), tl=np.array(pos + 1, np.int32), q=f(1, 1, (N + 2 * Nkv) * H))
    got, want = s.run(None, feeds), cpu.run(None, feeds)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-4, atol=1e-5)
    for i in (1, 2):
        np.testing.assert_allclose(got[i][:, :, :pos + 1], want[i][:, :, :pos + 1], rtol=1e-5, atol=1e-6)
del s
line = next(json.loads(ln) for ln in open(report) if '"fused_node"' in ln)
print(json.dumps({k: line[k] for k in ("process_caller_stream_arrays", "process_caller_replays")}))
"""


def test_decode_step_over_a_long_buffer_is_walked(tmp_path):
    """A decode step's attention over a shared buffer of 4096 rows writes its presents' new rows
    alone: the walk's size rule counts its output row, not the presents' 2 x 512K elements, so
    the step is walked (and its walk kept) as at a short context. Outputs equal ORT's CPU EP's.
    Broken by counting the presents (or the Contiguous views of them) at their size."""
    out = subprocess.run([sys.executable, "-c", _LONG_BUFFER_STEP, str(tmp_path / "r.jsonl"), "4096"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r["process_caller_stream_arrays"] > 0 and r["process_caller_replays"] >= 3, r
