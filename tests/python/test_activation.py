"""Activation functions vs ORT's CPU EP (where it has a kernel) and a float64 numpy reference."""
import math

import numpy as np
import onnxruntime as ort
import pytest

from onnx import TensorProto

import oracle
from oracle import make_node_model, placement_of, run_mlx
from test_reduce import BF16, check_f32_ref, check_model, check_node  # GPU-aware wrappers

rng = np.random.default_rng(1)
erf = np.vectorize(math.erf)


def softplus(x):
    return np.logaddexp(x, 0)


def elu(x, a):
    return np.where(x > 0, x, a * np.expm1(x))


# op -> (opset, attrs, numpy reference(x, attrs), input range)
ACTS = {
    "Relu": (14, {}, lambda x, a: np.maximum(x, 0), (-3, 3)),
    "LeakyRelu": (16, {"alpha": 0.2}, lambda x, a: np.where(x < 0, a["alpha"] * x, x), (-3, 3)),
    "Sigmoid": (13, {}, lambda x, a: 1 / (1 + np.exp(-x)), (-8, 8)),
    "HardSigmoid": (22, {"alpha": 0.3, "beta": 0.4},
                    lambda x, a: np.clip(a["alpha"] * x + a["beta"], 0, 1), (-4, 4)),
    "HardSwish": (22, {}, lambda x, a: x * np.clip(x / 6 + 0.5, 0, 1), (-5, 5)),
    "Tanh": (13, {}, lambda x, a: np.tanh(x), (-4, 4)),
    "Softplus": (22, {}, lambda x, a: softplus(x), (-30, 30)),
    "Softsign": (22, {}, lambda x, a: x / (1 + np.abs(x)), (-4, 4)),
    "Elu": (22, {"alpha": 0.7}, lambda x, a: elu(x, a["alpha"]), (-4, 4)),
    "Selu": (22, {"alpha": 1.5, "gamma": 1.1}, lambda x, a: a["gamma"] * elu(x, a["alpha"]), (-4, 4)),
    "Celu": (12, {"alpha": 0.8},
             lambda x, a: np.maximum(x, 0) + np.minimum(0, a["alpha"] * np.expm1(x / a["alpha"])),
             (-4, 4)),
    "ThresholdedRelu": (22, {"alpha": 0.5}, lambda x, a: np.where(x > a["alpha"], x, 0), (-3, 3)),
    "Mish": (22, {}, lambda x, a: x * np.tanh(softplus(x)), (-6, 6)),
    "Gelu": (20, {}, lambda x, a: 0.5 * x * (1 + erf(x / np.sqrt(2))), (-4, 4)),
    "Swish": (24, {"alpha": 1.3}, lambda x, a: x / (1 + np.exp(-a["alpha"] * x)), (-6, 6)),
}
# float dtypes ORT's CPU EP has a kernel for (others: numpy reference)
ORT_F64 = {"Relu", "Sigmoid", "Tanh", "Swish"}


def rand(shape, dtype, lo, hi):
    dtype = np.dtype(dtype)
    if dtype.kind in "iu":
        return rng.integers(int(lo), int(hi) + 1, size=shape).astype(dtype)
    return rng.uniform(lo, hi, size=shape).astype(dtype)


FLOAT_ONLY = {"Celu"}  # ONNX allows only float32


@pytest.mark.parametrize("op", list(ACTS))
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64])
def test_activation(op, dtype):
    opset, attrs, ref, (lo, hi) = ACTS[op]
    if op in FLOAT_ONLY and dtype != np.float32:
        pytest.skip("float32 only in ONNX")
    if op == "Gelu" and dtype == np.float64:
        pytest.skip("declined: see test_gelu_float64_erf_declined")
    x = rand((3, 4, 5), dtype, lo, hi)
    if dtype == np.float64 and op not in ORT_F64:
        # attributes are float32 in ONNX: the reference uses the same rounded values
        a32 = {k: float(np.float32(v)) for k, v in attrs.items()}
        expected = [ref(x, a32).astype(dtype)]
        check_node(op, {"x": x}, attrs, opset=opset, expected=expected)
    else:
        check_node(op, {"x": x}, attrs, opset=opset)


def test_gelu_float64_erf_declined():
    # MLX's float64 erf is float32-accurate: Gelu(approximate=none) on float64 stays on the CPU EP
    if oracle.DEVICE == "gpu":
        pytest.skip("float64 is declined on the GPU, and ORT's CPU EP has no float64 Erf")
    x = rand((3, 4), np.float64, -3, 3)
    placed = placement_of(make_node_model("Gelu", {"x": x}, 1, {}, None, 20), {"x": x})
    assert ("", "Gelu") not in placed.get("MLXExecutionProvider", []), placed


@pytest.mark.parametrize("op", [op for op in ACTS if op not in FLOAT_ONLY])
def test_activation_bfloat16(op):
    opset, attrs, _, (lo, hi) = ACTS[op]
    check_f32_ref(op, {"x": rand((3, 7), np.float32, lo, hi).astype(BF16)}, attrs, opset=opset)


@pytest.mark.parametrize("op", list(ACTS))
def test_activation_default_attrs_scalar_and_empty(op):
    opset, _, _, (lo, hi) = ACTS[op]
    check_node(op, {"x": rand((2, 6), np.float32, lo, hi)}, {}, opset=opset)
    check_node(op, {"x": np.array(0.75, np.float32)}, {}, opset=opset)
    check_node(op, {"x": np.zeros((0, 3), np.float32)}, {}, opset=opset)


@pytest.mark.parametrize("op,opset", [("Relu", 6), ("Sigmoid", 6), ("Tanh", 6), ("LeakyRelu", 6),
                                      ("Elu", 6), ("Selu", 6), ("HardSigmoid", 6), ("Softplus", 1),
                                      ("Softsign", 1), ("ThresholdedRelu", 10), ("HardSwish", 14),
                                      ("Mish", 18)])
def test_activation_older_opsets(op, opset):
    check_node(op, {"x": rand((3, 4), np.float32, -3, 3)}, {}, opset=opset)


def test_selu_opset1_defaults():
    # opset 1 had different (less precise) default alpha/gamma than opset 6
    x = rand((3, 4), np.float32, -3, 3)
    a, g = 1.673200011253357, 1.0506999492645264
    m = make_node_model("Selu", {"x": x}, 1, {}, None, 1, output_types=[TensorProto.FLOAT])
    check_model(m, {"x": x}, expected=[(g * elu(x.astype(np.float64), a)).astype(np.float32)])


@pytest.mark.parametrize("dtype", [np.int8, np.int16, np.int32, np.int64])
def test_relu_ints(dtype):
    x = rand((3, 5), dtype, -50, 50)
    if dtype in (np.int8, np.int32):  # ORT's CPU EP has these two
        check_node("Relu", {"x": x}, opset=14)
    else:
        check_node("Relu", {"x": x}, opset=14, expected=[np.maximum(x, 0)])


@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_gelu_approximate(approximate, dtype):
    check_node("Gelu", {"x": rand((4, 9), dtype, -5, 5)}, {"approximate": approximate}, opset=20)


def test_gelu_tanh_float64():
    x = rand((4, 9), np.float64, -5, 5)
    ref = 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))
    check_node("Gelu", {"x": x}, {"approximate": "tanh"}, opset=20, expected=[ref])


def test_softplus_sigmoid_extremes():
    x = np.array([-1000.0, -50.0, -1e-8, 0.0, 1e-8, 50.0, 1000.0], np.float32)
    for op in ("Softplus", "Sigmoid", "Mish", "Elu", "Selu"):
        check_node(op, {"x": x}, opset=22 if op != "Sigmoid" else 13)


# ---- PRelu ------------------------------------------------------------------------------------

@pytest.mark.parametrize("slope_shape", [(), (1,), (5,), (4, 1), (3, 4, 5), (1, 4, 1), (4, 5)])
@pytest.mark.parametrize("runtime_slope", [False, True])
def test_prelu_broadcast(slope_shape, runtime_slope):
    x = rand((3, 4, 5), np.float32, -3, 3)
    slope = rand(slope_shape, np.float32, 0.1, 0.9)
    if runtime_slope:
        check_node("PRelu", {"x": x, "slope": slope}, opset=16)
    else:
        check_node("PRelu", {"x": x}, initializers={"slope": slope}, opset=16)


@pytest.mark.parametrize("dtype", [np.float16, np.float64, np.int32, np.int64, np.uint32])
def test_prelu_dtypes(dtype):
    if dtype == np.uint32 and tuple(map(int, ort.__version__.split(".")[:2])) < (1, 31):
        pytest.skip("the oracle, ORT < 1.31's CPU EP, has no uint32 Where (PRelu's expansion)")
    x = rand((3, 4), dtype, 0 if np.dtype(dtype).kind == "u" else -5, 5)
    slope = rand((4,), dtype, 1, 3)
    check_node("PRelu", {"x": x, "slope": slope}, opset=16)


@pytest.mark.parametrize("opset", [7, 9])
def test_prelu_older_opsets(opset):
    x = rand((2, 3, 4), np.float32, -3, 3)
    check_node("PRelu", {"x": x}, initializers={"slope": rand((3, 1), np.float32, 0, 1)},
               opset=opset)


def test_prelu_bfloat16():
    x = rand((3, 4), np.float32, -3, 3).astype(BF16)
    check_f32_ref("PRelu", {"x": x, "s": rand((4,), np.float32, 0, 1).astype(BF16)}, {}, opset=16)


def test_prelu_slope_must_broadcast_to_x():
    # slope [2, 3, 4] does not broadcast unidirectionally to x [3, 4]: an error, not a bigger output
    x = rand((3, 4), np.float32, -3, 3)
    slope = rand((2, 3, 4), np.float32, 0, 1)
    m = make_node_model("PRelu", {"x": x, "slope": slope}, 1, {}, None, 16)
    with pytest.raises(Exception):
        run_mlx(m, {"x": x, "slope": slope})


# ---- Shrink -----------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64, np.int8, np.uint8,
                                   np.int16, np.uint16, np.int32, np.uint32, np.int64, np.uint64])
@pytest.mark.parametrize("attrs", [{}, {"bias": 1.5, "lambd": 1.5}, {"bias": 0.3, "lambd": 0.0}])
def test_shrink(dtype, attrs):
    lo = 0 if np.dtype(dtype).kind == "u" else -6
    x = rand((4, 6), dtype, lo, 6)
    if np.dtype(dtype).kind == "u" and attrs.get("bias", 0) > 0:
        x = x + np.array(2, dtype)  # keep x - bias non-negative (negative -> unsigned is UB)
    expected = None
    if dtype == np.float64:  # ORT adds the float bias in float32 precision; we keep float64
        b, l = np.float32(attrs.get("bias", 0.0)), np.float32(attrs.get("lambd", 0.5))
        expected = [np.where(x < -l, x + b, np.where(x > l, x - b, 0.0))]
    check_node("Shrink", {"x": x}, attrs, opset=9, expected=expected)


@pytest.mark.parametrize("op,kernel", [("Sigmoid", "SigmoidMap"), ("Tanh", "TanhMap"), ("Exp", "ExpMap"),
                                       ("Erf", "ErfMap"), ("Gelu", "ErfGelu")])
def test_transcendental_kernels_have_the_same_bits_on_16_lanes(op, kernel, capfd):
    """With AVX-512 (cpu_avx512=1) the transcendental kernels (kernels/cpu/unary.cc) run 16 lanes
    at a time with the 8-lane forms' operations in the same order: the same bits as with
    cpu_avx512=0, over values from e^-80 to e^80, +-0, +-inf and NaN, and a length whose tail
    fills part of a register. Broken by any operation of a 16-lane form that differs."""
    import re
    import onnxruntime_mlx as om
    from onnxruntime_mlx.doctor import cpu_flags
    if oracle.DEVICE != "cpu" or "avx512f" not in cpu_flags():
        pytest.skip("the CPU device's AVX-512 kernels")
    x = np.concatenate([np.linspace(-80, 80, 4093), [0.0, -0.0, np.inf, -np.inf, np.nan, 1e-8, 0.6251, -0.6249,
                                                     3.7]]).astype(np.float32).reshape(1, -1)
    if op == "Gelu":
        from onnx import helper, TensorProto
        g = helper.make_graph([helper.make_node("Gelu", ["x"], ["y"], domain="com.microsoft")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
        model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    else:
        model = make_node_model(op, {"x": x}, 1, {}, None, 13)
    got = {}
    for avx512 in (1, 0):
        sess = ort.InferenceSession(model.SerializeToString(), sess_options=om.session_options(
            "cpu", fallback=False, log_level=3, cpu_avx512=avx512))
        capfd.readouterr()
        (got[avx512],) = sess.run(None, {"x": x})
        evaluated = [line for line in capfd.readouterr().err.splitlines() if "evaluates:" in line]
        assert any(re.search(rf"\b{kernel}\b", line) for line in evaluated), evaluated
    assert np.array_equal(got[1], got[0], equal_nan=True), np.flatnonzero(got[1] != got[0])[:10]


@pytest.mark.parametrize("op,kernel", [("Sigmoid", "SigmoidMap"), ("Tanh", "TanhMap"), ("Exp", "ExpMap")])
@pytest.mark.parametrize("cpu_gemv", [1, 0])
def test_transcendentals_run_the_cpu_kernel(op, kernel, cpu_gemv, capfd):
    """float32 Sigmoid, Tanh and Exp run as the EP's vectorized kernel on the CPU device
    (kernels/cpu/unary.cc; MLX's evaluates them one lane at a time through libm), over values
    from e^-80 to e^80 and +-inf, equal to ORT's CPU EP (tests/cpp/cpu_kernels_test.cc
    holds them to libm in double precision); cpu_gemv=0 keeps MLX's ops.
    The GPU device never runs the kernel."""
    import re
    import onnxruntime_mlx as om
    # (MLX's own exp, cpu_gemv=0, flushes the denormals and overflows early: the C++ test takes the
    # kernel to the ends of the range)
    x = np.concatenate([np.linspace(-80, 80, 4093), [0.0, -0.0, np.inf, -np.inf, 1e-8, 0.6251]]).astype(np.float32)
    x = x.reshape(1, -1)
    model = make_node_model(op, {"x": x}, 1, {}, None, 13)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    sess = ort.InferenceSession(model.SerializeToString(),
                                sess_options=om.session_options(oracle.DEVICE, fallback=False, log_level=3, cpu_gemv=cpu_gemv))
    capfd.readouterr()
    (got,) = sess.run(None, {"x": x})
    evaluated = [line for line in capfd.readouterr().err.splitlines() if "evaluates:" in line]
    assert evaluated
    # ORT's logistic is a rational approximation off by up to ~1e-7 where the value is tiny
    # (MLX's exp is off by up to ~3e-6 for large arguments)
    np.testing.assert_allclose(got, want, rtol=2e-6 if cpu_gemv else 5e-6, atol=2e-7)
    ran = any(re.search(rf"\b{kernel}\b", line) for line in evaluated)
    assert ran == (oracle.DEVICE == "cpu" and cpu_gemv == 1), evaluated

