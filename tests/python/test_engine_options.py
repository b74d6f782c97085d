"""The engine options that choose between two exact translations (docs/options.md: step_order,
fused_rotary, zero_bias, grouped_kv, cpu_gemv) reach the code they switch, given as a provider
option or through their environment alias (ORT_MLX_<NAME>), and change nothing in the results.
Each test sees the switch's effect in what MLX evaluates (log_level=3 names every primitive of an
evaluation). step_order: test_host_fold.py (test_family_orders_fixed_steps_together), on a
decoder whose graph order cuts its fixed steps apart."""
import json
import re
from collections import Counter

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxruntime_mlx as om
import oracle
from oracle import run_cpu

rng = np.random.default_rng(7)
MS = "com.microsoft"


@pytest.fixture(params=["option", "env"])
def switch(request, monkeypatch):
    """switch(name, value) -> provider options: the option itself, or {} with its environment
    alias set instead."""
    def set_switch(name, value):
        if request.param == "env":
            monkeypatch.setenv("ORT_MLX_" + name.upper(), str(value))
            return {}
        return {name: str(value)}
    return set_switch


def _session(model, capfd=None, **options):
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so = om.record_assignment(om.session_options("cpu", fallback=False, so=so, **options))
    sess = ort.InferenceSession(model.SerializeToString(), sess_options=so)
    assert set(om.placement(sess)) == {om.EP_NAME}, om.placement(sess)
    return sess


def _evaluated(capfd, model, feeds, **options):
    """The outputs of one run on the MLX EP and the primitives its evaluation ran, by name."""
    sess = _session(model, log_level=3, **options)
    capfd.readouterr()
    outs = sess.run(None, feeds)
    lines = [ln for ln in capfd.readouterr().err.splitlines() if "evaluates:" in ln]
    assert lines, "log_level=3 printed no evaluation"
    prims = Counter()
    for name, n in re.findall(r" (\S+)=(\d+)", lines[-1].split("evaluates:", 1)[1]):
        prims[name] += int(n)
    return outs, prims


def _model(nodes, inputs, outputs, inits=(), ms=False):
    g = helper.make_graph(nodes, "switch", inputs, outputs, list(inits))
    opsets = [helper.make_opsetid("", 17)] + ([helper.make_opsetid(MS, 1)] if ms else [])
    m = helper.make_model(g, opset_imports=opsets)
    m.ir_version = 8
    return m


def _f32(name, shape):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def test_cpu_gemv(capfd, switch):
    """One row times a weight fed each run (a constant one takes the packed kernel): the EP's
    sgemv kernel (RowGemv) by default, MLX's Matmul with cpu_gemv=0."""
    w = rng.standard_normal((64, 48)).astype(np.float32)
    model = _model([helper.make_node("MatMul", ["x", "w"], ["y"])], [_f32("x", [1, 64]), _f32("w", [64, 48])],
                   [_f32("y", None)])
    feeds = {"x": rng.standard_normal((1, 64)).astype(np.float32), "w": w}
    ref = run_cpu(model, feeds)[0]
    (on,), p_on = _evaluated(capfd, model, feeds)
    (off,), p_off = _evaluated(capfd, model, feeds, **switch("cpu_gemv", 0))
    assert p_on["RowGemv"] == 1 and p_on["Matmul"] == 0, p_on
    assert p_off["RowGemv"] == 0 and p_off["Matmul"] == 1, p_off
    for y in (on, off):
        np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5)


def test_fused_rotary(capfd, switch):
    """RotaryEmbedding's halves rotation: one compiled kernel by default, separate multiply/add
    kernels with fused_rotary=0; on the CPU device while runs are walked (cpu_caller_eval, on by
    default) the separate ops too, which the walk computes. The same roundings: equal results."""
    B, S, N, H = 1, 3, 2, 16
    ang = np.outer(np.arange(8), 1.0 / 10000.0 ** (np.arange(0, H, 2) / H))
    inits = [numpy_helper.from_array(np.cos(ang).astype(np.float32), "cos"),
             numpy_helper.from_array(np.sin(ang).astype(np.float32), "sin")]
    node = helper.make_node("RotaryEmbedding", ["x", "pos", "cos", "sin"], ["y"], domain=MS, num_heads=N)
    model = _model([node], [_f32("x", [B, S, N * H]), helper.make_tensor_value_info("pos", TensorProto.INT64, [B, S])],
                   [_f32("y", None)], inits, ms=True)
    feeds = {"x": rng.standard_normal((B, S, N * H)).astype(np.float32),
             "pos": np.array([[2, 3, 4]], np.int64)}
    ref = run_cpu(model, feeds)[0]
    (on,), p_on = _evaluated(capfd, model, feeds, cpu_caller_eval="0")
    (off,), p_off = _evaluated(capfd, model, feeds, cpu_caller_eval="0", **switch("fused_rotary", 0))
    (walked,), p_walked = _evaluated(capfd, model, feeds)
    compiled = lambda p: sum(n for name, n in p.items() if name.startswith("Compiled"))  # noqa: E731
    assert compiled(p_on) == 1 and compiled(p_off) == 0 and compiled(p_walked) == 0, (p_on, p_off, p_walked)
    assert p_off["Multiply"] >= p_on["Multiply"] + 2 and p_walked["Multiply"] >= p_on["Multiply"] + 2, (p_on, p_off)
    np.testing.assert_array_equal(on, off)
    np.testing.assert_array_equal(on, walked)
    np.testing.assert_allclose(on, ref, rtol=1e-5, atol=1e-5)


def test_zero_bias(capfd, switch):
    """MultiHeadAttention with an attention_bias that is a constant of zeros: left out by
    default (no array added to the scores), added with zero_bias=0. The same results. (On the
    CPU the explicit math, cpu_attention=0: the attention kernel takes a bias as an input of
    its one primitive either way.)"""
    B, S, N, H = 1, 2, 2, 8
    bias = numpy_helper.from_array(np.zeros((1, N, S, S), np.float32), "attention_bias")
    node = helper.make_node("MultiHeadAttention", ["q", "k", "v", "", "", "attention_bias"], ["y"],
                            domain=MS, num_heads=N)
    model = _model([node], [_f32(n, [B, S, N * H]) for n in ("q", "k", "v")], [_f32("y", None)], [bias], ms=True)
    feeds = {n: rng.standard_normal((B, S, N * H)).astype(np.float32) for n in ("q", "k", "v")}
    ref = run_cpu(model, feeds)[0]
    explicit = {"cpu_attention": "0"} if oracle.DEVICE == "cpu" else {}
    (on,), p_on = _evaluated(capfd, model, feeds, **explicit)
    (off,), p_off = _evaluated(capfd, model, feeds, **explicit, **switch("zero_bias", 0))
    assert sum(p_off.values()) > sum(p_on.values()), (p_on, p_off)
    np.testing.assert_allclose(on, off, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(on, ref, rtol=1e-4, atol=1e-5)


def test_grouped_kv(capfd, switch):
    """MultiHeadAttention over the exporters' repeated K/V: the grouped cache under it by
    default, the repeated heads as given with grouped_kv=0 (more primitives: the repetition)."""
    from test_grouped_kv import _feeds, _model as grouped_kv_model
    import onnx
    model = onnx.load_from_string(grouped_kv_model(4, "exporter", 0))
    feeds = _feeds(4, 1, 7)
    ref = run_cpu(model, feeds)
    on, p_on = _evaluated(capfd, model, feeds)
    off, p_off = _evaluated(capfd, model, feeds, **switch("grouped_kv", 0))
    assert sum(p_off.values()) > sum(p_on.values()), (p_on, p_off)
    for a, b, r in zip(on, off, ref):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(a, r, rtol=1e-4, atol=1e-5)


def test_switch_values_are_checked(capfd):
    """0 and 1 only: anything else fails the EP's creation with a message naming the option (ORT's
    Python layer prints it and retries on the CPU EP alone)."""
    model = _model([helper.make_node("Relu", ["x"], ["y"])], [_f32("x", [2])], [_f32("y", None)])
    for name in ("step_order", "fused_rotary", "zero_bias", "grouped_kv", "cpu_gemv", "gpu_kernels",
                 "inplace_rows"):
        with pytest.raises(om.OptionError, match=name):  # the package checks before ORT sees it
            om.session_options("cpu", **{name: "2"})
        om.register()
        so = ort.SessionOptions()  # and the EP itself, given the value through ORT directly
        so.add_provider_for_devices(om.ep_devices("cpu"), {name: "2"})
        with pytest.warns(UserWarning):
            s = ort.InferenceSession(model.SerializeToString(), sess_options=so)
        assert om.EP_NAME not in s.get_providers()
        out, err = capfd.readouterr()
        assert f"option '{name}': '2' is not an integer in [0, 1]" in out + err


def _hard_swish_model(c=8, blocks=1):
    """A per-channel affine and a hard-swish, as PaddleOCR's exporter writes them (`blocks` of
    them in a chain)."""
    inits = [numpy_helper.from_array(rng.standard_normal((1, c, 1, 1)).astype(np.float32), "s"),
             numpy_helper.from_array(rng.standard_normal((1, c, 1, 1)).astype(np.float32), "b"),
             numpy_helper.from_array(np.array(3, np.float32), "three"),
             numpy_helper.from_array(np.array(0, np.float32), "zero"),
             numpy_helper.from_array(np.array(6, np.float32), "six")]
    nodes = []
    for k in range(blocks):
        x, y = ("x" if k == 0 else f"y{k}"), ("y" if k == blocks - 1 else f"y{k + 1}")
        nodes += [helper.make_node("Mul", [x, "s"], [f"a{k}"]), helper.make_node("Add", [f"a{k}", "b"], [f"n{k}"]),
                  helper.make_node("Add", [f"n{k}", "three"], [f"p{k}"]),
                  helper.make_node("Clip", [f"p{k}", "zero", "six"], [f"q{k}"]),
                  helper.make_node("Mul", [f"n{k}", f"q{k}"], [f"m{k}"]), helper.make_node("Div", [f"m{k}", "six"], [y])]
    model = _model(nodes, [_f32("x", [2, c, 16, 16])], [_f32("y", None)], inits)
    return model, {"x": rng.standard_normal((2, c, 16, 16)).astype(np.float32)}


def _fused_kernels(lines):
    return sum(int(n) for n in re.findall(r" Compiled\w*=(\d+)", lines[-1]))


def test_cpu_fuse(capfd, switch):
    """A compiled run's elementwise chain (a per-channel affine and a hard-swish) is one
    generated kernel with cpu_fuse=1 (a primitive named Compiled...), and MLX's own ops with
    cpu_fuse=0 (compile mode no_fuse while the EP traces); the outputs equal ORT's CPU EP."""
    model, feeds = _hard_swish_model()
    ref = run_cpu(model, feeds)[0]
    fused = {}
    for value in (1, 0):
        sess = _session(model, log_level=3, **switch("cpu_fuse", value))
        for _ in range(3):  # an eager probe, then the compiled trace and a compiled run
            capfd.readouterr()
            (y,) = sess.run(None, feeds)
            np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5)
        lines = [ln for ln in capfd.readouterr().err.splitlines() if "evaluates:" in ln]
        assert lines, "log_level=3 printed no evaluation"
        fused[value] = _fused_kernels(lines)
    assert fused[1] >= 1 and fused[0] == 0, fused


def _fused_kernels_by_run(model_feeds, capfd, tmp_path, runs=15):
    """A fresh session's first `runs` runs (cpu_fuse=auto): each run's count of MLX's generated
    kernels, and the session's report line. Every output equals ORT's CPU EP."""
    import gc
    import json
    model, feeds = model_feeds
    ref = run_cpu(model, feeds)[0]
    report = tmp_path / "report.jsonl"
    sess = _session(model, log_level=3, report_path=str(report))
    kernels = []
    for _ in range(runs):
        capfd.readouterr()
        (y,) = sess.run(None, feeds)
        np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5)
        kernels.append(_fused_kernels([ln for ln in capfd.readouterr().err.splitlines() if "evaluates:" in ln]))
    del sess
    gc.collect()
    return kernels, next(json.loads(ln) for ln in report.read_text().splitlines() if '"fused_node"' in ln)


def test_cpu_fuse_auto_keeps_one_trace(capfd, tmp_path):
    """cpu_fuse=auto (the default): a signature's compiled calls start with the unfused trace (its
    walk kept from the third, replayed after); its ninth run tries the fused trace (the first call
    traces it, then two timed calls), and the fused trace replaces the unfused one only when its
    best run is 5% faster than theirs. One is kept, counted in the report, and every later run
    uses it. Outputs equal ORT's CPU EP in every run, whichever trace ran. (Twelve blocks of
    16K-element arrays: the chain's MLX ops compute 1.2M elements a run, enough for a trial.)"""
    # 1 probe, 8 unfused runs, 3 fused trial calls, 3 with the kept trace
    kernels, st = _fused_kernels_by_run(_hard_swish_model(c=32, blocks=12), capfd, tmp_path)
    assert st["fusion_kept_fused"] + st["fusion_kept_unfused"] == 1, st
    assert kernels[1:9] == [0] * 8, kernels  # the unfused trace first
    assert kernels[9] >= 1 and kernels[10:12] == [kernels[9]] * 2, kernels  # the fused trial
    kept = kernels[9] if st["fusion_kept_fused"] else 0
    assert kernels[12:] == [kept] * 3, (kernels, st)
    # the unfused trace's walk kept at its third call, replayed at its next five, and at the
    # three later runs if that trace is kept (the fused one's generated kernels: no walk)
    assert st["walk_replays"] == (5 if st["fusion_kept_fused"] else 8), st


def test_cpu_fuse_auto_skips_a_small_trial(capfd, tmp_path):
    """cpu_fuse=auto: where the kept walk's MLX primitives compute fewer than 1M elements a run
    (8 channels here: 24K), MLX's fused kernels cannot repay their trial, so the unfused trace is
    kept untimed when its walk is kept (the report's fusion_trials_skipped): no fused kernel in any
    run, and the walk replayed from the fifth run on, the ninth to eleventh included. Outputs equal
    ORT's CPU EP. Broken by a trial made regardless (fused kernels at runs 10-12) or a skip that
    drops the walk."""
    kernels, st = _fused_kernels_by_run(_hard_swish_model(), capfd, tmp_path)
    assert st["fusion_trials_skipped"] == 1 and st["fusion_kept_fused"] + st["fusion_kept_unfused"] == 0, st
    assert kernels == [0] * 15, kernels
    assert st["walk_replays"] == 11, st


@pytest.mark.parametrize("value", [1, 0])
def test_cpu_poll(switch, tmp_path, value):
    """cpu_poll=1 (the default): after a short evaluation the next one polls MLX's results before
    sleeping, counted in the report (polled_evals); 0 never polls. Outputs equal ORT's CPU EP in
    every run: a poll that returned early would read unfinished results."""
    import gc
    import json
    model, _ = _hard_swish_model(c=2)
    report = tmp_path / "report.jsonl"
    sess = _session(model, report_path=str(report), **switch("cpu_poll", value))
    for i in range(20):
        feeds = {"x": rng.standard_normal((2, 2, 16, 16)).astype(np.float32)}
        (y,) = sess.run(None, feeds)
        np.testing.assert_allclose(y, run_cpu(model, feeds)[0], rtol=1e-5, atol=1e-5)
    del sess
    gc.collect()
    st = next(json.loads(ln) for ln in report.read_text().splitlines() if '"fused_node"' in ln)
    # every evaluation after a short one polls (after_short_evals counts them either way; how
    # many there are depends on the machine's load)
    assert st["polled_evals"] == (st["after_short_evals"] if value else 0), st
    if value and st["after_short_evals"] == 0:
        pytest.skip("no evaluation under cpu_poll_us on this machine now: polling never applied")


def test_cpu_hold_keeps_the_stream_thread_awake(tmp_path):
    """cpu_hold=1 (the default): a polled evaluation queues, ahead of its tasks, one that keeps
    MLX's stream thread spinning until the caller has queued them all, and after them one that
    spins until the next run begins (engine/stream_hold.h); the report counts held runs and the
    lingers the next run ended. cpu_hold=0 queues neither. Outputs equal ORT's CPU EP in every
    run: the spinning tasks only delay the stream thread."""
    import gc
    import json

    def session_counts(value):
        model, _ = _hard_swish_model(c=2)
        report = tmp_path / f"report{value}.jsonl"
        # a window of 5 ms: under a loaded machine (the suite's other workers) these
        # evaluations still count as short, so every one after the first polls and is held
        sess = _session(model, report_path=str(report), cpu_hold=value, cpu_poll_us=5000)
        feeds = [{"x": rng.standard_normal((2, 2, 16, 16)).astype(np.float32)} for _ in range(4)]
        want = [run_cpu(model, f)[0] for f in feeds]
        got = [sess.run(None, feeds[i % 4])[0] for i in range(80)]  # back to back: lingers pay
        for i, y in enumerate(got):
            np.testing.assert_allclose(y, want[i % 4], rtol=1e-5, atol=1e-5)
        del sess
        gc.collect()
        return next(json.loads(ln) for ln in report.read_text().splitlines() if '"fused_node"' in ln)

    on = session_counts(1)
    off = session_counts(0)  # the counts are the process's: a session with the option off adds none
    if on["polled_evals"] < 10:
        pytest.skip("few evaluations under cpu_poll_us on this machine now: holding seldom applied")
    assert on["process_held_runs"] >= on["polled_evals"], on
    assert on["process_hold_linger_hits"] >= 1, on
    assert off["process_held_runs"] == on["process_held_runs"], (on, off)
    assert off["process_hold_lingers"] == on["process_hold_lingers"], (on, off)


def _long_cumsum():
    """A cumulative sum of 4M floats and its input: evaluations of milliseconds on MLX's CPU
    device (its scan is one thread on any machine)."""
    x = rng.standard_normal((1, 1 << 22)).astype(np.float32)
    g = helper.make_graph([helper.make_node("CumSum", ["x", "axis"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(x.shape))],
                          [numpy_helper.from_array(np.array(1, np.int64), "axis")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9  # (onnxruntime-gpu 1.31 reads IR versions up to 13)
    return x, model


def test_cpu_poll_probes_after_long_evaluations(tmp_path):
    """Polling follows the last *polled* evaluation, and every 16th evaluation polls regardless
    (engine/program.cc, kPollProbeEvery): judging by the last evaluation, which also took the
    sleeping caller's wake-up, one slow run would stop polling for good. A program whose
    evaluations take milliseconds (a cumulative sum of 4M floats: MLX's CPU scan is one thread on
    any machine) polls in its first evaluation and in those probes only."""
    import gc
    import json
    x, model = _long_cumsum()
    report = tmp_path / "report.jsonl"
    sess = _session(model, report_path=str(report))
    for _ in range(48):
        sess.run(None, {"x": x})
    del sess
    gc.collect()
    st = next(json.loads(ln) for ln in report.read_text().splitlines() if '"fused_node"' in ln)
    evals = st["runs"]  # one evaluation a run
    assert st["polled_evals"] == st["after_short_evals"], st
    assert 1 + (evals - 1) // 16 <= st["polled_evals"] <= 2 + evals // 16, st


@pytest.mark.parametrize("window_us", [None, 100000])
def test_cpu_poll_window_is_the_option(tmp_path, window_us):
    """cpu_poll_us sets the window (default 200): evaluations of a few milliseconds (a cumulative
    sum of 4M floats) are long under the default, so only the first and the probes poll; under a
    100 ms window every one is short and each next one polls (ending as soon as the results are
    there). Outputs equal ORT's CPU EP's. Broken by the option not reaching the engine."""
    import gc
    import json
    x, model = _long_cumsum()
    report = tmp_path / "report.jsonl"
    opts = {} if window_us is None else {"cpu_poll_us": window_us}
    sess = _session(model, report_path=str(report), **opts)
    for _ in range(32):
        (y,) = sess.run(None, {"x": x})
    ref = run_cpu(model, {"x": x})[0]  # float32 sums of 4M terms: their order's rounding
    np.testing.assert_allclose(y, ref, rtol=1e-3, atol=1e-3 * float(np.abs(ref).max()))
    del sess
    gc.collect()
    st = next(json.loads(ln) for ln in report.read_text().splitlines() if '"fused_node"' in ln)
    evals = st["runs"]
    if window_us is None:
        assert st["polled_evals"] <= 2 + evals // 16, st
    else:
        assert st["polled_evals"] >= evals - 1, st


_CACHE_PROBE = """
import sys, numpy as np, onnxruntime as ort, onnxruntime_mlx as om
from onnx import TensorProto, helper, numpy_helper
n = 1024
w = numpy_helper.from_array(np.full((n, n), 1e-3, np.float32), "w")
nodes, prev = [], "x"
for i in range(6):  # six [n, n] float32 intermediates (4 MiB each) a run, freed as it goes
    nodes += [helper.make_node("MatMul", [prev, "w"], [f"m{i}"]), helper.make_node("Relu", [f"m{i}"], [f"r{i}"])]
    prev = f"r{i}"
g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, n, n])],
                      [helper.make_tensor_value_info(prev, TensorProto.FLOAT, None)], [w])
m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
m.ir_version = 9
opts = dict(a.split("=") for a in sys.argv[1:])
s = ort.InferenceSession(m.SerializeToString(), sess_options=om.session_options("cpu", fallback=False, **opts))
x = np.ones((4, n, n), np.float32)
for _ in range(3):
    s.run(None, {"x": x})
import mlx.core as mx
print("CACHE", mx.get_cache_memory())
"""

# A run whose own buffers come to more than the default cache: a 320 MiB x * x -> Relu (its
# output computed in MLX's memory, then copied into ORT's). Prints the report's cache fields,
# the minor page faults of each of the last runs, and the largest difference from numpy.
_LARGE_RUN_PROBE = """
import gc, json, resource, sys, tempfile, numpy as np, onnxruntime as ort, onnxruntime_mlx as om
from onnx import TensorProto, helper
g = helper.make_graph([helper.make_node("Mul", ["x", "x"], ["a"]), helper.make_node("Relu", ["a"], ["y"])], "g",
                      [helper.make_tensor_value_info("x", TensorProto.FLOAT, [80, 1024, 1024])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
m.ir_version = 9
report = tempfile.mktemp(suffix=".jsonl")
opts = dict(a.split("=") for a in sys.argv[1:])
s = ort.InferenceSession(m.SerializeToString(),
                         sess_options=om.session_options("cpu", fallback=False, report_path=report, **opts))
x = np.linspace(-3, 3, 80 << 20, dtype=np.float32).reshape(80, 1024, 1024)
faults = []
for _ in range(6):
    f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    y = s.run(None, {"x": x})[0]
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
    diff = float(np.abs(y - np.maximum(x * x, 0)).max())
    del y
del s
gc.collect()
st = next(json.loads(ln) for ln in open(report) if "process_cache_limit_raises" in ln)
print("PROBE", json.dumps({"raises": st["process_cache_limit_raises"], "limit": st["process_cache_limit_bytes"],
                           "faults": faults[3:], "diff": diff}))
"""


def test_cpu_cache_fits_a_runs_large_buffers():
    """A run whose own buffers (here a 320 MiB output, computed in MLX's memory and copied into
    ORT's) come to more than the default 256 MiB cache got them back from the OS as fresh pages,
    each zeroed on its first touch, every run (a 256 MiB x * x -> Relu 0.39x the time once it
    stopped; ep/memory_limits.h). Unless a session sets cache_limit_mb, the next run raises the
    limit to hold them: the later runs take (almost) no page faults. A session's own limit still
    holds. Outputs equal numpy. Broken by the limit not raised (81920 faults a run with 4 KiB
    pages) or raised over a session's own limit."""
    import subprocess
    import sys

    def probe(*opts):
        r = subprocess.run([sys.executable, "-c", _LARGE_RUN_PROBE, *opts], capture_output=True, text=True,
                           timeout=600)
        assert r.returncode == 0, r.stderr[-2000:]
        return json.loads(r.stdout.split("PROBE", 1)[1])

    fitted = probe()
    assert fitted["diff"] == 0.0, fitted
    assert fitted["raises"] >= 1 and fitted["limit"] >= 320 << 20, fitted
    assert max(fitted["faults"]) < 2000, fitted
    own = probe("cache_limit_mb=256")
    assert own["raises"] == 0 and own["diff"] == 0.0, own


# A KV cache's growth: a [rows, 1024] float32 input one row longer every run, concatenated
# with a row (4 MiB and more a run, each size new).
_GROWTH_PROBE = """
import sys, numpy as np, onnxruntime as ort, onnxruntime_mlx as om
from onnx import TensorProto, helper
g = helper.make_graph([helper.make_node("Concat", ["past", "row"], ["y"], axis=0)], "g",
                      [helper.make_tensor_value_info("past", TensorProto.FLOAT, ["n", 1024]),
                       helper.make_tensor_value_info("row", TensorProto.FLOAT, [1, 1024])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
m.ir_version = 9
# (cpu_in_place_io=0: the concatenation in MLX's buffers, not written into ORT's output)
so = om.session_options("cpu", fallback=False, cpu_in_place_io=0)
s = ort.InferenceSession(m.SerializeToString(), sess_options=so)
past, row = np.ones((1024, 1024), np.float32), np.ones((1, 1024), np.float32)
for _ in range(120):
    past = s.run(None, {"past": past, "row": row})[0]
import mlx.core as mx
print("CACHE", mx.get_cache_memory(), mx.get_memory_limit())
"""


def test_cpu_cache_keeps_a_runs_buffers():
    """MLX's CPU allocator keeps 32 MiB of freed buffers by default; unless a session sets
    cache_limit_mb the EP raises that to a quarter of MLX's memory limit, so a model whose
    activations exceed 32 MiB reuses its buffers instead of taking fresh (zeroed) pages from the
    OS every run; an explicit limit still applies. Broken by a default left at MLX's 32 MiB or
    an explicit limit no longer honoured."""
    import subprocess
    import sys

    def cache_after(*opts):
        r = subprocess.run([sys.executable, "-c", _CACHE_PROBE, *opts], capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-2000:]
        return int(r.stdout.split("CACHE", 1)[1])

    assert cache_after() > 48 << 20
    assert cache_after("cache_limit_mb=8") <= 8 << 20


def test_cpu_cache_does_not_hoard_growing_arrays():
    """The default cache holds at most 256 MiB (and a quarter of MLX's memory limit): MLX reuses
    a cached buffer only for a request at most two pages smaller, so arrays that grow every run
    (a decode step's KV cache) leave buffers it never reuses; a larger cache kept them all (a
    60M-parameter model's decode step @1024 took 56 ms in a fresh process instead of 10, every
    step's KV arrays on fresh pages). 120 runs of a 4 MiB array one row longer each time: broken
    by a default cache above 256 MiB."""
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-c", _GROWTH_PROBE], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    cache, limit = map(int, r.stdout.split("CACHE", 1)[1].split())
    assert cache <= min(256 << 20, limit // 4), (cache, limit)
    assert cache > 200 << 20, cache  # (the probe does fill it: the test can fail)
