import numpy as np
import pytest

import onnx
from onnx import TensorProto, helper

from oracle import check_model, check_node, make_node_model, run_cpu, run_mlx

rng = np.random.default_rng(0)

FLOATS = [np.float32, np.float16, np.float64]
BROADCAST = [((2, 3, 4), (2, 3, 4)), ((2, 3, 4), (4,)), ((2, 1, 4), (3, 1)), ((1,), (5, 2)),
             ((), (2, 3)), ((3, 1, 5), (1, 4, 1))]


def rand(shape, dtype, lo=-2.0, hi=2.0):
    if np.issubdtype(dtype, np.integer):
        return rng.integers(int(lo), int(hi) + 1, size=shape).astype(dtype)
    return rng.uniform(lo, hi, size=shape).astype(dtype)


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div", "Max", "Min"])
@pytest.mark.parametrize("shapes", BROADCAST)
@pytest.mark.parametrize("dtype", FLOATS)
def test_binary_float_broadcast(op, shapes, dtype):
    a = rand(shapes[0], dtype)
    b = rand(shapes[1], dtype, 0.5, 2.0)
    check_node(op, {"a": a, "b": b})


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div", "Mod"])
@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_binary_int(op, dtype):
    a = rand((4, 5), dtype, -20, 20)
    b = rand((5,), dtype, 1, 7) * np.where(rng.random(5) < 0.5, -1, 1).astype(dtype)
    check_node(op, {"a": a, "b": b})


@pytest.mark.parametrize("dtype", [np.float32, np.int32])
def test_mod_fmod(dtype):
    a = rand((4, 5), dtype, -20, 20)
    b = rand((5,), dtype, 1, 7) * np.where(rng.random(5) < 0.5, -1, 1).astype(dtype)
    check_node("Mod", {"a": a, "b": b}, {"fmod": 1})


@pytest.mark.parametrize("op", ["Neg", "Abs", "Sqrt", "Exp", "Log", "Reciprocal", "Floor", "Ceil",
                                "Round", "Sign", "Erf", "Sin", "Cos", "Tan", "Asin", "Acos", "Atan",
                                "Sinh", "Cosh", "Asinh", "Atanh", "IsNaN", "IsInf"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_unary_float(op, dtype):
    lo, hi = (0.1, 3.0) if op in ("Sqrt", "Log") else (-0.9, 0.9)
    x = rand((3, 4), dtype, lo, hi)
    if op in ("IsNaN", "IsInf"):
        x[0, 0], x[1, 1], x[2, 2] = np.nan, np.inf, -np.inf
    check_node(op, {"x": x})


def test_erf_large_and_special_values():
    # Big enough for the CPU kernel (kernels/cpu/unary.cc) to split over threads, an odd length (its
    # scalar tail), and +-0, +-inf, NaN and huge values.
    x = rand((301, 257), np.float32, -6, 6)
    x.flat[:7] = [0.0, -0.0, np.inf, -np.inf, np.nan, 1e30, -1e30]
    check_node("Erf", {"x": x})


def test_gelu_as_bert_exporters_write_it():
    # x * 0.5 * (1 + Erf(x / sqrt 2)) after a bias Add (the MiniLM encoder's feed-forward).
    n = [helper.make_node("Add", ["x", "bias"], ["h"]),
         helper.make_node("Div", ["h", "sqrt2"], ["d"]),
         helper.make_node("Erf", ["d"], ["e"]),
         helper.make_node("Add", ["e", "one"], ["e1"]),
         helper.make_node("Mul", ["h", "e1"], ["m"]),
         helper.make_node("Mul", ["m", "half"], ["y"])]
    init = [onnx.numpy_helper.from_array(rand((1536,), np.float32, -1, 1), "bias"),
            onnx.numpy_helper.from_array(np.array(np.sqrt(2), np.float32), "sqrt2"),
            onnx.numpy_helper.from_array(np.array(1, np.float32), "one"),
            onnx.numpy_helper.from_array(np.array(0.5, np.float32), "half")]
    g = helper.make_graph(n, "gelu", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 33, 1536])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 33, 1536])], init)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    check_model(model, {"x": rand((2, 33, 1536), np.float32, -5, 5)})


def test_acosh():
    check_node("Acosh", {"x": rand((3, 4), np.float32, 1.1, 4.0)})


@pytest.mark.parametrize("op", ["Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual"])
@pytest.mark.parametrize("dtype", [np.float32, np.int64])
def test_compare(op, dtype):
    a = rand((3, 4), dtype, -3, 3)
    b = rand((4,), dtype, -3, 3)
    check_node(op, {"a": a, "b": b})


@pytest.mark.parametrize("op", ["And", "Or", "Xor"])
def test_logic(op):
    check_node(op, {"a": rng.random((3, 4)) > 0.5, "b": rng.random((4,)) > 0.5})


def test_not_and_where():
    check_node("Not", {"a": rng.random((3, 4)) > 0.5})
    check_node("Where", {"c": rng.random((3, 1)) > 0.5, "x": rand((1, 4), np.float32),
                         "y": rand((3, 4), np.float32)})


def test_pow():
    check_node("Pow", {"a": rand((3, 4), np.float32, 0.5, 2), "b": rand((4,), np.float32)})


@pytest.mark.parametrize("base_shape,exp_shape", [((4, 5), ()), ((4, 5), (1,)), ((5,), (1, 1)), ((), (1,))])
def test_pow_constant_two_is_a_product(base_shape, exp_shape):
    """A constant exponent 2 gives x * x where ORT's CPU kernel computes that (a base of more
    than one element), bit for bit, also for values where libm's powf rounds the other way
    (98.9713 and 72.609375 among them); an exponent of a higher rank than the base broadcasts as
    ONNX broadcasts it; a one-element base stays powf, as in ORT."""
    hard = np.array([98.9713, 72.609375, -60.581284, 118.279015, 27.112843], np.float32)
    a = np.resize(np.concatenate([hard, rand((15,), np.float32, -100, 100)]), base_shape).astype(np.float32)
    m = make_node_model("Pow", {"a": a}, 1, None, {"b": np.full(exp_shape, 2.0, np.float32)}, 17, "")
    got = run_mlx(m, {"a": a})[0][0]
    want = run_cpu(m, {"a": a})[0]
    assert got.shape == want.shape == np.broadcast_shapes(base_shape, exp_shape)
    np.testing.assert_array_equal(got, want)
    if a.size > 1:
        np.testing.assert_array_equal(want, (a * a).reshape(want.shape))


def test_clip_inputs_and_missing_bound():
    x = rand((3, 4), np.float32, -3, 3)
    check_node("Clip", {"x": x}, initializers={"lo": np.array(-1, np.float32)})
    check_node("Clip", {"x": x, "lo": None}, initializers={"hi": np.array(0.5, np.float32)},
               input_order=["x", "lo", "hi"])


def test_clip_attributes_opset6():
    check_node("Clip", {"x": rand((3, 4), np.float32, -3, 3)}, {"min": -0.5, "max": 0.5}, opset=6)


def test_variadic_sum_mean():
    xs = {f"x{i}": rand(s, np.float32) for i, s in enumerate([(2, 3), (3,), (1, 3)])}
    check_node("Sum", xs)
    check_node("Mean", xs)


def test_scalar_and_empty():
    check_node("Add", {"a": np.array(1.5, np.float32), "b": np.array(2.0, np.float32)})
    check_node("Mul", {"a": np.zeros((0, 3), np.float32), "b": rand((3,), np.float32)})


@pytest.mark.parametrize("op", ["BitwiseAnd", "BitwiseOr", "BitwiseXor"])
@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint8, np.int8])
def test_bitwise_binary(op, dtype):
    info = np.iinfo(dtype)
    a = rng.integers(info.min, info.max, size=(2, 3, 4), endpoint=True).astype(dtype)
    b = rng.integers(info.min, info.max, size=(3, 1), endpoint=True).astype(dtype)
    check_node(op, {"a": a, "b": b}, opset=18)


@pytest.mark.parametrize("dtype", [np.int32, np.uint16, np.int8])
def test_bitwise_not(dtype):
    info = np.iinfo(dtype)
    a = rng.integers(info.min, info.max, size=(3, 5), endpoint=True).astype(dtype)
    check_node("BitwiseNot", {"a": a}, opset=18)


@pytest.mark.parametrize("direction", ["LEFT", "RIGHT"])
@pytest.mark.parametrize("dtype", [np.uint8, np.uint32])  # ORT CPU: uint8, uint32, uint64
def test_bitshift(direction, dtype):
    bits = np.iinfo(dtype).bits
    a = rng.integers(0, np.iinfo(dtype).max, size=(2, 6), endpoint=True).astype(dtype)
    b = rng.integers(0, bits - 1, size=(6,), endpoint=True).astype(dtype)
    check_node("BitShift", {"a": a, "b": b}, {"direction": direction}, opset=11)
