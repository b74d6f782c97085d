"""Window generators (Hann/Hamming/BlackmanWindow) and MelWeightMatrix on the MLX EP against
ORT's CPU EP. Their scalar inputs fix the output shape: they are fed both as run-time graph
inputs (host reads keyed by value) and as constant initializers."""
import numpy as np
import pytest
from onnx import TensorProto

from oracle import check_node

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

