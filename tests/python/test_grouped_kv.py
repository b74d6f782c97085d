"""MultiHeadAttention fed by the exporters' repeat_kv idiom (onnxruntime-genai's fp16/bf16 Llama
decoders): the EP hands the attention the grouped cache itself instead of copying it repeated
(ops/contrib/attention.cc, repeated_kv_source). Each graph runs on the MLX EP alone (no CPU fallback)
against ORT's CPU EP; the match must show in fewer MLX primitives than with
ORT_MLX_GROUPED_KV=0, and look-alike repetitions with another head order (Tile) must not match."""
import re

import numpy as np
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

import onnxruntime_mlx as om
from oracle import DEVICE, assert_close

rng = np.random.default_rng(0)  # reseeded per test by conftest.py
B, NKV, H = 2, 2, 8


def _i64(name, v):
    return numpy_helper.from_array(np.array(v, np.int64), name)


def _repeat_kv(prefix, present, n_heads, form):
    """Nodes turning present [B, Nkv, T, H] into [B, T, N*H] with each KV head repeated.
    form "exporter": Unsqueeze(2) -> Expand([B, Nkv, r, T, H]) -> Reshape([B, N, T, H]), KV head
    n // r for query head n (what GQA means); form "tile": Tile over the head axis, KV head
    n % Nkv for query head n (another model, which must not be taken for grouped heads)."""
    r = n_heads // NKV
    p = prefix
    nodes = [helper.make_node("Shape", [present], [f"{p}_shape"])]
    if form == "exporter":
        nodes += [
            helper.make_node("Slice", [f"{p}_shape", "i0", "i2"], [f"{p}_bn"]),
            helper.make_node("Slice", [f"{p}_shape", "i2", "i4"], [f"{p}_th"]),
            helper.make_node("Slice", [f"{p}_shape", "i0", "i1"], [f"{p}_b"]),
            helper.make_node("Concat", [f"{p}_bn", "rep", f"{p}_th"], [f"{p}_expand_to"], axis=0),
            helper.make_node("Concat", [f"{p}_b", "heads", f"{p}_th"], [f"{p}_heads_shape"], axis=0),
            helper.make_node("Unsqueeze", [present, "i2"], [f"{p}_u"]),
            helper.make_node("Expand", [f"{p}_u", f"{p}_expand_to"], [f"{p}_e"]),
            helper.make_node("Reshape", [f"{p}_e", f"{p}_heads_shape"], [f"{p}_bnth"]),
        ]
    else:
        nodes += [helper.make_node("Tile", [present, "tile_reps"], [f"{p}_bnth"])]
    nodes += [
        helper.make_node("Transpose", [f"{p}_bnth"], [f"{p}_bthn"], perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", [f"{p}_bthn", "packed"], [f"{p}_packed"]),
    ]
    return nodes, [numpy_helper.from_array(np.array([1, r, 1, 1], np.int64), "tile_reps"),
                   _i64("rep", [r]), _i64("heads", [n_heads]), _i64("packed", [0, 0, n_heads * H])]


def _model(n_heads, form, unidirectional, dtype=np.float32):
    """q [B, S, N*H]; k, v [B, S, Nkv*H] appended to past [B, Nkv, P, H] (outputs present_*),
    repeated to N heads and attended by MultiHeadAttention."""
    nodes, inits = [], [_i64("i0", [0]), _i64("i1", [1]), _i64("i2", [2]), _i64("i4", [4]),
                        _i64("bsnh", [0, 0, NKV, H])]
    for x in ("k", "v"):
        nodes += [helper.make_node("Reshape", [x, "bsnh"], [f"{x}_bsnh"]),
                  helper.make_node("Transpose", [f"{x}_bsnh"], [f"{x}_bnsh"], perm=[0, 2, 1, 3]),
                  helper.make_node("Concat", [f"past_{x}", f"{x}_bnsh"], [f"present_{x}"], axis=2)]
        rk, ri = _repeat_kv(x, f"present_{x}", n_heads, form)
        nodes += rk
        inits += [i for i in ri if i.name not in {j.name for j in inits}]
    nodes.append(helper.make_node("MultiHeadAttention", ["q", "k_packed", "v_packed"], ["out"],
                                  domain="com.microsoft", num_heads=n_heads, unidirectional=unidirectional))
    f = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    inputs = [helper.make_tensor_value_info("q", f, [B, "S", n_heads * H])]
    inputs += [helper.make_tensor_value_info(x, f, [B, "S", NKV * H]) for x in ("k", "v")]
    inputs += [helper.make_tensor_value_info(f"past_{x}", f, [B, NKV, "P", H]) for x in ("k", "v")]
    outputs = [helper.make_tensor_value_info(n, f, None) for n in ("out", "present_k", "present_v")]
    g = helper.make_graph(nodes, "grouped_kv", inputs, outputs, inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    m.ir_version = 8
    return m.SerializeToString()


def _feeds(n_heads, s, p, dtype=np.float32):
    f = lambda *shape: rng.standard_normal(shape).astype(dtype)  # noqa: E731
    return {"q": f(B, s, n_heads * H), "k": f(B, s, NKV * H), "v": f(B, s, NKV * H),
            "past_k": f(B, NKV, p, H), "past_v": f(B, NKV, p, H)}


def _primitives(capfd, model, feeds, grouped, monkeypatch):
    """Runs the model on the MLX EP alone, three times (an eager probe, then compiled runs);
    returns the last run's outputs and how many MLX primitives the first (eager) evaluation
    ran, from log_level=3. Every run must give the same outputs."""
    monkeypatch.setenv("ORT_MLX_GROUPED_KV", "1" if grouped else "0")
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so = om.record_assignment(om.session_options(DEVICE, fallback=False, so=so, log_level=3))
    sess = ort.InferenceSession(model, sess_options=so)
    capfd.readouterr()
    first = sess.run(None, feeds)
    err = capfd.readouterr().err
    counts = [sum(int(n) for n in re.findall(r"=(\d+)", line)) for line in err.splitlines() if "evaluates:" in line]
    assert counts, err[-2000:]
    for _ in range(2):  # the compiled runs trace the same translation
        outs = sess.run(None, feeds)
        for a, b in zip(outs, first):
            np.testing.assert_allclose(a.astype(np.float32), b.astype(np.float32), rtol=1e-3, atol=1e-3)
    placement = om.placement(sess)
    assert set(placement) == {om.EP_NAME}, placement  # every node, MultiHeadAttention included
    return outs, counts[-1]


# (query heads, new tokens S, past length P): a decode step, a prompt, a prompt after a past.
CASES = [(4, 1, 7), (4, 5, 0), (8, 3, 4)]


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("n_heads,s,p", CASES)
@pytest.mark.parametrize("unidirectional", [0, 1])
def test_exporter_repeat_kv_runs_grouped(n_heads, s, p, unidirectional, dtype, capfd, monkeypatch):
    if unidirectional and s > 1 and p > 0:
        pytest.skip("ORT's CPU MultiHeadAttention masks a query shorter than its K/V (no past "
                    "input) its own way: rows before the last see keys [0, s], the last all keys")
    model = _model(n_heads, "exporter", unidirectional, dtype)
    feeds = _feeds(n_heads, s, p, dtype)
    want = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)
    grouped, n_grouped = _primitives(capfd, model, feeds, True, monkeypatch)
    repeated, n_repeated = _primitives(capfd, model, feeds, False, monkeypatch)
    for got in (grouped, repeated):
        for name, a, b in zip(("out", "present_k", "present_v"), got, want):
            assert_close(a, b, name)
    # The repeated cache's copies (two reshapes and a transpose for K and for V) are gone.
    assert n_grouped < n_repeated, (n_grouped, n_repeated)


@pytest.mark.parametrize("n_heads,s,p", CASES)
def test_tile_repetition_is_not_grouped(n_heads, s, p, capfd, monkeypatch):
    # Tile gives query head n KV head n % Nkv, not n // r: taking it for grouped heads would
    # attend the wrong heads (the outputs would differ from ORT's).
    model = _model(n_heads, "tile", 0)
    feeds = _feeds(n_heads, s, p)
    want = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)
    got, n_on = _primitives(capfd, model, feeds, True, monkeypatch)
    _, n_off = _primitives(capfd, model, feeds, False, monkeypatch)
    for name, a, b in zip(("out", "present_k", "present_v"), got, want):
        assert_close(a, b, name)
    assert n_on == n_off
