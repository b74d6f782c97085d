import ml_dtypes
import numpy as np
import onnxruntime as ort
import pytest

import onnxruntime_mlx as om
from oracle import check_node, make_node_model
from test_matmul import check_bf16

rng = np.random.default_rng(0)

BF16 = ml_dtypes.bfloat16
QTYPES = [np.uint8, np.int8, np.uint16, np.int16]


def expand(p, x_shape, axis, block):
    """Scale/zero point broadcast to x's shape (numpy reference of the three layouts)."""
    p = np.asarray(p)
    if p.size == 1:
        return p.reshape(())
    axis = axis % len(x_shape)
    if not block:
        shape = [1] * len(x_shape)
        shape[axis] = -1
        return p.reshape(shape)
    return np.take(np.repeat(p, block, axis=axis), np.arange(x_shape[axis]), axis=axis)


def quantize_ref(x, scale, zp, qtype, axis=1, block=0):
    s = expand(scale, x.shape, axis, block).astype(np.float32)
    z = 0 if zp is None else expand(zp, x.shape, axis, block).astype(np.float32)
    v = np.round(x.astype(np.float32) / s) + z
    info = np.iinfo(qtype)
    return np.clip(v, info.min, info.max).astype(qtype)


def dequantize_ref(x, scale, zp, out, axis=1, block=0):
    s = expand(scale, x.shape, axis, block).astype(np.float32)
    v = x.astype(np.int32)
    if zp is not None:
        v = v - expand(zp, x.shape, axis, block).astype(np.int32)
    return (v.astype(np.float32) * s).astype(out)


def qrand(shape, qtype):
    info = np.iinfo(qtype)
    return rng.integers(info.min, info.max, size=shape, endpoint=True).astype(qtype)


def scales(shape, dtype=np.float32):
    return rng.uniform(0.01, 0.5, size=shape).astype(dtype)


# ---- QuantizeLinear ---------------------------------------------------------------------------

@pytest.mark.parametrize("qtype", QTYPES)
@pytest.mark.parametrize("xtype", [np.float32, np.float16])
def test_quantize_per_tensor(qtype, xtype):
    info = np.iinfo(qtype)
    x = rng.uniform(-1.2, 1.2, size=(4, 5, 6)).astype(xtype) * min(info.max, 1000)
    s = np.array(0.37 if qtype in (np.uint8, np.int8) else 0.05, xtype)
    zp = np.array(-7 if info.min < 0 else 9, qtype)
    check_node("QuantizeLinear", {"x": x, "s": s, "zp": zp})


@pytest.mark.parametrize("opset", [10, 13, 19, 21, 23, 25])
def test_quantize_opsets(opset):
    x = rng.uniform(-50, 50, size=(3, 8)).astype(np.float32)
    check_node("QuantizeLinear", {"x": x, "s": np.array(0.3, np.float32), "zp": np.array(-3, np.int8)},
               opset=opset)
    check_node("QuantizeLinear", {"x": x, "s": np.array(0.3, np.float32)}, opset=opset)  # uint8


def test_quantize_ties_and_saturation():
    # Exact .5 ties round half to even; values beyond the range saturate; -0 and inf too.
    x = np.array([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 126.5, 127.5, 128.5, -127.5, -128.5, -129.5,
                  1e9, -1e9, np.inf, -np.inf, -0.0, 3.4999998], np.float32)
    for qtype, zp in [(np.int8, 0), (np.int8, -1), (np.uint8, 0), (np.uint8, 128), (np.int16, -5),
                      (np.uint16, 65535)]:
        z = np.array(zp, qtype)
        check_node("QuantizeLinear", {"x": x, "s": np.array(1.0, np.float32), "zp": z},
                   expected=[quantize_ref(x, 1.0, z, qtype)])
        check_node("QuantizeLinear", {"x": x, "s": np.array(1.0, np.float32), "zp": z})


@pytest.mark.parametrize("axis", [0, 1, 2, -1, -3])
@pytest.mark.parametrize("qtype", [np.uint8, np.int8])
def test_quantize_per_axis(axis, qtype):
    x = rng.uniform(-30, 30, size=(3, 4, 5)).astype(np.float32)
    d = x.shape[axis]
    check_node("QuantizeLinear", {"x": x, "s": scales(d), "zp": qrand((d,), qtype)}, {"axis": axis})


def test_quantize_per_axis_fp16():
    x = rng.uniform(-30, 30, size=(2, 6)).astype(np.float16)
    check_node("QuantizeLinear", {"x": x, "s": scales(6, np.float16), "zp": qrand((6,), np.int8)},
               {"axis": 1})


@pytest.mark.parametrize("axis,block", [(0, 2), (1, 3), (1, 5), (-1, 4), (2, 1), (1, 7)])
@pytest.mark.parametrize("with_zp", [True, False])
def test_quantize_blocked(axis, block, with_zp):
    x = rng.uniform(-30, 30, size=(4, 5, 6)).astype(np.float32)
    shape = list(x.shape)
    shape[axis] = -(-shape[axis] // block)
    inputs = {"x": x, "s": scales(shape)}
    if with_zp:
        inputs["zp"] = qrand(shape, np.int8)
    ref = quantize_ref(x, inputs["s"], inputs.get("zp"), np.int8 if with_zp else np.uint8, axis, block)
    check_node("QuantizeLinear", inputs, {"axis": axis, "block_size": block}, expected=[ref])
    check_node("QuantizeLinear", inputs, {"axis": axis, "block_size": block})


@pytest.mark.parametrize("out", [(3, np.int8), (2, np.uint8), (5, np.int16), (4, np.uint16)])
def test_quantize_output_dtype_attr(out):
    x = rng.uniform(-300, 300, size=(3, 8)).astype(np.float32)
    check_node("QuantizeLinear", {"x": x, "s": np.array(0.9, np.float32)}, {"output_dtype": out[0]})


def test_quantize_scalar_and_1d_inputs():
    # rank 0 and rank 1 x with a per-tensor scale: the default axis=1 is not used
    check_node("QuantizeLinear", {"x": np.array(3.3, np.float32), "s": np.array(0.5, np.float32),
                                  "zp": np.array(1, np.uint8)})
    check_node("QuantizeLinear", {"x": rng.uniform(-9, 9, 7).astype(np.float32),
                                  "s": np.array([0.5], np.float32), "zp": np.array([1], np.int8)})
    check_node("QuantizeLinear", {"x": np.zeros((0, 3), np.float32), "s": np.array(0.5, np.float32)})


def test_quantize_bf16():
    # ORT has no bf16 QuantizeLinear: numpy reference (division in float32, as for fp16).
    x = rng.uniform(-30, 30, size=(3, 8)).astype(BF16)
    s = np.array(0.3, BF16)
    zp = np.array(4, np.int8)
    check_bf16("QuantizeLinear", {"x": (x, True), "s": (s, True), "zp": (zp, False)}, {},
               quantize_ref(x, s, zp, np.int8))


def test_quantize_constant_params():
    x = rng.uniform(-30, 30, size=(3, 4)).astype(np.float32)
    check_node("QuantizeLinear", {"x": x}, {"axis": 1},
               initializers={"s": scales(4), "zp": qrand((4,), np.uint8)})


# ---- DequantizeLinear -------------------------------------------------------------------------

@pytest.mark.parametrize("qtype", QTYPES + [np.int32])
@pytest.mark.parametrize("with_zp", [True, False])
def test_dequantize_per_tensor(qtype, with_zp):
    x = qrand((3, 4, 5), qtype)
    inputs = {"x": x, "s": np.array(0.125, np.float32)}
    if with_zp and qtype is not np.int32:  # int32 has no zero point
        inputs["zp"] = np.array(np.iinfo(qtype).min // 3 + 1, qtype)
    check_node("DequantizeLinear", inputs)


@pytest.mark.parametrize("opset", [10, 13, 19, 21, 23, 25])
def test_dequantize_opsets(opset):
    x = qrand((3, 8), np.int8)
    check_node("DequantizeLinear", {"x": x, "s": np.array(0.3, np.float32), "zp": np.array(-3, np.int8)},
               opset=opset)


@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("qtype", [np.uint8, np.int8, np.int16])
def test_dequantize_per_axis(axis, qtype):
    x = qrand((3, 4, 5), qtype)
    d = x.shape[axis]
    check_node("DequantizeLinear", {"x": x, "s": scales(d), "zp": qrand((d,), qtype)}, {"axis": axis})


def test_dequantize_int32_large():
    # float32(x) rounds beyond 2^24, like ORT's static_cast<float>
    x = np.array([2**24 + 1, -(2**31), 2**31 - 1, 123456789], np.int32)
    check_node("DequantizeLinear", {"x": x, "s": np.array(0.5, np.float32)})


@pytest.mark.parametrize("axis,block", [(0, 2), (1, 3), (-1, 4), (2, 6)])
def test_dequantize_blocked(axis, block):
    x = qrand((4, 5, 6), np.uint8)
    shape = list(x.shape)
    shape[axis] = -(-shape[axis] // block)
    s, zp = scales(shape), qrand(shape, np.uint8)
    check_node("DequantizeLinear", {"x": x, "s": s, "zp": zp}, {"axis": axis, "block_size": block})
    check_node("DequantizeLinear", {"x": x, "s": s}, {"axis": axis, "block_size": block},
               expected=[dequantize_ref(x, s, None, np.float32, axis, block)])


def test_dequantize_fp16():
    if tuple(map(int, ort.__version__.split(".")[:2])) < (1, 31):
        pytest.skip("the oracle, ORT < 1.31's CPU EP, fails DequantizeLinear with fp16 scales")
    x = qrand((3, 4), np.int8)
    check_node("DequantizeLinear", {"x": x, "s": scales(4, np.float16), "zp": qrand((4,), np.int8)},
               {"axis": 1})
    # opset 23 output_dtype: float32 scale, float16 output
    check_node("DequantizeLinear", {"x": x, "s": np.array(0.2, np.float32)}, {"output_dtype": 10},
               opset=23)


def test_dequantize_bf16():
    x = qrand((3, 4), np.uint8)
    s = scales(4, BF16)
    zp = qrand((4,), np.uint8)
    check_bf16("DequantizeLinear", {"x": (x, False), "s": (s, True), "zp": (zp, False)}, {"axis": 1},
               dequantize_ref(x, s, zp, BF16, 1))


def test_dequantize_scalar_and_empty():
    check_node("DequantizeLinear", {"x": np.array(200, np.uint8), "s": np.array(0.5, np.float32),
                                    "zp": np.array(128, np.uint8)})
    check_node("DequantizeLinear", {"x": np.zeros((0, 3), np.int8), "s": np.array(0.5, np.float32)})


def test_qdq_roundtrip():
    # A QDQ pair in one MLX partition.
    import onnx
    from onnx import TensorProto, helper
    x = rng.uniform(-5, 5, size=(2, 16)).astype(np.float32)
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "zp"], ["q"], axis=1),
             helper.make_node("DequantizeLinear", ["q", "s", "zp"], ["y"], axis=1)]
    inits = [onnx.numpy_helper.from_array(scales(16), "s"),
             onnx.numpy_helper.from_array(qrand((16,), np.int8), "zp")]
    g = helper.make_graph(nodes, "qdq", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 16])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 16])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])
    m.ir_version = 10
    from oracle import check_model
    check_model(m, {"x": x})


# ---- DynamicQuantizeLinear --------------------------------------------------------------------

@pytest.mark.parametrize("lo,hi", [(-2.0, 3.0), (0.5, 4.0), (-4.0, -0.5), (-1e-3, 1e-3), (-100, 1)])
def test_dynamic_quantize(lo, hi):
    x = rng.uniform(lo, hi, size=(3, 4, 5)).astype(np.float32)
    check_node("DynamicQuantizeLinear", {"x": x}, outputs=3)


def test_dynamic_quantize_edges():
    check_node("DynamicQuantizeLinear", {"x": np.zeros((2, 3), np.float32)}, outputs=3)  # scale 1
    check_node("DynamicQuantizeLinear", {"x": np.array([0.0, 2.55, -2.55], np.float32)}, outputs=3)
    check_node("DynamicQuantizeLinear", {"x": np.array(1.5, np.float32)}, outputs=3)
    check_node("DynamicQuantizeLinear", {"x": np.zeros((0, 3), np.float32)}, outputs=3)


# ---- declines ---------------------------------------------------------------------------------

def test_declines():
    # (4-bit, 2-bit and float8 QDQ pairs are claimed: test_lowp.py)
    x = rng.uniform(-5, 5, size=(2, 4)).astype(np.float32)
    # x and scale of different types (opset 23+): the division precision is ambiguous
    # (ORT's CPU kernel cannot run it either, so look at the placement without running)
    import onnxruntime as ort
    m = make_node_model("QuantizeLinear", {"x": x, "s": np.array(0.5, np.float16)}, opset=23)
    so = om.record_assignment(om.session_options("cpu", fallback=True))
    sess = ort.InferenceSession(m.SerializeToString(), sess_options=so)
    assert om.EP_NAME not in om.placement(sess)
