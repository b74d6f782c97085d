"""RNN, GRU and LSTM on the MLX EP against ORT's CPU EP: every direction, initial states,
sequence_lens, activations with alpha/beta, clip, GRU linear_before_reset, LSTM input_forget and
peepholes, both layouts, absent optional outputs, run-time weights, opsets; plus model-level
tests (a 2-layer bidirectional LSTM, a GRU streaming 100 chunks with carried state)."""
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxruntime_mlx as om
from oracle import DEVICE, assert_close, check_model, placement_of, run_cpu, run_mlx

rng = np.random.default_rng(0)
GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}
NOUT = {"RNN": 2, "GRU": 2, "LSTM": 3}


def rand(*shape, scale=0.5, dtype=np.float32):
    return rng.uniform(-scale, scale, size=shape).astype(dtype)


def make_inputs(op, T=5, B=3, I=4, H=6, direction="forward", bias=True, initial=False,
                lens=None, peep=False, layout=0, dtype=np.float32):
    """ONNX input name -> array, in the op's input order (None = omitted)."""
    D = 2 if direction == "bidirectional" else 1
    G = GATES[op]
    x = rand(T, B, I, scale=1.0, dtype=dtype)
    if layout == 1:
        x = np.ascontiguousarray(x.transpose(1, 0, 2))
    ins = {"X": x, "W": rand(D, G * H, I, dtype=dtype), "R": rand(D, G * H, H, dtype=dtype),
           "B": rand(D, 2 * G * H, dtype=dtype) if bias else None,
           "sequence_lens": np.asarray(lens, np.int32) if lens is not None else None,
           "initial_h": None}
    state = (D, B, H) if layout == 0 else (B, D, H)
    if initial:
        ins["initial_h"] = rand(*state, dtype=dtype)
    if op == "LSTM":
        ins["initial_c"] = rand(*state, dtype=dtype) if initial else None
        ins["P"] = rand(D, 3 * H, dtype=dtype) if peep else None
    return ins


def make_model(op, ins, attrs, outputs=None, opset=21, const=("W", "R", "B")):
    """One recurrent node; `const` inputs become initializers, the rest graph inputs.
    outputs: node output names with "" for an absent optional output."""
    outputs = outputs if outputs is not None else ["Y", "Y_h", "Y_c"][:NOUT[op]]
    names = list(ins)
    while names and ins[names[-1]] is None:
        names.pop()
    node_inputs = [n if ins[n] is not None else "" for n in names]
    graph_inputs, inits = [], []
    for n in names:
        a = ins[n]
        if a is None:
            continue
        if n in const:
            inits.append(numpy_helper.from_array(a, n))
        else:
            graph_inputs.append(helper.make_tensor_value_info(
                n, helper.np_dtype_to_tensor_dtype(a.dtype), list(a.shape)))
    node = helper.make_node(op, node_inputs, outputs, **attrs)
    elem = helper.np_dtype_to_tensor_dtype(ins["X"].dtype)
    graph_outputs = [helper.make_tensor_value_info(o, elem, None) for o in outputs if o]
    g = helper.make_graph([node], f"{op}_test", graph_inputs, graph_outputs, inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 10
    return m


def feeds_of(model, ins):
    names = {i.name for i in model.graph.input}
    return {n: a for n, a in ins.items() if a is not None and n in names}


def layout0_reference(op, ins, attrs, outputs, opset, const):
    """ORT's CPU EP has no layout=1: run the layout-0 model on transposed inputs instead."""
    ins0 = dict(ins)
    for n in ("X", "initial_h", "initial_c"):
        if ins0.get(n) is not None:
            ins0[n] = np.ascontiguousarray(ins0[n].transpose(1, 0, 2))
    m0 = make_model(op, ins0, {**attrs, "layout": 0}, outputs, opset, const)
    ref = run_cpu(m0, feeds_of(m0, ins0))
    names = [o for o in (outputs or ["Y", "Y_h", "Y_c"][:NOUT[op]]) if o]
    return [np.ascontiguousarray(r.transpose(2, 0, 1, 3) if n == "Y" else r.transpose(1, 0, 2))
            for n, r in zip(names, ref)]


def check(op, ins, attrs, outputs=None, opset=21, const=("W", "R", "B"), expected=None):
    H = ins["R"].shape[-1]
    attrs = {"hidden_size": H, **attrs}
    m = make_model(op, ins, attrs, outputs, opset, const)
    if attrs.get("layout", 0) == 1 and expected is None:
        expected = layout0_reference(op, ins, attrs, outputs, opset, const)
    return check_model(m, feeds_of(m, ins), expected=expected)


DIRECTIONS = ["forward", "reverse", "bidirectional"]
LENS = [None, [5, 3, 1]]


# --------------------------------------------------------------------------------------------
# RNN

@pytest.mark.parametrize("direction", DIRECTIONS)
@pytest.mark.parametrize("lens", LENS)
@pytest.mark.parametrize("initial", [False, True])
@pytest.mark.parametrize("layout", [0, 1])
def test_rnn(direction, lens, initial, layout):
    ins = make_inputs("RNN", direction=direction, lens=lens, initial=initial, layout=layout)
    check("RNN", ins, {"direction": direction, "layout": layout})


def test_rnn_no_bias_opset7():
    ins = make_inputs("RNN", bias=False, initial=True)
    check("RNN", ins, {}, opset=7)


@pytest.mark.parametrize("acts,alpha,beta", [
    (["Relu"], [], []), (["Sigmoid"], [], []), (["LeakyRelu"], [0.3], []),
    (["ThresholdedRelu"], [0.1], []), (["ScaledTanh"], [1.5], [0.7]),
    (["HardSigmoid"], [0.3], [0.4]), (["Elu"], [0.8], []), (["Softsign"], [], []),
    (["Softplus"], [], []), (["Affine"], [0.9], [0.1]),
])
def test_rnn_activations(acts, alpha, beta):
    ins = make_inputs("RNN", initial=True)
    attrs = {"activations": acts}
    if alpha:
        attrs["activation_alpha"] = alpha
    if beta:
        attrs["activation_beta"] = beta
    check("RNN", ins, attrs)


def test_rnn_bidirectional_two_activations_and_clip():
    ins = make_inputs("RNN", direction="bidirectional", lens=[5, 2, 4])
    check("RNN", ins, {"direction": "bidirectional", "activations": ["LeakyRelu", "Elu"],
                       "activation_alpha": [0.2, 0.5], "clip": 0.4})


# --------------------------------------------------------------------------------------------
# GRU

@pytest.mark.parametrize("direction", DIRECTIONS)
@pytest.mark.parametrize("lens", LENS)
@pytest.mark.parametrize("lbr", [0, 1])
@pytest.mark.parametrize("layout", [0, 1])
def test_gru(direction, lens, lbr, layout):
    ins = make_inputs("GRU", direction=direction, lens=lens, initial=True, layout=layout)
    check("GRU", ins, {"direction": direction, "linear_before_reset": lbr, "layout": layout})


@pytest.mark.parametrize("lbr", [0, 1])
def test_gru_no_bias_no_initial(lbr):
    check("GRU", make_inputs("GRU", bias=False), {"linear_before_reset": lbr})


@pytest.mark.parametrize("acts,alpha,beta", [
    (["HardSigmoid", "Softsign"], [0.3], [0.45]),
    (["Sigmoid", "Relu"], [], []),
    (["hardsigmoid", "leakyrelu"], [], []),  # ORT's (agreed) defaults, names case-insensitive
    (["ScaledTanh", "Affine"], [0.9, 0.7], [0.8, 0.05]),
    (["Sigmoid", "Elu"], [0.6], []),
    (["Softplus", "ThresholdedRelu"], [0.05], []),
])
def test_gru_activations(acts, alpha, beta):
    ins = make_inputs("GRU", direction="bidirectional", initial=True, lens=[4, 5, 2])
    attrs = {"direction": "bidirectional", "activations": acts * 2}  # one list per direction
    if alpha:
        attrs["activation_alpha"] = alpha * 2
    if beta:
        attrs["activation_beta"] = beta * 2
    check("GRU", ins, attrs)


def test_gru_per_direction_activations_and_clip():
    ins = make_inputs("GRU", direction="bidirectional", initial=True)
    check("GRU", ins, {"direction": "bidirectional", "clip": 0.3, "linear_before_reset": 1,
                       "activations": ["Sigmoid", "Tanh", "HardSigmoid", "Relu"],
                       "activation_alpha": [0.25], "activation_beta": [0.55]})


def test_gru_zero_length_rows():
    ins = make_inputs("GRU", direction="bidirectional", initial=True, lens=[0, 5, 2])
    check("GRU", ins, {"direction": "bidirectional"})


# --------------------------------------------------------------------------------------------
# LSTM

@pytest.mark.parametrize("direction", DIRECTIONS)
@pytest.mark.parametrize("lens", LENS)
@pytest.mark.parametrize("peep", [False, True])
@pytest.mark.parametrize("layout", [0, 1])
def test_lstm(direction, lens, peep, layout):
    ins = make_inputs("LSTM", direction=direction, lens=lens, peep=peep, initial=True,
                      layout=layout)
    check("LSTM", ins, {"direction": direction, "layout": layout})


@pytest.mark.parametrize("peep", [False, True])
@pytest.mark.parametrize("direction", ["forward", "bidirectional"])
def test_lstm_input_forget(peep, direction):
    ins = make_inputs("LSTM", direction=direction, peep=peep, initial=True, lens=[3, 5, 4])
    check("LSTM", ins, {"direction": direction, "input_forget": 1})


def test_lstm_clip_and_activations():
    ins = make_inputs("LSTM", direction="bidirectional", peep=True, initial=True)
    check("LSTM", ins, {"direction": "bidirectional", "clip": 0.25,
                        "activations": ["HardSigmoid", "Tanh", "Softsign",
                                        "Sigmoid", "LeakyRelu", "ScaledTanh"],
                        "activation_alpha": [0.2, 0.1, 1.2], "activation_beta": [0.5, 0.9]})


def test_lstm_zero_length_rows():
    ins = make_inputs("LSTM", direction="bidirectional", initial=True, lens=[2, 0, 5])
    check("LSTM", ins, {"direction": "bidirectional"})


@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
@pytest.mark.parametrize("which", [0, 1, 2])
def test_optional_outputs_absent(op, which):
    if which == 2 and op != "LSTM":
        pytest.skip("only LSTM has Y_c")
    outs = ["Y", "Y_h", "Y_c"][:NOUT[op]]
    # keep only output `which`
    outs = [o if i == which else "" for i, o in enumerate(outs)]
    while not outs[-1]:
        outs.pop()
    ins = make_inputs(op, direction="bidirectional", initial=True, lens=[5, 4, 2])
    check(op, ins, {"direction": "bidirectional"}, outputs=outs)


@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
def test_runtime_weights(op):
    """W, R, B, initial states and P as graph inputs instead of initializers."""
    ins = make_inputs(op, direction="bidirectional", initial=True, lens=[1, 5, 3],
                      peep=(op == "LSTM"))
    check(op, ins, {"direction": "bidirectional"}, const=())


@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
@pytest.mark.parametrize("opset", [7, 14, 22])
def test_opsets(op, opset):
    ins = make_inputs(op, direction="reverse", initial=True, lens=[2, 5, 3])
    check(op, ins, {"direction": "reverse"}, opset=opset)


@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
def test_batch_one_long_sequence(op):
    ins = make_inputs(op, T=40, B=1, I=3, H=8, direction="bidirectional", initial=True)
    check(op, ins, {"direction": "bidirectional"})


# --------------------------------------------------------------------------------------------
# dtypes ORT's CPU EP lacks: the reference is its float32 result

@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
@pytest.mark.parametrize("dtype", [np.float16, np.float64])
def test_other_dtypes(op, dtype):
    ins = make_inputs(op, direction="bidirectional", initial=True, lens=[5, 2, 4],
                      peep=(op == "LSTM"), dtype=dtype)
    attrs = {"hidden_size": 6, "direction": "bidirectional"}
    ins32 = {k: (v.astype(np.float32) if v is not None and v.dtype == dtype else v)
             for k, v in ins.items()}
    m32 = make_model(op, ins32, attrs)
    ref = run_cpu(m32, feeds_of(m32, ins32))
    m = make_model(op, ins, attrs)
    outs, placed = run_mlx(m, feeds_of(m, ins))
    assert set(placed) == {om.EP_NAME}
    tol = 2e-3 if dtype == np.float16 else 1e-5
    for a, e in zip(outs, ref):
        assert a.dtype == dtype
        np.testing.assert_allclose(a.astype(np.float64), e, rtol=tol, atol=tol)


# --------------------------------------------------------------------------------------------
# declines

def test_declines_ambiguous_activation_defaults():
    # Affine without alpha/beta: ONNX says "the Affine operator's defaults", ORT uses 0.
    ins = make_inputs("GRU")
    m = make_model("GRU", ins, {"hidden_size": 6, "activations": ["Affine", "Tanh"]})
    placed = placement_of(m, feeds_of(m, ins))
    assert om.EP_NAME not in placed


# --------------------------------------------------------------------------------------------
# models

def test_two_layer_bidirectional_lstm():
    """LSTM(bidi) -> Transpose/Reshape -> LSTM(bidi), sequence_lens shared, all on MLX."""
    T, B, I, H = 7, 2, 5, 4
    l1 = make_inputs("LSTM", T=T, B=B, I=I, H=H, direction="bidirectional", initial=True)
    l2 = make_inputs("LSTM", T=T, B=B, I=2 * H, H=H, direction="bidirectional", peep=True)
    inits = [numpy_helper.from_array(l1[n], f"{n}1") for n in ("W", "R", "B")]
    inits += [numpy_helper.from_array(l2[n], f"{n}2") for n in ("W", "R", "B", "P")]
    inits.append(numpy_helper.from_array(np.array([T, B, 2 * H], np.int64), "shape"))
    nodes = [
        helper.make_node("LSTM", ["X", "W1", "R1", "B1", "lens", "h0", "c0"], ["Y1", "Yh1", "Yc1"],
                         direction="bidirectional", hidden_size=H),
        helper.make_node("Transpose", ["Y1"], ["Y1t"], perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["Y1t", "shape"], ["X2"]),
        helper.make_node("LSTM", ["X2", "W2", "R2", "B2", "lens", "", "", "P2"],
                         ["Y2", "Yh2", ""], direction="bidirectional", hidden_size=H),
    ]
    f = TensorProto.FLOAT
    g = helper.make_graph(nodes, "lstm2", [
        helper.make_tensor_value_info("X", f, [T, B, I]),
        helper.make_tensor_value_info("lens", TensorProto.INT32, [B]),
        helper.make_tensor_value_info("h0", f, [2, B, H]),
        helper.make_tensor_value_info("c0", f, [2, B, H])],
        [helper.make_tensor_value_info("Y2", f, None), helper.make_tensor_value_info("Yh2", f, None),
         helper.make_tensor_value_info("Yc1", f, None)], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 10
    feeds = {"X": l1["X"], "lens": np.array([T, 4], np.int32), "h0": l1["initial_h"],
             "c0": l1["initial_c"]}
    check_model(m, feeds)
    feeds["lens"] = np.array([3, T], np.int32)  # another lengths vector, same session shape
    check_model(m, feeds)


def test_gru_streaming_100_chunks():
    """A stateful GRU step: Y_h is fed back as initial_h for the next chunk, 100 times;
    every chunk's outputs match the CPU EP's, and the whole graph runs on MLX."""
    CH, B, I, H = 4, 1, 8, 16
    ins = make_inputs("GRU", T=CH, B=B, I=I, H=H, initial=True)
    f = TensorProto.FLOAT
    inits = [numpy_helper.from_array(ins[n], n) for n in ("W", "R", "B")]
    nodes = [helper.make_node("GRU", ["x", "W", "R", "B", "", "h_in"], ["y", "h_out"],
                              hidden_size=H, linear_before_reset=1),
             helper.make_node("Tanh", ["y"], ["feat"])]
    g = helper.make_graph(nodes, "gru_stream", [
        helper.make_tensor_value_info("x", f, [CH, B, I]),
        helper.make_tensor_value_info("h_in", f, [1, B, H])],
        [helper.make_tensor_value_info("feat", f, None),
         helper.make_tensor_value_info("h_out", f, None)], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 10
    data = m.SerializeToString()
    cpu = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so = om.record_assignment(om.session_options("cpu", fallback=False, so=so))
    mlx = ort.InferenceSession(data, sess_options=so)
    placed = om.placement(mlx)
    assert set(placed) == {om.EP_NAME} and len(placed[om.EP_NAME]) == 2
    h_cpu = h_mlx = np.zeros((1, B, H), np.float32)
    for step in range(100):
        x = rand(CH, B, I, scale=1.0)
        feat_c, h_cpu = cpu.run(None, {"x": x, "h_in": h_cpu})
        feat_m, h_mlx = mlx.run(None, {"x": x, "h_in": h_mlx})
        assert_close(feat_m, feat_c, name=f"chunk {step} output")
        assert_close(h_mlx, h_cpu, name=f"chunk {step} state")



@pytest.mark.parametrize("direction", ["forward", "reverse"])
def test_lstm_cpu_kernels(tmp_path, direction):
    """On the CPU a one-direction LSTM with default activations and constant weights runs its
    products through the packed kernel and each step's cell as the EP's kernel (LstmCell,
    counted by the report's process_lstm_cells: at least T steps a run); H = 20 leaves a tail past the
    8-lane vectors. Against ORT's CPU EP; with cpu_gemv=0 (no CPU kernels) the count stays put."""
    import json
    T, B, H = 4, 3, 20
    ins = make_inputs("LSTM", T=T, B=B, I=5, H=H, direction=direction, initial=True, lens=[4, 2, 3])
    attrs = {"hidden_size": H, "direction": direction}
    m = make_model("LSTM", ins, attrs)
    feeds = feeds_of(m, ins)
    ref = run_cpu(m, feeds)
    cells = {}
    for key, opts in (("on", {}), ("off", {"cpu_gemv": 0})):
        report = tmp_path / f"{key}.jsonl"
        s = om.InferenceSession(m.SerializeToString(), DEVICE, fallback=False, report_path=str(report), **opts)
        for _ in range(3):
            for got, want in zip(s.run(None, feeds), ref):
                assert_close(got, want)
        del s
        line = next(json.loads(ln) for ln in report.read_text().splitlines() if '"fused_node"' in ln)
        cells[key] = line["process_lstm_cells"]
    if DEVICE == "cpu":
        assert cells["on"] >= 3 * T, cells  # every step of every run (a first run may take two passes)
    assert cells["off"] == cells["on"], cells
