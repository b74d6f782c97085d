"""Regression tests for what tools/fuzz_ep.py found (docs/performance.md "Reliability gates"). Each compares with
ORT's CPU EP, or with numpy where ORT's own kernel is the one that crashes."""
import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

import onnxruntime_mlx as om
from onnxruntime_mlx import runner

rng = np.random.default_rng(3)


def model(node, inputs, inits=(), opset=17, n_out=1):
    g = helper.make_graph([node], "g", inputs,
                          [helper.make_tensor_value_info(o, TP.FLOAT, None) for o in node.output[:n_out]],
                          list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 9
    return m.SerializeToString()


def vi(name, shape, dtype=TP.FLOAT):
    return helper.make_tensor_value_info(name, dtype, shape)


def test_layer_normalization_without_bias_runs_on_mlx():
    # Fuzz crash: LayerNormalization(X, Scale, B="") with 3 outputs. The SIGSEGV was in ORT's CPU
    # kernel (so it is compared with numpy here); the MLX EP must claim and run it correctly.
    node = helper.make_node("LayerNormalization", ["x", "w", ""], ["y", "mean", "inv"], axis=1,
                            epsilon=0.1)
    x = rng.standard_normal((2, 3, 5)).astype(np.float32)
    w = rng.standard_normal((3, 5)).astype(np.float32)
    m = model(node, [vi("x", [2, 3, 5]), vi("w", [3, 5])], n_out=3)
    s = ort.InferenceSession(m, sess_options=om.session_options("cpu", fallback=False))
    for _ in range(2):  # eager probe, then compiled
        y, mean, inv = s.run(None, {"x": x, "w": w})
        mu = x.mean(axis=(1, 2), keepdims=True)
        iv = 1 / np.sqrt(((x - mu) ** 2).mean(axis=(1, 2), keepdims=True) + 0.1)
        np.testing.assert_allclose(y, (x - mu) * iv * w, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(mean, mu, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(inv, iv, rtol=1e-4)


def declined_to_cpu(m, feeds, tmp_path, why):
    """The node is declined at claim time with a reason containing `why`, and the session still
    runs it on ORT's CPU EP (fallback) with the CPU EP's own result."""
    ref = ort.InferenceSession(m, providers=["CPUExecutionProvider"]).run(None, feeds)
    report = tmp_path / "report.jsonl"
    so = om.record_assignment(om.session_options("cpu", fallback=True, report_path=str(report)))
    s = ort.InferenceSession(m, sess_options=so)
    got = s.run(None, feeds)
    placed = om.placement(s)
    assert om.EP_NAME not in placed and "CPUExecutionProvider" in placed, placed
    reasons = [r.get("reason", "") for r in runner.read_report(str(report))]
    assert any(why in r for r in reasons), reasons
    assert len(got) == len(ref)
    for a, e in zip(got, ref):
        if e is None:  # an output the CPU kernel leaves unset (BatchNorm not in training mode)
            assert a is None
            continue
        assert a.shape == e.shape and a.dtype == e.dtype
        np.testing.assert_array_equal(a, e)


# Fuzz mismatches: a 0/1 flag attribute set to another value. ORT's CPU kernels read keepdims /
# ceil_mode / noop_with_empty_axes / training_mode as `== 1`; the MLX EP read `!= 0` and gave
# other shapes. Such values are declined at claim time (the CPU EP runs the node).
@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMax", "ArgMax"])
def test_keepdims_other_than_0_or_1(op, tmp_path):
    x = rng.standard_normal((3, 4)).astype(np.float32)
    if op == "ArgMax":
        node = helper.make_node(op, ["x"], ["z"], axis=1, keepdims=-3)
        g = helper.make_graph([node], "g", [vi("x", [3, 4])], [vi("z", None, TP.INT64)])
        mp = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
        mp.ir_version = 9
        m = mp.SerializeToString()
    else:
        node = helper.make_node(op, ["x", "axes"], ["z"], keepdims=-3)
        axes = numpy_helper.from_array(np.array([1], np.int64), "axes")
        m = model(node, [vi("x", [3, 4])], [axes], opset=18)
    declined_to_cpu(m, {"x": x}, tmp_path, "keepdims must be 0 or 1")


@pytest.mark.parametrize("op", ["AveragePool", "MaxPool"])
def test_ceil_mode_other_than_0_or_1(op, tmp_path):
    x = rng.standard_normal((1, 1, 8, 8)).astype(np.float32)
    node = helper.make_node(op, ["x"], ["z"], kernel_shape=[3, 3], strides=[2, 2], ceil_mode=-3)
    declined_to_cpu(model(node, [vi("x", [1, 1, 8, 8])]), {"x": x}, tmp_path,
                    "ceil_mode must be 0 or 1")


def test_noop_with_empty_axes_other_than_0_or_1(tmp_path):
    x = rng.standard_normal((3, 2, 2)).astype(np.float32)
    node = helper.make_node("ReduceSum", ["x", "axes"], ["z"], keepdims=1, noop_with_empty_axes=2)
    axes = numpy_helper.from_array(np.zeros(0, np.int64), "axes")
    declined_to_cpu(model(node, [vi("x", [3, 2, 2])], [axes], opset=18), {"x": x}, tmp_path,
                    "noop_with_empty_axes must be 0 or 1")


def test_pool_window_larger_than_input(tmp_path):
    # ONNX's formula gives 0 outputs along the first spatial dim, ORT's kernel 1: declined.
    x = rng.standard_normal((1, 1, 5, 5)).astype(np.float32)
    node = helper.make_node("AveragePool", ["x"], ["z"], kernel_shape=[6, 2], strides=[2, 2])
    declined_to_cpu(model(node, [vi("x", [1, 1, 5, 5])]), {"x": x}, tmp_path,
                    "pooling window larger than its padded input")


def test_pool_window_fitting_only_with_its_pads_runs_on_mlx():
    # The same window fits once the declared pads are counted: claimed, and matches ORT.
    x = rng.standard_normal((1, 1, 5, 5)).astype(np.float32)
    node = helper.make_node("AveragePool", ["x"], ["z"], kernel_shape=[6, 2], strides=[2, 2],
                            pads=[1, 0, 0, 0])
    m = model(node, [vi("x", [1, 1, 5, 5])])
    ref = ort.InferenceSession(m, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    s = ort.InferenceSession(m, sess_options=om.session_options("cpu", fallback=False))
    for _ in range(2):
        got = s.run(None, {"x": x})
        assert got[0].shape == ref[0].shape
        np.testing.assert_allclose(got[0], ref[0], rtol=1e-5, atol=1e-6)


# Integer base: ORT computes std::pow in double and casts back (truncation toward zero), e.g.
# 3^-0.13 -> 0 and 7^0.5 -> 2 (the EP rounded before); int64 results need float64's precision.
@pytest.mark.parametrize("case", ["int32_float", "int64_double", "int64_int64"])
def test_pow_of_int_base_matches_ort(case):
    if case == "int32_float":
        x = np.array([0, 3, 3, 7, 10, 2], np.int32)
        y = np.array([0.5, -0.13, 0.64, 0.5, 2.9999, -1], np.float32)
        tx, ty = TP.INT32, TP.FLOAT
    elif case == "int64_double":
        x = np.array([3, 7, -2, 10**9, 5], np.int64)
        y = np.array([0.5, 0.5, -1.0, 2.0, 1.5], np.float64)
        tx, ty = TP.INT64, TP.DOUBLE
    else:
        x = np.array([3, 2, -2, 0, 3, 3], np.int64)
        y = np.array([4, -1, -1, 0, 39, 27], np.int64)
        tx, ty = TP.INT64, TP.INT64
    n = len(x)
    g = helper.make_graph([helper.make_node("Pow", ["x", "y"], ["z"])], "g",
                          [vi("x", [n], tx), vi("y", [n], ty)], [vi("z", [n], tx)])
    mp = helper.make_model(g, opset_imports=[helper.make_opsetid("", 15)])
    mp.ir_version = 9
    m = mp.SerializeToString()
    ref = ort.InferenceSession(m, providers=["CPUExecutionProvider"]).run(None, {"x": x, "y": y})
    s = ort.InferenceSession(m, sess_options=om.session_options("cpu", fallback=False))
    for _ in range(2):  # eager probe, then compiled
        got = s.run(None, {"x": x, "y": y})
        assert got[0].dtype == ref[0].dtype
        np.testing.assert_array_equal(got[0], ref[0])


# Fuzz crashes of ORT's CPU kernels (SIGSEGV / SIGFPE there, so no CPU reference): the same
# models on the MLX EP alone must give a result or a clean error.
def mlx_only(m, feeds):
    return ort.InferenceSession(m, sess_options=om.session_options("cpu", fallback=False)).run(None, feeds)


def test_conv_transpose_of_an_empty_input_on_mlx():
    node = helper.make_node("ConvTranspose", ["x", "w"], ["y"])
    x = np.zeros((1, 1, 3, 0, 5), np.float32)
    w = rng.standard_normal((1, 2, 3, 3, 3)).astype(np.float32)
    g = helper.make_graph([node], "g", [vi("x", [1, 1, 3, "d", 5]), vi("w", [1, 2, 3, 3, 3])],
                          [vi("y", None)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 9
    got = mlx_only(m.SerializeToString(), {"x": x, "w": w})[0]
    # ONNX's output size, stride 1 and no pads: in - 1 + kernel per spatial dim (onnx.reference
    # itself cannot reshape the empty tensor here).
    assert got.shape == (1, 2, 3 - 1 + 3, 0 - 1 + 3, 5 - 1 + 3)
    assert not got.any()  # a zero-sized input contributes nothing: all zeros (no bias)


def test_split_with_nonpositive_num_outputs_is_a_clean_error():
    node = helper.make_node("Split", ["x"], ["a", "b", "c"], num_outputs=-3)
    g = helper.make_graph([node], "g", [vi("x", ["n"])], [vi(o, None) for o in "abc"])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    m.ir_version = 9
    with pytest.raises(Exception) as e:
        mlx_only(m.SerializeToString(), {"x": np.zeros(0, np.float32)})
    assert "num_outputs" in str(e.value), e.value


def test_einsum_with_a_dropped_input_is_a_clean_error():
    node = helper.make_node("Einsum", ["x", ""], ["z"], equation="i,i")
    g = helper.make_graph([node], "g", [vi("x", [5], TP.DOUBLE)], [vi("z", None, TP.DOUBLE)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 9
    with pytest.raises(Exception) as e:
        mlx_only(m.SerializeToString(), {"x": np.ones(5)})
    assert "missing" in str(e.value), e.value


def test_batchnorm_training_mode_other_than_0_or_1(tmp_path):
    x = rng.standard_normal((2, 3, 4, 5)).astype(np.float32)
    p = {k: rng.random(3).astype(np.float32) + 0.5 for k in ("s", "b", "mean", "var")}
    node = helper.make_node("BatchNormalization", ["x", "s", "b", "mean", "var"],
                            ["y", "run_mean", "run_var"], training_mode=-3)
    inputs = [vi("x", [2, 3, 4, 5])] + [vi(k, [3]) for k in p]
    declined_to_cpu(model(node, inputs, opset=15, n_out=3), {"x": x, **p}, tmp_path,
                    "training_mode must be 0 or 1")


# Conv auto_pad SAME with a stride above the kernel (negative total padding). The fuzz case
# (SAME_LOWER, total -2): ORT splits it as (total + 1) / 2 = 0 at the begin, the EP gave -1 and
# shifted the windows; now it matches on MLX. A negative begin padding (SAME_UPPER, -2 / 2 = -1)
# is declined: ORT places those windows differently from the EP's crop.
def conv_model(auto_pad, strides, hw=5, k=3):
    node = helper.make_node("Conv", ["x", "w"], ["y"], auto_pad=auto_pad, kernel_shape=[k, k],
                            strides=strides)
    return model(node, [vi("x", [1, 1, hw, hw]), vi("w", [1, 1, k, k])])


@pytest.mark.parametrize("auto_pad,strides,hw", [("SAME_LOWER", [6, 2], 5), ("SAME_LOWER", [3, 2], 7),
                                                  ("SAME_UPPER", [3, 4], 7)])
def test_conv_same_padding_stride_above_kernel_on_mlx(auto_pad, strides, hw):
    x = rng.standard_normal((1, 1, hw, hw)).astype(np.float32)
    w = rng.standard_normal((1, 1, 3, 3)).astype(np.float32)
    m, feeds = conv_model(auto_pad, strides, hw), {"x": x, "w": w}
    ref = ort.InferenceSession(m, providers=["CPUExecutionProvider"]).run(None, feeds)
    s = ort.InferenceSession(m, sess_options=om.session_options("cpu", fallback=False))
    for _ in range(2):  # eager probe, then compiled
        got = s.run(None, feeds)
        assert got[0].shape == ref[0].shape
        np.testing.assert_allclose(got[0], ref[0], rtol=1e-4, atol=1e-5)


def test_conv_same_padding_negative_begin_pad_declined(tmp_path):
    x = rng.standard_normal((1, 1, 5, 5)).astype(np.float32)
    w = rng.standard_normal((1, 1, 3, 3)).astype(np.float32)
    declined_to_cpu(conv_model("SAME_UPPER", [6, 2]), {"x": x, "w": w}, tmp_path,
                    "negative begin padding")


def test_concat_input_empty_off_the_axis_still_fails():
    # Fuzz finding (after Concat learned to leave out inputs empty along its axis): [2,2,2] and
    # [2,2,0] along axis 0 do not fit (ORT's CPU kernel returns a [4,2,2] anyway). The second
    # input is empty in another dimension, so it must not be dropped to give [2,2,2]: the EP
    # reports the mismatch, naming the node.
    node = helper.make_node("Concat", ["a", "b"], ["y"], axis=0)
    m = model(node, [vi("a", [2, 2, 2]), vi("b", [None, 2, None])])
    s = ort.InferenceSession(m, sess_options=om.session_options("cpu", fallback=False))
    feeds = {"a": np.ones((2, 2, 2), np.float32), "b": np.ones((2, 2, 0), np.float32)}
    with pytest.raises(Exception, match="Concat"):
        s.run(None, feeds)
    # Empty along the axis is fine, and equals numpy's.
    feeds["b"] = np.ones((0, 2, 2), np.float32)
    np.testing.assert_array_equal(s.run(None, feeds)[0], feeds["a"])
