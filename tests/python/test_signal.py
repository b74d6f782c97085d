"""Window generators (Hann/Hamming/BlackmanWindow), MelWeightMatrix, DFT and STFT on the MLX EP
against ORT's CPU EP (the transforms also against ONNX's reference, see below). The generators'
scalar inputs fix the output shape: they are fed both as run-time graph inputs (host reads keyed
by value) and as constant initializers."""
import numpy as np
import pytest
from onnx import TensorProto

from oracle import DEVICE, check_node

WINDOWS = ["HannWindow", "HammingWindow", "BlackmanWindow"]


@pytest.mark.parametrize("op", WINDOWS)
@pytest.mark.parametrize("periodic", [0, 1])
@pytest.mark.parametrize("size", [1, 2, 7, 10, 64])
def test_window(op, periodic, size):
    if size == 1 and periodic == 0:
        pytest.skip("symmetric size 1 divides by zero (NaN in both); covered below")
    check_node(op, {"size": np.array(size, np.int64)}, {"periodic": periodic}, opset=17)


@pytest.mark.parametrize("op", WINDOWS)
def test_window_symmetric_size_one_is_nan(op):
    # ORT's kernel divides by size - 1 = 0: 0 * inf = NaN. Both must agree (equal_nan).
    check_node(op, {"size": np.array(1, np.int64)}, {"periodic": 0}, opset=17)


@pytest.mark.parametrize("op", WINDOWS)
@pytest.mark.parametrize("dt", [TensorProto.DOUBLE, TensorProto.FLOAT16, TensorProto.INT64,
                                TensorProto.UINT8])
def test_window_output_datatype(op, dt):
    check_node(op, {"size": np.array(16, np.int32)}, {"output_datatype": dt}, opset=17)


def test_window_constant_size_and_new_values():
    check_node("HannWindow", {}, initializers={"size": np.array(32, np.int64)}, opset=17)
    # The same session must follow a changed run-time size (the host read is part of the key).
    for n in (5, 9, 5):
        check_node("BlackmanWindow", {"size": np.array(n, np.int64)}, opset=17)


MEL_CASES = [
    # num_mel_bins, dft_length, sample_rate, lower, upper
    (8, 16, 8192, 0.0, 4096.0),
    (10, 64, 16000, 20.0, 7000.0),
    (40, 512, 16000, 0.0, 8000.0),
    (5, 33, 22050, 300.0, 9000.0),
    (64, 128, 16000, 0.0, 8000.0),  # more bins than points: zero-width triangles
]


@pytest.mark.parametrize("bins,dft,rate,lo,hi", MEL_CASES)
@pytest.mark.parametrize("dt", [TensorProto.FLOAT, TensorProto.DOUBLE])
def test_mel_weight_matrix(bins, dft, rate, lo, hi, dt):
    check_node("MelWeightMatrix", {"num_mel_bins": np.array(bins, np.int64),
                                   "dft_length": np.array(dft, np.int64),
                                   "sample_rate": np.array(rate, np.int64),
                                   "lower_edge_hertz": np.array(lo, np.float32),
                                   "upper_edge_hertz": np.array(hi, np.float32)},
               {"output_datatype": dt}, opset=17)


def test_mel_weight_matrix_int32_inputs():
    check_node("MelWeightMatrix", {"num_mel_bins": np.array(12, np.int32),
                                   "dft_length": np.array(40, np.int32),
                                   "sample_rate": np.array(8000, np.int32),
                                   "lower_edge_hertz": np.array(100, np.float32),
                                   "upper_edge_hertz": np.array(3500, np.float32)}, opset=17)



# ---- DFT / STFT --------------------------------------------------------------------------------
# Against ONNX's reference (numpy's double FFT): ORT's CPU kernel takes Bluestein's algorithm for
# lengths that are not powers of two and is itself ~1e-4 off near zero there (ONNX's node tests
# of DFT fail on it). Each case is also run against ORT's CPU EP where its error allows.

def _dft_model(x, attrs, opset, dft_length=None, axis=None):
    from oracle import make_node_model
    inputs = {"x": x}
    inits = {}
    order = ["x", "dft_length"]
    if dft_length is not None:
        inits["dft_length"] = np.array(dft_length, np.int64)
    else:
        inits["dft_length"] = None
    if opset >= 20:
        order.append("axis")
        inits["axis"] = None if axis is None else np.array(axis, np.int64)
    elif axis is not None:
        attrs = {**attrs, "axis": axis}
    model = make_node_model("DFT", inputs, 1, attrs, inits, opset, input_order=order)
    return model, attrs


def check_dft(x, attrs, opset, dft_length=None, axis=None, cpu_ep=True):
    from onnx.reference import ReferenceEvaluator
    from oracle import check_model, run_cpu, assert_close
    model, _ = _dft_model(x, attrs, opset, dft_length, axis)
    expected = ReferenceEvaluator(model).run(None, {"x": x})
    outs = check_model(model, {"x": x}, expected=expected)
    if cpu_ep:
        cpu = run_cpu(model, {"x": x})[0]
        np.testing.assert_allclose(outs[0], cpu, rtol=1e-3, atol=1e-3 * max(1, np.abs(cpu).max()))
    return outs


_rng = np.random.default_rng(17)


@pytest.mark.parametrize("opset", [17, 20])
@pytest.mark.parametrize("shape,axis", [((2, 16, 1), 1), ((1, 10, 10, 1), 1), ((1, 10, 6, 1), 2),
                                        ((3, 7, 2), 1), ((2, 5, 12, 2), 2), ((2, 5, 12, 2), -2)])
@pytest.mark.parametrize("onesided", [0, 1])
def test_dft_forward(opset, shape, axis, onesided):
    if onesided and shape[-1] == 2:
        pytest.skip("onesided needs a real signal")
    x = _rng.standard_normal(shape).astype(np.float32)
    check_dft(x, {"onesided": onesided}, opset, axis=axis)


@pytest.mark.parametrize("opset", [17, 20])
@pytest.mark.parametrize("shape", [(2, 12, 2), (1, 9, 3, 2), (2, 8, 1)])
def test_dft_inverse(opset, shape):
    x = _rng.standard_normal(shape).astype(np.float32)
    check_dft(x, {"inverse": 1}, opset, axis=1)


@pytest.mark.parametrize("opset", [17, 20])
@pytest.mark.parametrize("bins,n", [(6, None), (6, 10), (6, 11), (4, 12), (9, 8)])
def test_dft_inverse_onesided(opset, bins, n):
    # irfft: a one-sided spectrum to a real signal of n (default 2 (bins - 1)) samples
    x = _rng.standard_normal((2, bins, 3, 2)).astype(np.float32)
    check_dft(x, {"inverse": 1, "onesided": 1}, opset, dft_length=n, axis=1, cpu_ep=False)


@pytest.mark.parametrize("n", [5, 16, 24])
@pytest.mark.parametrize("complex_input", [False, True])
def test_dft_length_pads_and_truncates(n, complex_input):
    x = _rng.standard_normal((2, 16, 2 if complex_input else 1)).astype(np.float32)
    check_dft(x, {}, 20, dft_length=n, axis=-2)


def test_dft_float64_exact_zeros():
    # ONNX's test_dft signal: the spectrum of a real ramp is exactly zero at k = 0 and N/2
    x = np.arange(100, dtype=np.float64).reshape(1, 10, 10, 1)
    out = check_dft(x, {}, 20, axis=1)[0]
    if DEVICE != "gpu":  # on a GPU float64 is declined: the output is ORT's CPU EP's
        assert np.abs(out[0, 0, :, 1]).max() == 0 and np.abs(out[0, 5, :, 1]).max() < 1e-12
    x32 = x.astype(np.float32)
    out = check_dft(x32, {}, 20, axis=1, cpu_ep=False)[0]
    assert np.abs(out[0, 5, :, 1]).max() < 1e-7


@pytest.mark.parametrize("onesided,inverse,parts", [(0, 0, 2), (0, 0, 1), (1, 0, 1), (0, 1, 2),
                                                    (0, 1, 1), (1, 1, 2)])
def test_dft_long_goes_through_fft(onesided, inverse, parts):
    # past 1024 points: mx::fft in complex64 (float32 FFT rounding: a looser tolerance)
    from onnx.reference import ReferenceEvaluator
    from oracle import run_mlx
    import onnxruntime_mlx as om
    n = 2048
    bins = n // 2 + 1 if (onesided and inverse) else n
    x = _rng.standard_normal((2, bins, parts)).astype(np.float32)
    model, _ = _dft_model(x, {"onesided": onesided, "inverse": inverse}, 20, axis=1)
    expected = ReferenceEvaluator(model).run(None, {"x": x})[0]
    outs, placed = run_mlx(model, {"x": x})
    assert set(placed) == {om.EP_NAME}
    assert outs[0].shape == expected.shape and outs[0].dtype == np.float32
    scale = np.abs(expected).max()
    np.testing.assert_allclose(outs[0], expected, rtol=1e-4, atol=1e-5 * scale)


def test_dft_axis_input_changes_between_runs():
    # DFT-20's axis is a run-time input read on the host: a new value is a new program
    import onnx
    from onnx import helper
    from onnx.reference import ReferenceEvaluator
    from oracle import assert_close, run_mlx
    x = _rng.standard_normal((2, 6, 4, 1)).astype(np.float32)
    node = helper.make_node("DFT", ["x", "", "axis"], ["y"])
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape),
                                        helper.make_tensor_value_info("axis", TensorProto.INT64, [])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 20)])
    m.ir_version = 10
    for axis in (1, 2, 1):
        feeds = {"x": x, "axis": np.array(axis, np.int64)}
        expected = ReferenceEvaluator(m).run(None, feeds)[0]
        outs, placed = run_mlx(m, feeds)
        assert list(placed) == ["MLXExecutionProvider"]
        assert_close(outs[0], expected)


@pytest.mark.parametrize("shape,step,length,window", [
    ((1, 128, 1), 8, 16, False), ((1, 128, 1), 8, None, True), ((2, 100, 1), 10, 20, True),
    ((2, 64, 2), 16, 16, True), ((1, 50, 1), 7, 9, False)])
@pytest.mark.parametrize("onesided", [None, 0])
def test_stft(shape, step, length, window, onesided):
    from onnx.reference import ReferenceEvaluator
    from oracle import check_model, make_node_model
    if shape[-1] == 2 and onesided is None:
        pytest.skip("onesided (the default) needs a real signal")
    x = _rng.standard_normal(shape).astype(np.float32)
    W = length or 16
    inputs = {"signal": x}
    inits = {"frame_step": np.array(step, np.int64),
             "window": np.hanning(W).astype(np.float32) if window else None,
             "frame_length": None if length is None else np.array(length, np.int64)}
    attrs = {} if onesided is None else {"onesided": onesided}
    model = make_node_model("STFT", inputs, 1, attrs, inits, 17,
                            input_order=["signal", "frame_step", "window", "frame_length"])
    expected = ReferenceEvaluator(model).run(None, inputs)
    check_model(model, inputs, expected=expected)
    from oracle import run_cpu
    cpu = run_cpu(model, inputs)[0]
    np.testing.assert_allclose(expected[0], cpu, rtol=1e-3, atol=1e-3 * np.abs(cpu).max())
