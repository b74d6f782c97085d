"""Shape arithmetic folded on the host (engine/host_fold/host_fold.h): the Shape -> Gather -> Unsqueeze ->
Concat -> Reshape chains, Range over a length, Expand/Where/Div/Slice on shape values, as
exporters write them. Each graph runs on the MLX EP alone (no CPU fallback) against ORT's CPU
EP, over a new input shape every run (the shape family's decode-loop case) and a repeated one
(the compiled path); the EP's report must show the chains folded and no host read left. A graph
input's *data* feeding the same ops must not be folded: its values change between runs of one
signature."""
import gc
import pathlib

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxruntime_mlx as om
from onnxruntime_mlx import runner

rng = np.random.default_rng(0)  # reseeded per test by conftest.py


def _i64(name, v):
    return numpy_helper.from_array(np.array(v, np.int64), name)


def _model(nodes, inits, inputs, outputs):
    """An opset-17 model: inputs {name: (elem_type, shape)}, outputs {name: elem_type}."""
    g = helper.make_graph(nodes, "host_fold",
                          [helper.make_tensor_value_info(n, t, shape) for n, (t, shape) in inputs.items()],
                          [helper.make_tensor_value_info(n, t, None) for n, t in outputs.items()], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m.SerializeToString()


def _exporter_model():
    # x: [B, S, H] float. y = reshape(x, [B, S, H // 2, 2]) summed over the last axis, plus the
    # position ids (Range over S) as floats, masked by position < S - 1 (Where), expanded to
    # [B, S, H // 2]; z = the shape vector of x sliced and scaled (an int64 output).
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "c0"], ["b"], axis=0),
        helper.make_node("Gather", ["s", "c1"], ["sl"], axis=0),
        helper.make_node("Gather", ["s", "c2"], ["h"], axis=0),
        helper.make_node("Div", ["h", "c2"], ["h2"]),
        helper.make_node("Unsqueeze", ["b", "ax0"], ["b_"]),
        helper.make_node("Unsqueeze", ["sl", "ax0"], ["s_"]),
        helper.make_node("Unsqueeze", ["h2", "ax0"], ["h2_"]),
        helper.make_node("Concat", ["b_", "s_", "h2_", "two"], ["shape4"], axis=0),
        helper.make_node("Reshape", ["x", "shape4"], ["x4"]),
        helper.make_node("ReduceSum", ["x4", "last"], ["pairs"], keepdims=0),
        helper.make_node("Range", ["c0", "sl", "c1"], ["pos"]),
        helper.make_node("Sub", ["sl", "c1"], ["s_1"]),
        helper.make_node("Less", ["pos", "s_1"], ["keep"]),
        helper.make_node("Where", ["keep", "pos", "minus1"], ["pos_m"]),
        helper.make_node("Cast", ["pos_m"], ["pos_f"], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["pos_f", "ax1"], ["pos_col"]),
        helper.make_node("Concat", ["b_", "s_", "h2_"], ["shape3"], axis=0),
        helper.make_node("Expand", ["pos_col", "shape3"], ["pos3"]),
        helper.make_node("Add", ["pairs", "pos3"], ["y"]),
        helper.make_node("Slice", ["s", "ax1", "big"], ["tail"]),
        helper.make_node("Mul", ["tail", "c2"], ["z"]),
    ]
    inits = [_i64("c0", 0), _i64("c1", 1), _i64("c2", 2), _i64("ax0", [0]), _i64("ax1", [1]),
             _i64("two", [2]), _i64("last", [-1]), _i64("minus1", -1), _i64("big", [2**62])]
    return _model(nodes, inits, {"x": (TensorProto.FLOAT, ["B", "S", "H"])},
                  {"y": TensorProto.FLOAT, "z": TensorProto.INT64})


def _stats(report):
    return runner.read_fused_node_stats(report)[0]


def _run(model, feeds_list, tmp_path, **options):
    report = tmp_path / f"report{len(list(tmp_path.iterdir()))}.jsonl"
    so = om.record_assignment(om.session_options("cpu", fallback=False, report_path=str(report), **options))
    s = ort.InferenceSession(model, sess_options=so)
    assert set(om.placement(s)) == {om.EP_NAME}, om.placement(s)
    ref = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    for feeds in feeds_list:
        for got, want in zip(s.run(None, feeds), ref.run(None, feeds)):
            assert got.dtype == want.dtype and got.shape == want.shape
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    del s
    gc.collect()
    return _stats(report)


@pytest.mark.parametrize("lengths", ["new_every_run", "repeated"])
def test_exporter_shape_chains_fold(tmp_path, lengths):
    model = _exporter_model()
    sizes = [(2, S, 6) for S in range(3, 13)] if lengths == "new_every_run" else [(2, 5, 6)] * 6
    feeds = [{"x": rng.uniform(-1, 1, s).astype(np.float32)} for s in sizes]
    st = _run(model, feeds, tmp_path)
    assert st["host_folds"] > 0 and st["host_reads"] == 0, st
    off = _run(model, feeds, tmp_path, host_fold="0")
    assert off["host_folds"] == 0 and off["host_reads"] > 0, off  # the same graph reads without


def _range_of_input_model():
    # n: int64 [1] graph input: Range(0, n) and a Reshape to [n, -1]. n's *data* reaches both
    # (not a shape): never folded, so a compiled signature keyed by n's value stays right.
    nodes = [
        helper.make_node("Squeeze", ["n", "ax0"], ["n0"]),
        helper.make_node("Range", ["c0", "n0", "c1"], ["r"]),
        helper.make_node("Mul", ["r", "c2"], ["r2"]),
        helper.make_node("Concat", ["n", "minus1v"], ["shp"], axis=0),
        helper.make_node("Reshape", ["x", "shp"], ["y"]),
    ]
    inits = [_i64("c0", 0), _i64("c1", 1), _i64("c2", 2), _i64("ax0", [0]), _i64("minus1v", [-1])]
    return _model(nodes, inits, {"n": (TensorProto.INT64, [1]), "x": (TensorProto.FLOAT, [12])},
                  {"r2": TensorProto.INT64, "y": TensorProto.FLOAT})


def test_input_data_is_not_folded(tmp_path):
    x = rng.uniform(-1, 1, 12).astype(np.float32)
    feeds = [{"n": np.array([n], np.int64), "x": x} for n in (2, 3, 2, 4, 3, 6, 2, 2, 3)]
    st = _run(_range_of_input_model(), feeds, tmp_path)
    assert st["host_reads"] > 0, st


LLM = pathlib.Path(__file__).resolve().parents[1] / "models" / "llm"


def _greedy(model, fold, ids, steps, report):
    """A prompt then `steps` greedy decode steps on the EP (CPU device): (the prompt's logits,
    the steps' last-position logits, the run statistics)."""
    from onnxruntime_mlx.generate import Decoder
    dec = Decoder(model, "mlx", "cpu", report_path=str(report), host_fold=fold)
    assert set(om.placement(dec.session)) == {om.EP_NAME}
    prompt, past = dec.step(ids, dec.empty_past(), ids.shape[1])
    logits, total, seen = prompt, ids.shape[1], []
    for _ in range(steps):
        total += 1
        logits, past = dec.step(np.array([[int(np.argmax(logits[0, -1]))]], np.int64), past, total)
        seen.append(logits[0, -1])
    del dec, past
    gc.collect()
    return prompt, np.stack(seen), _stats(report)


def test_decode_reads_no_host_value(tmp_path):
    """onnxruntime-genai's int4 Llama: GroupQueryAttention reads total_sequence_length
    (Shape -> Gather -> Cast of the mask) and seqlens_k (ReduceSum(mask) - 1) on the host. In
    eager decode steps both fold, from the mask's shape and its data on the host: no MLX
    evaluation left but the probe's. The logits equal those of host_fold=0 (and ORT's CPU EP
    within tolerance, checked by test_llm)."""
    ids = np.array([[5, 9, 2, 7]], np.int64)
    _, on, st = _greedy(LLM / "llama-int4", "1", ids, 12, tmp_path / "on.jsonl")
    assert st["host_reads"] <= 2 and st["host_folds"] >= 12 * 2, st  # the first run's probe
    _, off, st = _greedy(LLM / "llama-int4", "0", ids, 12, tmp_path / "off.jsonl")
    assert st["host_reads"] >= 12 * 2 and st["host_folds"] == 0, st
    np.testing.assert_array_equal(on, off)


def test_fp16_multihead_decoder_folds(tmp_path):
    """onnxruntime-genai's fp16 Llama is built around MultiHeadAttention and RotaryEmbedding, with
    the exporter's shape arithmetic (Shape, Gather, Unsqueeze, Concat, Range, Expand, Where,
    ConstantOfShape, Tile) for its reshapes and mask: on the H200 its 0.44B form read 104 host
    values a decode step through MLX without folding. Here (2 layers, checked in): the prompt's
    logits match ORT's CPU EP, decode steps make no MLX evaluation for host values, and their
    logits equal host_fold=0's. (ORT's CPU EP cannot decode this model: its own fp16 buffer
    reuse fails on the first step, so decode is compared between the EP's two settings.)"""
    from onnxruntime_mlx.generate import Decoder
    model = LLM / "llama-fp16"
    ids = np.array([[5, 9, 2, 7, 11, 3]], np.int64)
    cpu = Decoder(model, "cpu")
    ref, _ = cpu.step(ids, cpu.empty_past(), ids.shape[1])
    prompt, on, st = _greedy(model, "1", ids, 10, tmp_path / "on.jsonl")
    np.testing.assert_allclose(prompt.astype(np.float32), ref.astype(np.float32), rtol=2e-2, atol=2e-2)
    assert st["host_folds"] > 11 * 40 and st["host_reads"] == 0, st  # 910 and 0 here
    _, off, st = _greedy(model, "0", ids, 10, tmp_path / "off.jsonl")
    assert st["host_reads"] > 8 * 10, st  # 90 here (132 with no kept segment walks)
    np.testing.assert_array_equal(on, off)


def _padded_decode(model, mask_first, steps, report, **options):
    """The fp16 Llama on the EP: a 6-token prompt and `steps` decode steps whose attention mask
    has `mask_first` in its first column (0: a left-padded sequence). The steps' logits."""
    from onnxruntime_mlx.generate import Decoder
    dec = Decoder(model, "mlx", "cpu", report_path=str(report), **options)
    assert set(om.placement(dec.session)) == {om.EP_NAME}
    past, seen = dec.empty_past(), []
    ids = np.array([[5, 9, 2, 7, 11, 3]], np.int64)
    total = ids.shape[1]
    for _ in range(steps + 1):
        mask = np.ones((1, total), np.int64)
        mask[0, 0] = mask_first
        logits, past = dec.step(ids, past, total, attention_mask=mask)
        ids = np.array([[int(np.argmax(logits[0, -1]))]], np.int64)
        seen.append(logits[0, -1].astype(np.float32))
        total += 1
    del dec, past
    gc.collect()
    return np.stack(seen[1:]), _stats(report)


def test_zero_attention_bias_is_left_out(tmp_path, monkeypatch):
    """The fp16 Llama's MultiHeadAttention takes an additive attention_bias built from the mask's
    data in fp16 (Cast, Sub, Where with -65504, Add, Tile). Folded on the host in decode steps,
    it is all zeros without padding, and the attention leaves it out (on MLX's CUDA backend that
    is what lets sdpa_vector run: it takes no mask array). Unpadded: the logits equal those of
    ORT_MLX_ZERO_BIAS=0 and every decode step evaluates fewer MLX arrays. Left-padded: the bias
    is not zero, is kept (the logits equal host_fold=0's, where nothing is folded) and changes
    the logits."""
    model = LLM / "llama-fp16"
    steps, layers = 6, 2
    monkeypatch.setenv("ORT_MLX_ZERO_BIAS", "0")
    kept, st_kept = _padded_decode(model, 1, steps, tmp_path / "kept.jsonl")
    monkeypatch.setenv("ORT_MLX_ZERO_BIAS", "1")
    left_out, st_out = _padded_decode(model, 1, steps, tmp_path / "out.jsonl")
    np.testing.assert_array_equal(left_out, kept)
    assert st_out["eval_arrays"] + steps * layers <= st_kept["eval_arrays"], (st_out, st_kept)
    padded, _ = _padded_decode(model, 0, steps, tmp_path / "padded.jsonl")
    padded_ref, _ = _padded_decode(model, 0, steps, tmp_path / "padded_ref.jsonl", host_fold="0")
    np.testing.assert_allclose(padded, padded_ref, rtol=1e-2, atol=1e-2)
    assert np.abs(padded - left_out).max() > 1e-2


@pytest.mark.parametrize("given_as", ["option", "env"])
def test_family_orders_fixed_steps_together(tmp_path, monkeypatch, given_as):
    """A shape family takes the steps in a topological order that puts fixed steps as early as
    their inputs allow: in the fp16 Llama each layer's products and rotary nodes are otherwise cut
    into three segments by the folded shape arithmetic of the attention between them (plan order,
    step_order=0, as a provider option or as its alias ORT_MLX_STEP_ORDER=0). Fewer segment calls
    a step, fewer arrays (the q and k rotary rows are one gather inside one compiled segment), the
    same logits."""
    model = LLM / "llama-fp16"
    # The graph as exported: fused sibling products (fuse_matmuls) already spare the plan order
    # two of its cuts (5 segment calls a step instead of 7).
    if given_as == "env":
        monkeypatch.setenv("ORT_MLX_STEP_ORDER", "0")
        plan, st_plan = _padded_decode(model, 1, 8, tmp_path / "plan.jsonl", fuse_matmuls="0")
        monkeypatch.delenv("ORT_MLX_STEP_ORDER")
    else:
        plan, st_plan = _padded_decode(model, 1, 8, tmp_path / "plan.jsonl", step_order="0", fuse_matmuls="0")
    grouped, st_grouped = _padded_decode(model, 1, 8, tmp_path / "grouped.jsonl", fuse_matmuls="0")
    np.testing.assert_array_equal(grouped, plan)
    assert st_grouped["piecewise_runs"] >= 6 and st_plan["piecewise_runs"] == st_grouped["piecewise_runs"]
    assert st_grouped["segment_calls"] * 2 <= st_plan["segment_calls"], (st_grouped, st_plan)  # 3 vs 7 a step
    assert st_grouped["eval_arrays"] < st_plan["eval_arrays"], (st_grouped, st_plan)
