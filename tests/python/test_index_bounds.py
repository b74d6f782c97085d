"""Out-of-range indices fail the run as on ORT's CPU EP (INVALID_ARGUMENT naming the node, its
op, the index and the allowed range), in eager, compiled and shape-family runs, and the session
stays usable: the next good run is correct. Runs on the oracle's device (ORT_MLX_TEST_DEVICE)."""
import numpy as np
import onnxruntime as ort
import pytest
from onnx import helper

import oracle
import onnxruntime_mlx as om

rng = np.random.default_rng(23)
InvalidArgument = ort.capi.onnxruntime_pybind11_state.InvalidArgument
X = np.arange(15, dtype=np.float32).reshape(5, 3)
U = np.ones((1, 3), np.float32)
I64 = np.int64

# op, data inputs, the index input's name, a good index, bad indices, the range the message names,
# attributes, opset, domain.
CASES = {
    "Gather": ("Gather", {"x": X}, "i", np.array([4, -5], I64), [[7, 0], [0, -6]], "[-5,4]", {}, 21, ""),
    "GatherElements": ("GatherElements", {"x": X}, "i", np.array([[4, -5, 0]], I64),
                       [[[9, 0, 0]], [[0, -6, 0]]], "[-5,4]", {}, 21, ""),
    "GatherND": ("GatherND", {"x": X}, "i", np.array([[4, 2]], I64), [[[6, 1]], [[-6, 1]]], "[-5,4]", {}, 21, ""),
    "GatherND-column1": ("GatherND", {"x": X}, "i", np.array([[0, -3]], I64), [[[0, 3]], [[0, -4]]], "[-3,2]",
                         {}, 21, ""),
    "ScatterND": ("ScatterND", {"x": X}, "i", np.array([[3]], I64), [[[8]], [[-6]]], "[-5,4]", {}, 21, "", {"u": U}),
    "ScatterElements": ("ScatterElements", {"x": X}, "i", np.array([[4, -5, 1]], I64),
                        [[[8, 0, 0]], [[0, 0, -6]]], "[-5,4]", {}, 21, "", {"u": U}),
    "TensorScatter": ("TensorScatter", {"p": np.zeros((1, 4, 2), np.float32), "u": np.ones((1, 1, 2), np.float32)},
                      "w", np.array([3], I64), [[4], [-1]], "[0,3]", {}, 24, ""),
    "ReverseSequence": ("ReverseSequence", {"x": rng.standard_normal((4, 2)).astype(np.float32)}, "l",
                        np.array([4, 1], I64), [[5, 1], [0, -1]], "[0,4]", {"time_axis": 0, "batch_axis": 1}, 21, ""),
    "ArrayFeatureExtractor": ("ArrayFeatureExtractor", {"x": X}, "i", np.array([2, 0], I64), [[3, 0], [0, -1]],
                              "[0,2]", {}, 21, "ai.onnx.ml"),
    "MaxUnpool": ("MaxUnpool", {"x": rng.standard_normal((1, 1, 2, 2)).astype(np.float32)}, "i",
                  np.array([[[[5, 7], [13, 15]]]], I64), [[[[[16, 7], [13, 15]]]], [[[[5, -1], [13, 15]]]]], "[0,15]",
                  {"kernel_shape": [2, 2], "strides": [2, 2]}, 21, ""),
    "RotaryEmbedding": ("RotaryEmbedding", {"x": rng.standard_normal((1, 2, 8)).astype(np.float32)}, "pos",
                        np.array([[0, 3]], I64), [[[0, 9]], [[-1, 0]]], "[0,3]", {}, 21, "com.microsoft",
                        {"cos": rng.standard_normal((4, 4)).astype(np.float32),
                         "sin": rng.standard_normal((4, 4)).astype(np.float32)}),
}


def model_of(case, index_const=None):
    op, data, iname, good, _, _, attrs, opset, domain, *rest = CASES[case]
    after = rest[0] if rest else {}
    feeds = {**data, **({} if index_const is not None else {iname: good}), **after}
    order = list(data) + [iname] + list(after)
    inputs = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
              for n, a in feeds.items()]
    inits = [] if index_const is None else [helper.make_tensor(iname, 7, index_const.shape, index_const.ravel())]
    node = helper.make_node(op, order, ["y"], name=f"bad_{op}", domain=domain, **attrs)
    g = helper.make_graph([node], "g", inputs, [helper.make_empty_tensor_value_info("y")], inits)
    opsets = [helper.make_opsetid("", opset)] + ([helper.make_opsetid(domain, 1)] if domain else [])
    m = helper.make_model(g, opset_imports=opsets)
    m.ir_version = 10
    return m, feeds


def session(m, **options):
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so = om.record_assignment(om.session_options(oracle.DEVICE, fallback=False, so=so, **options))
    s = ort.InferenceSession(m.SerializeToString(), sess_options=so)
    assert set(om.placement(s)) == {om.EP_NAME}
    return s


def first_out_of_range(case, idx):
    lo, hi = map(int, CASES[case][5].strip("[]").split(","))
    if case.startswith("GatherND"):  # the range of the column the case breaks
        col = 0 if case == "GatherND" else 1
        idx = idx[..., col]
    return next(v for v in idx.ravel() if not lo <= v <= hi)


def assert_index_error(e, case, bad):
    op = CASES[case][0]
    bad_value = first_out_of_range(case, bad)
    msg = str(e)
    assert f"bad_{op}" in msg and op in msg, msg
    assert f"= {bad_value} must be within the inclusive range {CASES[case][5]}" in msg, msg
    assert msg.count("[MLX EP]") == 1 and msg.count("fused node") == 1, msg


@pytest.mark.parametrize("compile_", ["1", "0"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_runtime_index_out_of_range_fails_then_session_works(case, compile_):
    """A good run (three: the third is compiled), then each bad index (positive, negative) fails
    with INVALID_ARGUMENT, then a good run gives the CPU EP's result again."""
    m, feeds = model_of(case)
    iname = CASES[case][2]
    ref = oracle.run_cpu(m, feeds)[0]
    s = session(m, compile=compile_)
    for _ in range(3):
        oracle.assert_close(s.run(None, feeds)[0], ref)
    for bad in CASES[case][4]:
        bad = np.array(bad, I64)
        with pytest.raises(Exception):
            oracle.run_cpu(m, {**feeds, iname: bad})  # ORT's CPU EP fails too
        with pytest.raises(InvalidArgument) as e:
            s.run(None, {**feeds, iname: bad})
        assert_index_error(e.value, case, bad)
        oracle.assert_close(s.run(None, feeds)[0], ref)


@pytest.mark.parametrize("case", sorted(CASES))
def test_constant_index_out_of_range_fails(case):
    """A constant index is checked on the host when the graph is translated."""
    bad = np.array(CASES[case][4][0], I64)
    m, feeds = model_of(case, index_const=bad)
    s = session(m)
    with pytest.raises(InvalidArgument) as e:
        s.run(None, feeds)
    assert_index_error(e.value, case, bad)
    good = model_of(case, index_const=CASES[case][3])
    oracle.assert_close(session(good[0]).run(None, good[1])[0], oracle.run_cpu(*good)[0])


def test_index_check_option_off_returns_a_value():
    """index_check=0: no error (indices clipped, as before the check); the default checks."""
    m, feeds = model_of("Gather")
    bad = {**feeds, "i": np.array([7, 0], I64)}
    out = session(m, index_check="0").run(None, bad)[0]
    np.testing.assert_array_equal(out, X[[4, 0]])
    with pytest.raises(InvalidArgument):
        session(m).run(None, bad)


def test_one_hot_and_gather_block_quantized_follow_ort():
    """Not errors in ONNX/ORT: OneHot gives an all-off row, GatherBlockQuantized a zero row."""
    oracle.check_node("OneHot", {"i": np.array([7, -1, 2, -9], I64), "d": np.array(5, I64),
                                 "v": np.array([0, 1], np.float32)})
    feeds = {"i": np.array([7, -1, 2], I64)}
    m = oracle.make_node_model("GatherBlockQuantized", feeds, 1, {"bits": 4, "block_size": 16, "quantize_axis": 1},
                               {"d": rng.integers(0, 255, (5, 8), dtype=np.uint8), "s": np.ones((5, 1), np.float32)},
                               domain="com.microsoft", output_types=[1], input_order=["d", "i", "s"])
    oracle.check_model(m, feeds)


def test_expand_negative_dimension_says_negative():
    x = X[:1]  # [1, 3]: -2 would broadcast with it, were it a dimension
    m = oracle.make_node_model("Expand", {"x": x, "shape": np.array([-2, 3], I64)})
    with pytest.raises(InvalidArgument, match="negative dimension"):
        session(m).run(None, {"x": x, "shape": np.array([-2, 3], I64)})


def test_decode_token_out_of_vocabulary_fails_in_a_shape_family(tmp_path):
    """A decoder whose token id is past its vocabulary (512) fails the step, also when the steps
    run as a shape family (the embedding Gather inside a compiled segment), and the next good
    step gives the CPU EP's logits."""
    import gc
    import pathlib
    from onnxruntime_mlx import runner
    from onnxruntime_mlx.generate import Decoder
    model = pathlib.Path(__file__).resolve().parents[1] / "models" / "llm" / "llama-fp32"
    report = tmp_path / "report.jsonl"
    dec = Decoder(model, "mlx", oracle.DEVICE, report_path=str(report))
    cpu = Decoder(model, "cpu")
    prompt = np.array([[1, 2, 3]], I64)
    logits, past = dec.step(prompt, dec.empty_past(), 3)
    _, cpast = cpu.step(prompt, cpu.empty_past(), 3)
    total = 3
    for _ in range(6):
        nxt = np.array([[int(np.argmax(logits[0, -1]))]], I64)
        total += 1
        logits, past = dec.step(nxt, past, total)
        _, cpast = cpu.step(nxt, cpast, total)
    for bad in (99999, -513):
        with pytest.raises(InvalidArgument) as e:
            dec.step(np.array([[bad]], I64), past, total + 1)
        msg = str(e.value)
        del e  # its traceback holds the session, whose statistics are written when it goes
        assert f"= {bad} must be within the inclusive range [-512,511]" in msg and "Gather" in msg, msg
    nxt = np.array([[int(np.argmax(logits[0, -1]))]], I64)
    got, _ = dec.step(nxt, past, total + 1)
    ref, _ = cpu.step(nxt, cpast, total + 1)
    np.testing.assert_allclose(got, ref, rtol=1e-3, atol=1e-4)
    del dec
    gc.collect()
    st = runner.read_fused_node_stats(report)[0]
    assert st["piecewise_runs"] >= 4 and st["segment_calls"] > 0, st


def test_embed_layer_normalization_ids_out_of_range():
    """com.microsoft EmbedLayerNormalization: input_ids past the word table fail (ORT: "input
    index out of range"), compiled and eager, and the session goes on."""
    from onnx import numpy_helper
    inits = {"w": rng.standard_normal((10, 4)).astype(np.float32),
             "p": rng.standard_normal((8, 4)).astype(np.float32),
             "g": np.ones(4, np.float32), "b": np.zeros(4, np.float32)}
    node = helper.make_node("EmbedLayerNormalization", ["ids", "", "w", "p", "", "g", "b"], ["y", "mi"],
                            domain="com.microsoft", name="bad_EmbedLayerNormalization")
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("ids", 6, [1, 2])],
                          [helper.make_tensor_value_info("y", 1, None), helper.make_tensor_value_info("mi", 6, None)],
                          [numpy_helper.from_array(v, k) for k, v in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)])
    m.ir_version = 10
    good = {"ids": np.array([[9, 0]], np.int32)}
    ref = oracle.run_cpu(m, good)[0]
    s = session(m)
    for _ in range(3):
        oracle.assert_close(s.run(None, good)[0], ref)
    for bad in (10, -1):
        with pytest.raises(InvalidArgument) as e:
            s.run(None, {"ids": np.array([[0, bad]], np.int32)})
        msg = str(e.value)
        assert "bad_EmbedLayerNormalization" in msg and f"= {bad} must be within the inclusive range [0,9]" in msg, msg
        oracle.assert_close(s.run(None, good)[0], ref)
