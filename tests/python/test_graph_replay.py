"""gpu_graph_replay: on MLX's CUDA backend a warm compiled signature's run is kept as one CUDA
graph (kernels/cuda/graph_replay.h) and later runs launch it with their inputs copied in. The
results must be those of the compiled call (gpu_graph_replay=0) on every run, with new input
data each run; an out-of-range index must still fail the run; a bound buffer that moves drops
the graph (it reads the old one) and the run is still right. On the CPU device nothing is kept."""
import gc
import os

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto as TP, helper

import onnxruntime_mlx as om
from onnxruntime_mlx import runner
from oracle import DEVICE

GPU = pytest.mark.skipif(os.environ.get("ORT_MLX_TEST_DEVICE") != "gpu",
                         reason="graphs are kept on MLX's CUDA backend only")
RUNS = 9
MODELS = __import__("pathlib").Path(__file__).resolve().parents[1] / "models" / "llm"


def model():
    rng = np.random.default_rng(3)
    g = helper.make_graph(
        [helper.make_node("Gather", ["table", "ids"], ["e"], axis=0),
         helper.make_node("MatMul", ["x", "w"], ["t"]), helper.make_node("Add", ["t", "e"], ["u"]),
         helper.make_node("Tanh", ["u"], ["y"]), helper.make_node("ReduceSum", ["u"], ["s"], keepdims=0)],
        "kept",
        [helper.make_tensor_value_info("x", TP.FLOAT, [4, 64]), helper.make_tensor_value_info("ids", TP.INT64, [4])],
        [helper.make_tensor_value_info("y", TP.FLOAT, [4, 32]), helper.make_tensor_value_info("s", TP.FLOAT, [])],
        [helper.make_tensor("w", TP.FLOAT, [64, 32], rng.standard_normal((64, 32)).astype(np.float32)),
         helper.make_tensor("table", TP.FLOAT, [10, 32], rng.standard_normal((10, 32)).astype(np.float32))])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 9
    return m.SerializeToString()


def feeds(k):
    rng = np.random.default_rng(100 + k)
    return {"x": rng.standard_normal((4, 64)).astype(np.float32), "ids": rng.integers(0, 10, 4).astype(np.int64)}


def run_all(tmp_path, replay):
    report = tmp_path / f"r{replay}.jsonl"
    s = om.InferenceSession(model(), DEVICE, fallback=False, report_path=str(report), gpu_graph_replay=replay)
    outs = [s.run(None, feeds(k)) for k in range(RUNS)]
    del s
    gc.collect()
    (st,) = runner.read_fused_node_stats(report)
    return outs, st


def test_kept_graph_gives_the_compiled_calls_results(tmp_path):
    on, st_on = run_all(tmp_path, 1)
    off, st_off = run_all(tmp_path, 0)
    ref = ort.InferenceSession(model(), providers=["CPUExecutionProvider"])
    for k in range(RUNS):
        for a, b, r in zip(on[k], off[k], ref.run(None, feeds(k))):
            np.testing.assert_array_equal(a, b)  # the same kernels on the same data
            np.testing.assert_allclose(a, r, rtol=1e-4, atol=1e-4)
    assert st_off["replay_captures"] == 0 and st_off["replay_runs"] == 0, st_off
    if DEVICE == "gpu":
        # Run 1 probes, 2 traces, 3 calls it warm, 4 is kept, 5.. launch the kept graph.
        assert st_on["replay_captures"] == 1 and st_on["replay_failures"] == 0, st_on
        assert st_on["replay_runs"] == RUNS - 4, st_on
        assert st_on["compiled_runs"] == st_off["compiled_runs"], (st_on, st_off)
    else:
        assert st_on["replay_captures"] == 0 and st_on["replay_runs"] == 0, st_on


@GPU
def test_out_of_range_index_in_a_kept_graph_fails_the_run():
    s = om.InferenceSession(model(), DEVICE, fallback=False, gpu_graph_replay=1)
    for k in range(RUNS):
        s.run(None, feeds(k))
    bad = feeds(0)
    bad["ids"][2] = 10
    with pytest.raises(Exception, match="(?i)out of data bounds|out of range"):
        s.run(None, bad)
    good = s.run(None, feeds(1))  # the next run is right again
    ref = ort.InferenceSession(model(), providers=["CPUExecutionProvider"]).run(None, feeds(1))
    np.testing.assert_allclose(good[0], ref[0], rtol=1e-4, atol=1e-4)


DECODE = """
import gc, json, sys
import numpy as np
from onnxruntime_mlx import runner
from onnxruntime_mlx.generate import DEFAULT_PROMPT, Decoder
model, tmp, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
out = {}
for replay in (1, 0):
    report = f"{tmp}/decode-{replay}.jsonl"
    # max_length 1024: each K/V buffer (128 KiB) is read in place, not copied in each run
    dec = Decoder(model, "mlx", "gpu", share_buffer=True, max_length=1024, device_memory=1,
                  gpu_graph_replay=replay, report_path=report)
    runs, keep = [], []
    for _ in range(2):  # the first generation's cache stays allocated: the second's is elsewhere
        logits, past = dec.step(np.array([DEFAULT_PROMPT], np.int64), dec.empty_past(), len(DEFAULT_PROMPT))
        toks, rows = [], []
        for k in range(steps):
            rows.append(logits[0, -1].astype(np.float32))
            toks.append(int(np.argmax(rows[-1])))
            logits, past = dec.step(np.array([[toks[-1]]], np.int64), past, len(DEFAULT_PROMPT) + k + 1)
        runs.append((toks, rows))
        keep.append(past)
    del dec, keep, past
    gc.collect()
    (st,) = runner.read_fused_node_stats(report)
    np.save(f"{tmp}/logits-{replay}.npy", np.stack([np.stack(r[1]) for r in runs]))
    out[replay] = {"tokens": [r[0] for r in runs], "stats": st}
print(json.dumps(out))
"""


@GPU
@pytest.mark.parametrize("family,precision", [("llama", "fp32"), ("qwen2", "int4")])
def test_shared_buffer_decode_launches_the_kept_step(family, precision, tmp_path):
    """A shared-buffer decode with the KV cache in the EP's memory (read in place by the kept
    graph, its rows written there) gives the compiled call's tokens and logits; a second
    generation, with new cache buffers, drops the first graph and keeps a new one. (Its own
    process: device memory is chosen once per process, at registration.)"""
    import json
    import subprocess
    import sys
    steps = 16
    proc = subprocess.run([sys.executable, "-c", DECODE, str(MODELS / f"{family}-{precision}"), str(tmp_path),
                           str(steps)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    on, off = out["1"], out["0"]
    assert on["tokens"] == off["tokens"] and on["tokens"][0] == on["tokens"][1]
    np.testing.assert_array_equal(np.load(tmp_path / "logits-1.npy"), np.load(tmp_path / "logits-0.npy"))
    st_on, st_off = on["stats"], off["stats"]
    assert st_off["replay_runs"] == 0, st_off
    assert st_on["replay_captures"] == 2 and st_on["replay_drops"] == 1, st_on
    assert st_on["replay_runs"] >= 2 * (steps - 6), st_on


PREFILL = """
import gc, json, sys
import numpy as np
from onnxruntime_mlx import runner
from onnxruntime_mlx.generate import DEFAULT_PROMPT, Decoder
model, tmp, runs = sys.argv[1], sys.argv[2], int(sys.argv[3])
out = {}
for replay in (1, 0):
    report = f"{tmp}/prefill-{replay}.jsonl"
    dec = Decoder(model, "mlx", "gpu", gpu_graph_replay=replay, report_path=report)
    rng = np.random.default_rng(7)
    logits = []
    for k in range(runs):  # the same length, new tokens each run
        ids = rng.integers(3, 200, (1, len(DEFAULT_PROMPT))).astype(np.int64)
        lg, past = dec.step(ids, dec.empty_past(), len(DEFAULT_PROMPT))
        logits.append(lg)
    np.save(f"{tmp}/prefill-{replay}.npy", np.stack(logits))
    np.save(f"{tmp}/present-{replay}.npy", np.asarray(past["past_key_values.0.key"]))
    del dec, past
    gc.collect()
    (st,) = runner.read_fused_node_stats(report)
    out[replay] = st
print(json.dumps(out))
"""


@GPU
def test_prompt_with_an_empty_past_is_kept(tmp_path):
    """A prompt's past inputs have zero rows: nothing to copy or read, so the warm prompt is kept
    like any other signature, and each run with new tokens gives the compiled call's logits."""
    import json
    import subprocess
    import sys
    runs = 7
    proc = subprocess.run([sys.executable, "-c", PREFILL, str(MODELS / "llama-fp32"), str(tmp_path), str(runs)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    st_on, st_off = out["1"], out["0"]
    np.testing.assert_array_equal(np.load(tmp_path / "prefill-1.npy"), np.load(tmp_path / "prefill-0.npy"))
    np.testing.assert_array_equal(np.load(tmp_path / "present-1.npy"), np.load(tmp_path / "present-0.npy"))
    assert st_off["replay_runs"] == 0, st_off
    assert st_on["replay_captures"] == 1 and st_on["replay_failures"] == 0, st_on
    assert st_on["replay_runs"] == runs - 4, st_on
