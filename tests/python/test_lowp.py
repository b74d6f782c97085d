"""float8 / float4e2m1 / int4 / uint4 / int2 / uint2 on the MLX EP (Cast, CastLike,
QuantizeLinear, DequantizeLinear, BitCast, and the layout ops) against ORT's CPU EP.

ORT's Python layer has no numpy dtypes for these types, so tensors go in and out as OrtValues
filled with raw bytes (4-bit values packed two per byte, element 2k in the low nibble; 2-bit
values four per byte, lowest bits first) and are compared through ml_dtypes. Every MLX session runs with CPU fallback disabled and its placement
must show every node on MLXExecutionProvider.

Where ORT's CPU EP has no kernel (float4e2m1) or is known to differ from ONNX's reference
(see the notes at each test), the expected values come from ml_dtypes, which ONNX's reference
implementation uses for these conversions.
"""
from __future__ import annotations

import ctypes

import ml_dtypes
import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto as TP
from onnx import helper

import onnxruntime_mlx as om
from oracle import DEVICE, assert_close

ML = {
    TP.FLOAT8E4M3FN: ml_dtypes.float8_e4m3fn,
    TP.FLOAT8E4M3FNUZ: ml_dtypes.float8_e4m3fnuz,
    TP.FLOAT8E5M2: ml_dtypes.float8_e5m2,
    TP.FLOAT8E5M2FNUZ: ml_dtypes.float8_e5m2fnuz,
    TP.FLOAT4E2M1: ml_dtypes.float4_e2m1fn,
    TP.INT4: ml_dtypes.int4,
    TP.UINT4: ml_dtypes.uint4,
    TP.INT2: ml_dtypes.int2,
    TP.UINT2: ml_dtypes.uint2,
    TP.FLOAT8E8M0: ml_dtypes.float8_e8m0fnu,
}
E8M0 = ml_dtypes.float8_e8m0fnu
F8 = [TP.FLOAT8E4M3FN, TP.FLOAT8E4M3FNUZ, TP.FLOAT8E5M2, TP.FLOAT8E5M2FNUZ]
BITS = {TP.INT4: 4, TP.UINT4: 4, TP.FLOAT4E2M1: 4, TP.INT2: 2, TP.UINT2: 2}  # sub-byte types
SUB_BYTE = set(BITS)
NP = {TP.FLOAT: np.float32, TP.UINT16: np.uint16, TP.INT16: np.int16, TP.FLOAT16: np.float16, TP.DOUBLE: np.float64, TP.INT8: np.int8,
      TP.UINT8: np.uint8, TP.INT32: np.int32, TP.INT64: np.int64, TP.BOOL: np.bool_}

rng = np.random.default_rng(7)


# ---- raw OrtValue plumbing --------------------------------------------------------------------

def elem_of(arr: np.ndarray) -> int:
    for k, v in ML.items():
        if arr.dtype == v:
            return k
    return helper.np_dtype_to_tensor_dtype(arr.dtype)


def codes_of(arr: np.ndarray) -> np.ndarray:
    """Sub-byte values (ml_dtypes int4/uint4/float4/int2/uint2) -> their bit fields as uint8."""
    mask = (1 << BITS[elem_of(arr)]) - 1
    if arr.dtype == ML[TP.FLOAT4E2M1]:
        return arr.view(np.uint8) & mask
    return arr.astype(np.int8).view(np.uint8) & mask


def pack_codes(codes: np.ndarray, bits: int = 4) -> bytes:
    """ORT/ONNX layout: 8 / bits fields per byte, the first in the lowest bits."""
    per = 8 // bits
    flat = codes.astype(np.uint8).ravel()
    flat = np.append(flat, np.zeros(-flat.size % per, np.uint8)).reshape(-1, per)
    return sum(flat[:, j].astype(np.uint8) << (j * bits) for j in range(per)).astype(np.uint8).tobytes()


def pack(arr: np.ndarray) -> bytes:
    return pack_codes(codes_of(arr), BITS[elem_of(arr)])


def unpack(raw: bytes, elem: int, shape) -> np.ndarray:
    bits = BITS[elem]
    b = np.frombuffer(raw, np.uint8)
    n = int(np.prod(shape))
    codes = np.stack([(b >> (j * bits)) & ((1 << bits) - 1) for j in range(8 // bits)],
                     axis=-1).ravel()[:n]
    if elem == TP.FLOAT4E2M1:
        return codes.astype(np.uint8).view(ML[elem]).reshape(shape)
    vals = codes.astype(np.int16)
    if elem in (TP.INT4, TP.INT2):
        half = 1 << (bits - 1)
        vals = np.where(vals >= half, vals - 2 * half, vals)
    return vals.astype(ML[elem]).reshape(shape)


def to_ortvalue(arr: np.ndarray) -> ort.OrtValue:
    elem = elem_of(arr)
    if elem not in ML:
        return ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(arr))
    raw = pack(arr) if elem in SUB_BYTE else np.ascontiguousarray(arr).tobytes()
    ov = ort.OrtValue.ortvalue_from_shape_and_type(list(arr.shape), elem)
    assert ov.tensor_size_in_bytes() == len(raw)
    if raw:
        ctypes.memmove(ov.data_ptr(), raw, len(raw))
    return ov


def from_ortvalue(ov: ort.OrtValue) -> np.ndarray:
    name = ov.data_type()[len("tensor("):-1].upper()
    elem = TP.DataType.Value({"FLOAT": "FLOAT", "DOUBLE": "DOUBLE"}.get(name, name))
    if elem not in ML:
        return ov.numpy()
    shape = ov.shape()
    n = ov.tensor_size_in_bytes()
    raw = ctypes.string_at(ov.data_ptr(), n) if n else b""
    if elem in SUB_BYTE:
        return unpack(raw, elem, shape)
    return np.frombuffer(raw, np.uint8).view(ML[elem]).reshape(shape).copy()


# ---- models and sessions ------------------------------------------------------------------------

def model_of(nodes, inputs: dict, outputs: dict, initializers: dict | None = None, opset=23):
    """inputs/outputs: name -> ONNX element type; initializers: name -> numpy array."""
    inits = []
    for name, arr in (initializers or {}).items():
        elem = elem_of(arr)
        if elem in ML:
            raw = pack(arr) if elem in SUB_BYTE else arr.tobytes()
            inits.append(helper.make_tensor(name, elem, list(arr.shape), raw, raw=True))
        else:
            inits.append(helper.make_tensor(name, elem, list(arr.shape), arr.tobytes(), raw=True))
    g = helper.make_graph(
        nodes, "lowp",
        [helper.make_tensor_value_info(n, t, None) for n, t in inputs.items()],
        [helper.make_tensor_value_info(n, t, None) for n, t in outputs.items()], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 11 if opset >= 25 else 10
    return m.SerializeToString()


def run_cpu(model: bytes, feeds: dict) -> list:
    s = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    return [from_ortvalue(o) for o in
            s.run_with_ort_values(None, {k: to_ortvalue(v) for k, v in feeds.items()})]


def run_mlx(model: bytes, feeds: dict, runs: int = 3) -> list:
    """Every node must run on MLX (fallback disabled, placement checked); the eager first run
    and the compiled later runs must agree bit for bit."""
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so = om.record_assignment(om.session_options(DEVICE, fallback=False, so=so))
    s = ort.InferenceSession(model, sess_options=so)
    placed = om.placement(s)
    assert set(placed) == {om.EP_NAME}, f"nodes not on MLX: {placed}"
    first = None
    for _ in range(runs):
        outs = [from_ortvalue(o) for o in
                s.run_with_ort_values(None, {k: to_ortvalue(v) for k, v in feeds.items()})]
        if first is None:
            first = outs
        for a, b in zip(first, outs):
            assert a.tobytes() == b.tobytes(), "eager and compiled runs differ"
    return outs


def same(actual: np.ndarray, expected: np.ndarray, name="output"):
    """Exact equality; float8/float4 compared by value (NaN == NaN, whatever its encoding,
    -0 == 0 only where the format has a single zero)."""
    assert actual.shape == expected.shape, f"{name}: shape {actual.shape} vs {expected.shape}"
    assert actual.dtype == expected.dtype, f"{name}: dtype {actual.dtype} vs {expected.dtype}"
    if actual.dtype in (ML[t] for t in F8 + [TP.FLOAT4E2M1]):
        a, e = actual.astype(np.float64), expected.astype(np.float64)
        ok = (a == e) | (np.isnan(a) & np.isnan(e))
        bad = np.argwhere(~ok.reshape(-1))
        assert not bad.size, (f"{name}: {bad.size} differ, first at {int(bad[0][0])}: "
                              f"{a.reshape(-1)[bad[0][0]]} vs {e.reshape(-1)[bad[0][0]]}")
        assert np.array_equal(np.signbit(a[ok & ~np.isnan(a)]), np.signbit(e[ok & ~np.isnan(e)]))
    elif actual.dtype == E8M0:  # one encoding per value (NaN is 0xFF only): compare codes
        np.testing.assert_array_equal(actual.view(np.uint8), expected.view(np.uint8), err_msg=name)
    elif actual.dtype.kind == "f":
        assert_close(actual, expected, name)
    else:
        np.testing.assert_array_equal(actual, expected, err_msg=name)


def check(model: bytes, feeds: dict, expected: list | None = None):
    ref = expected if expected is not None else run_cpu(model, feeds)
    outs = run_mlx(model, feeds)
    assert len(outs) == len(ref)
    for i, (a, e) in enumerate(zip(outs, ref)):
        same(a, e, f"output {i}")
    return outs


def cast_model(src: int, dst: int, saturate: int | None = None, opset=23):
    attrs = {"to": dst} if saturate is None else {"to": dst, "saturate": saturate}
    return model_of([helper.make_node("Cast", ["x"], ["y"], **attrs)], {"x": src}, {"y": dst},
                    opset=opset)


def float_probe(n=600) -> np.ndarray:
    """Values across every float8 range: random magnitudes from 2^-20 to 2^17, float8
    subnormals and midpoints, signed zeros, Inf, NaN, huge values."""
    mags = np.exp2(rng.uniform(-20, 17, size=n)) * rng.choice([-1, 1], size=n)
    special = [0.0, -0.0, np.inf, -np.inf, np.nan, 1e30, -1e30, 2.0 ** -9, 2.0 ** -10, 2.0 ** -17,
               1.0625, 1.1875, 0.5 + 2.0 ** -5, 240.0, 248.0, 448.0, 464.0, 57344.0, 61440.0]
    return np.concatenate([mags, special]).astype(np.float32)


def all_codes(elem: int) -> np.ndarray:
    return np.arange(256, dtype=np.uint8).view(ML[elem]).reshape(16, 16)


# ---- Cast to and from float8 -----------------------------------------------------------------

@pytest.mark.parametrize("saturate", [1, 0])
@pytest.mark.parametrize("dst", F8)
@pytest.mark.parametrize("src", [TP.FLOAT, TP.FLOAT16])
def test_cast_to_float8(src, dst, saturate):
    with np.errstate(over="ignore"):  # float16: the largest probes become Inf
        x = float_probe().astype(NP[src])
    if not saturate and dst in ORT_DIFFERS:
        lo, hi = ORT_DIFFERS[dst]
        x = x[~((np.abs(x.astype(np.float32)) >= lo) & (np.abs(x.astype(np.float32)) < hi))]
    check(cast_model(src, dst, saturate), {"x": x})


# Without saturation, ORT's CPU kernels part from ONNX's Cast table just past the largest finite
# value: e4m3fn maps [480, 512) to 448 or NaN depending on one mantissa bit, and e5m2 maps
# values that round up past 57344 ([61440, 65536)) to NaN. ONNX says: round to nearest even, and
# a result past the largest finite value is NaN (e4m3fn) or Inf (e5m2), as ml_dtypes (which
# ONNX's reference uses) does. Those ranges are checked against ml_dtypes instead.
ORT_DIFFERS = {TP.FLOAT8E4M3FN: (480, 512), TP.FLOAT8E5M2: (61440, 65536)}


@pytest.mark.parametrize("dst", sorted(ORT_DIFFERS))
def test_cast_no_saturate_follows_onnx(dst):
    lo, hi = ORT_DIFFERS[dst]
    x = np.array([lo - 1, lo, (lo + hi) / 2, hi - 1, hi, 1e9], np.float32)
    x = np.concatenate([x, -x])
    want = x.astype(ML[dst])  # nearest even; past the range: NaN (e4m3fn) / Inf (e5m2)
    assert not np.isfinite(want[1:6].astype(np.float32)).any()
    check(cast_model(TP.FLOAT, dst, 0), {"x": x}, expected=[want])


@pytest.mark.parametrize("dst", [TP.FLOAT, TP.FLOAT16])
@pytest.mark.parametrize("src", F8)
def test_cast_from_float8(src, dst):
    check(cast_model(src, dst), {"x": all_codes(src)})


@pytest.mark.parametrize("src,dst", [(TP.FLOAT8E5M2, TP.FLOAT8E4M3FN),
                                     (TP.FLOAT8E4M3FN, TP.FLOAT8E5M2),
                                     (TP.FLOAT8E4M3FNUZ, TP.FLOAT8E5M2FNUZ)])
@pytest.mark.parametrize("saturate", [1, 0])
def test_cast_float8_to_float8(src, dst, saturate):
    x = all_codes(src)
    want = x.astype(np.float32)
    if saturate:
        info = ml_dtypes.finfo(ML[dst])
        want = np.clip(want, float(info.min), float(info.max))
    check(cast_model(src, dst, saturate), {"x": x}, expected=[want.astype(ML[dst])])


@pytest.mark.parametrize("dst", [TP.INT32, TP.INT8, TP.DOUBLE, TP.BOOL])
def test_cast_float8_to_other(dst):
    if DEVICE == "gpu" and dst == TP.DOUBLE:
        pytest.skip("float64 is declined on the GPU")
    x = np.array([0, 1.5, -2.75, 96, -0.0, 0.015625], np.float32).astype(ML[TP.FLOAT8E4M3FN])
    want = x.astype(np.float32).astype(NP[dst])  # float -> int truncates, -> bool is != 0
    check(cast_model(TP.FLOAT8E4M3FN, dst), {"x": x}, expected=[want])


def test_cast_float64_to_float8_rounds_once():
    if DEVICE == "gpu":
        pytest.skip("float64 is declined on the GPU")
    # Just above the midpoint of 1 and 1.125: float32 would round onto the midpoint first.
    x = np.array([1.0625 + 2.0 ** -40, 1.0625 - 2.0 ** -40, 1e300, -3.3], np.float64)
    want = np.array([1.125, 1.0, 448, -3.25], np.float32).astype(ML[TP.FLOAT8E4M3FN])
    check(cast_model(TP.DOUBLE, TP.FLOAT8E4M3FN), {"x": x}, expected=[want])


def test_castlike_float8():
    like = np.zeros((1,), ML[TP.FLOAT8E5M2])
    m = model_of([helper.make_node("CastLike", ["x", "like"], ["y"], saturate=0)],
                 {"x": TP.FLOAT, "like": TP.FLOAT8E5M2}, {"y": TP.FLOAT8E5M2})
    x = float_probe()
    lo, hi = ORT_DIFFERS[TP.FLOAT8E5M2]
    check(m, {"x": x[(np.abs(x) < lo) | (np.abs(x) >= hi)], "like": like})


def test_cast_chain_stays_in_one_group():
    """float32 -> float8 -> float16 inside one fused group: the float8 value never leaves MLX."""
    m = model_of([helper.make_node("Cast", ["x"], ["q"], to=TP.FLOAT8E4M3FN),
                  helper.make_node("Cast", ["q"], ["y"], to=TP.FLOAT16)],
                 {"x": TP.FLOAT}, {"y": TP.FLOAT16})
    check(m, {"x": float_probe()})


# ---- float8e8m0 (the microscaling formats' power-of-two scale) --------------------------------

def e8m0_probe() -> np.ndarray:
    """float_probe plus the exponent field's edges: powers of two and their neighbours, the
    largest exponent with a fraction (rounds to NaN unless saturated), float32 subnormals, and
    guard/round/sticky patterns for round_mode=nearest."""
    edges = [1.0, 1.5, 1.25, 1.75, 1.5 + 2.0 ** -23, 0.75, 2.0 ** 127, 2.0 ** 127 * 1.5,
             2.0 ** 127 * (2 - 2.0 ** -23), 2.0 ** -126, 2.0 ** -127, 3 * 2.0 ** -130, 2.0 ** -149,
             np.nextafter(np.float32(2.0), np.float32(0)), np.float32(1) + np.float32(2.0 ** -23)]
    x = np.concatenate([float_probe(), np.array(edges, np.float32)])
    return np.concatenate([x, -x]).astype(np.float32)


@pytest.mark.parametrize("round_mode", ["up", "down", "nearest"])
@pytest.mark.parametrize("saturate", [1, 0])
@pytest.mark.parametrize("src", [TP.FLOAT, TP.FLOAT16, TP.DOUBLE])
def test_cast_to_float8e8m0(src, saturate, round_mode):
    # ONNX's reference (onnx.numpy_helper.to_float8e8m0), which reads every input as float32
    # first (so does ORT's CPU EP): exact from float16, a rounding from float64.
    from onnx import numpy_helper
    if DEVICE == "gpu" and src == TP.DOUBLE:
        pytest.skip("float64 is declined on the GPU")
    with np.errstate(over="ignore"):
        x = e8m0_probe().astype(NP[src])
    if src == TP.DOUBLE:  # values a float32 rounding moves onto the next power of two
        x = np.concatenate([x, [2.0 - 2.0 ** -40, 4.0 - 2.0 ** -30, 0.75 + 2.0 ** -60]])
    want = numpy_helper.to_float8e8m0(x.astype(np.float32), saturate=bool(saturate), round_mode=round_mode)
    m = model_of([helper.make_node("Cast", ["x"], ["y"], to=TP.FLOAT8E8M0, saturate=saturate,
                                   round_mode=round_mode)], {"x": src}, {"y": TP.FLOAT8E8M0}, opset=25)
    check(m, {"x": x}, expected=[want.view(E8M0)])


@pytest.mark.parametrize("dst", [TP.FLOAT, TP.FLOAT16, TP.FLOAT8E4M3FN])
def test_cast_from_float8e8m0(dst):
    # Every code: 2^(e - 127), 0 -> 2^-127 (a float32 subnormal), 0xFF -> NaN; float16 and
    # float8 then round as a float32 would (ORT's CPU EP is the oracle).
    x = np.arange(256, dtype=np.uint8).view(E8M0).reshape(16, 16)
    check(model_of([helper.make_node("Cast", ["x"], ["y"], to=dst)], {"x": TP.FLOAT8E8M0}, {"y": dst},
                   opset=25), {"x": x})


# ---- int4 / uint4 ---------------------------------------------------------------------------

@pytest.mark.parametrize("dst", [TP.INT4, TP.UINT4])
@pytest.mark.parametrize("src", [TP.FLOAT, TP.FLOAT16, TP.INT32, TP.INT8])
def test_cast_to_4bit_int(src, dst):
    # Integral values, out-of-range ones included (ONNX: the low 4 bits are kept). For
    # non-integral floats ORT's CPU EP rounds to nearest, while ONNX (and this EP) truncate like
    # every float -> integer Cast: covered by test_cast_float_to_int4_truncates.
    x = np.arange(-20, 19).astype(NP[src]).reshape(3, 13)  # odd count: a half-used last byte
    check(cast_model(src, dst), {"x": x})


def test_cast_float_to_int4_truncates():
    x = np.array([2.7, -2.7, 7.9, -8.9, 0.5], np.float32)
    want = np.array([2, -2, 7, -8, 0]).astype(ML[TP.INT4])
    check(cast_model(TP.FLOAT, TP.INT4), {"x": x}, expected=[want])


@pytest.mark.parametrize("src,dst", [(TP.INT4, TP.FLOAT), (TP.INT4, TP.INT8), (TP.INT4, TP.FLOAT16),
                                     (TP.UINT4, TP.FLOAT), (TP.UINT4, TP.UINT8),
                                     (TP.INT4, TP.INT64), (TP.UINT4, TP.INT32)])
def test_cast_from_4bit_int(src, dst):
    lo, hi = (-8, 8) if src == TP.INT4 else (0, 16)
    x = rng.integers(lo, hi, size=(5, 7)).astype(ML[src])
    check(cast_model(src, dst), {"x": x})


# ---- int2 / uint2 (opset 25) -------------------------------------------------------------------

@pytest.mark.parametrize("dst", [TP.INT2, TP.UINT2])
@pytest.mark.parametrize("src", [TP.FLOAT, TP.INT32])
def test_cast_to_2bit_int(src, dst):
    x = np.arange(-9, 9).astype(NP[src]).reshape(2, 9)  # out of range: the low 2 bits are kept
    check(cast_model(src, dst, opset=25), {"x": x})


@pytest.mark.parametrize("src,dst", [(TP.INT2, TP.FLOAT), (TP.INT2, TP.INT8), (TP.UINT2, TP.UINT8),
                                     (TP.UINT2, TP.FLOAT16)])
def test_cast_from_2bit_int(src, dst):
    lo, hi = (-2, 2) if src == TP.INT2 else (0, 4)
    x = rng.integers(lo, hi, size=(3, 7)).astype(ML[src])
    check(cast_model(src, dst, opset=25), {"x": x})


@pytest.mark.parametrize("qtype", [TP.INT2, TP.UINT2])
def test_quantize_dequantize_2bit(qtype):
    x = (rng.standard_normal((3, 6)) * 3).astype(np.float32)
    scale = np.array([0.5, 1.0, 2.0], np.float32)
    zp = np.array([0, 1, -1] if qtype == TP.INT2 else [0, 1, 3]).astype(ML[qtype])
    (q,) = check(q_model(qtype, x.shape, scale, zp, opset=25, axis=0), {"x": x})
    check(dq_model(qtype, scale, zp, opset=25, axis=0), {"x": q})


# ---- float4e2m1 (ORT's CPU EP has no kernels: ml_dtypes is the reference) ------------------------

def test_cast_float_to_float4():
    x = np.array([0.48, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 5.1, -3.5, -8, 9, 1e6, 1e-7,
                  np.inf, -np.inf, -4, 0.01, -0.0], np.float32)
    want = x.astype(ML[TP.FLOAT4E2M1])  # nearest even; beyond +-6 saturates
    check(cast_model(TP.FLOAT, TP.FLOAT4E2M1), {"x": x}, expected=[want])


@pytest.mark.parametrize("dst", [TP.FLOAT, TP.FLOAT16, TP.FLOAT8E4M3FN])
def test_cast_from_float4(dst):
    x = np.arange(16, dtype=np.uint8).view(ML[TP.FLOAT4E2M1])
    want = x.astype(np.float32).astype(ML.get(dst, NP.get(dst)))
    check(cast_model(TP.FLOAT4E2M1, dst), {"x": x}, expected=[want])


# ---- QuantizeLinear / DequantizeLinear ------------------------------------------------------------

def q_model(qtype: int, x_shape, scale, zp=None, opset=21, **attrs):
    names = ["x", "scale"] + (["zp"] if zp is not None else [])
    inits = {"scale": scale}
    if zp is not None:
        inits["zp"] = zp
    return model_of([helper.make_node("QuantizeLinear", names, ["y"], **attrs)],
                    {"x": TP.FLOAT}, {"y": qtype}, inits, opset=opset)


@pytest.mark.parametrize("saturate", [1, 0])
@pytest.mark.parametrize("qtype", F8)
def test_quantize_float8(qtype, saturate):
    x = (rng.standard_normal((4, 6)) * 300).astype(np.float32)
    x[0, :3] = [np.inf, -np.inf, 1e9]
    scale = np.array(0.5, np.float32)
    if not saturate and qtype in ORT_DIFFERS:  # see ORT_DIFFERS
        lo, hi = ORT_DIFFERS[qtype]
        x[(np.abs(x / scale) >= lo) & (np.abs(x / scale) < hi)] = 1.0
    zp = np.zeros((), ML[qtype])
    check(q_model(qtype, x.shape, scale, zp, saturate=saturate), {"x": x})


def test_quantize_float8_per_axis():
    x = (rng.standard_normal((3, 4, 5)) * 50).astype(np.float32)
    scale = np.array([0.5, 2.0, 0.125, 1.0], np.float32)
    zp = np.zeros((4,), ML[TP.FLOAT8E5M2])
    check(q_model(TP.FLOAT8E5M2, x.shape, scale, zp, axis=1), {"x": x})


@pytest.mark.parametrize("qtype", [TP.INT4, TP.UINT4])
def test_quantize_4bit_int(qtype):
    x = (rng.standard_normal((3, 8)) * 10).astype(np.float32)
    scale = np.array([2.0, 3.0, 4.0], np.float32)
    zp = np.array([1, -2, 0] if qtype == TP.INT4 else [1, 8, 0]).astype(ML[qtype])
    check(q_model(qtype, x.shape, scale, zp, axis=0), {"x": x})


@pytest.mark.parametrize("qtype", [TP.INT4, TP.UINT4])
def test_quantize_4bit_blocked(qtype):
    x = (rng.standard_normal((4, 10)) * 8).astype(np.float32)
    scale = rng.uniform(0.5, 2, size=(4, 3)).astype(np.float32)  # blocks of 4 along axis 1
    zp = rng.integers(-3, 3 if qtype == TP.INT4 else 0, size=(4, 3), endpoint=True)
    zp = (zp if qtype == TP.INT4 else zp + 6).astype(ML[qtype])
    check(q_model(qtype, x.shape, scale, zp, axis=1, block_size=4), {"x": x})


def dq_model(xtype: int, scale, zp=None, out=TP.FLOAT, opset=21, **attrs):
    names = ["x", "scale"] + (["zp"] if zp is not None else [])
    inits = {"scale": scale}
    if zp is not None:
        inits["zp"] = zp
    return model_of([helper.make_node("DequantizeLinear", names, ["y"], **attrs)],
                    {"x": xtype}, {"y": out}, inits, opset=opset)


@pytest.mark.parametrize("xtype", F8)
def test_dequantize_float8(xtype):
    x = all_codes(xtype)
    # NaN codes give NaN either way; keep them.
    check(dq_model(xtype, np.array(0.25, np.float32), np.zeros((), ML[xtype])), {"x": x})


def test_dequantize_float8_float16_scale():
    x = all_codes(TP.FLOAT8E4M3FN)
    check(dq_model(TP.FLOAT8E4M3FN, np.array(2.0, np.float16), out=TP.FLOAT16), {"x": x})


@pytest.mark.parametrize("xtype", [TP.INT4, TP.UINT4])
def test_dequantize_4bit_int(xtype):
    lo, hi = (-8, 8) if xtype == TP.INT4 else (0, 16)
    x = rng.integers(lo, hi, size=(3, 7)).astype(ML[xtype])
    zp = rng.integers(lo, hi, size=(3,)).astype(ML[xtype])
    check(dq_model(xtype, np.array([0.5, 1.5, 3.0], np.float32), zp, axis=0), {"x": x})


@pytest.mark.parametrize("xtype", [TP.INT4, TP.UINT4])
def test_dequantize_4bit_blocked(xtype):
    lo, hi = (-8, 8) if xtype == TP.INT4 else (0, 16)
    x = rng.integers(lo, hi, size=(2, 9)).astype(ML[xtype])
    scale = rng.uniform(0.1, 1, size=(2, 3)).astype(np.float32)
    zp = rng.integers(lo, hi, size=(2, 3)).astype(ML[xtype])
    check(dq_model(xtype, scale, zp, axis=1, block_size=3), {"x": x})


def test_quantize_dequantize_float4():
    # float4 Q/DQ needs opset 23; ORT's CPU EP has no kernels for it: ml_dtypes' nearest-even
    # is the reference.
    x = np.array([[0, 2.5, 4.8, 8.6], [-30, -20, 6, 9], [-0.0, -2.5, -4.8, -8.6]], np.float32)
    scale = np.array([2.0, 3.0, 4.0], np.float32)
    zp = np.zeros((3,), ML[TP.FLOAT4E2M1])
    # y = x / scale + zero_point (-0 + 0 is +0, as in ONNX's reference and test data)
    want = (x / scale[:, None] + zp.astype(np.float32)[:, None]).astype(ML[TP.FLOAT4E2M1])
    check(q_model(TP.FLOAT4E2M1, x.shape, scale, zp, opset=23, axis=0), {"x": x},
          expected=[want])
    dq = dq_model(TP.FLOAT4E2M1, scale, zp, opset=23, axis=0)
    check(dq, {"x": want}, expected=[want.astype(np.float32) * scale[:, None]])


# ---- BitCast (opset 26) ------------------------------------------------------------------------

def bitcast_model(src: int, dst: int):
    return model_of([helper.make_node("BitCast", ["x"], ["y"], to=dst)], {"x": src}, {"y": dst},
                    opset=26)


@pytest.mark.parametrize("src,dst", [(TP.FLOAT, TP.INT32), (TP.INT32, TP.FLOAT),
                                     (TP.INT8, TP.UINT8), (TP.UINT16, TP.INT16),
                                     (TP.FLOAT16, TP.UINT16), (TP.INT64, TP.DOUBLE)])
def test_bitcast(src, dst):
    if DEVICE == "gpu" and TP.DOUBLE in (src, dst):
        pytest.skip("float64 is declined on the GPU")
    x = rng.integers(0, 256, size=(3, 8), dtype=np.uint8).view(NP.get(src, np.uint16))
    check(bitcast_model(src, dst), {"x": x})


@pytest.mark.parametrize("src,dst", [(TP.FLOAT8E4M3FN, TP.UINT8), (TP.UINT8, TP.FLOAT8E5M2),
                                     (TP.FLOAT8E5M2, TP.FLOAT8E4M3FNUZ), (TP.INT8, TP.FLOAT8E4M3FN),
                                     (TP.BOOL, TP.UINT8), (TP.INT4, TP.UINT4),
                                     (TP.UINT4, TP.INT4), (TP.FLOAT4E2M1, TP.INT4),
                                     (TP.INT2, TP.UINT2), (TP.UINT2, TP.INT2)])
def test_bitcast_lowp(src, dst):
    bits = np.arange(256, dtype=np.uint8).reshape(16, 16)
    if src in SUB_BYTE:
        bits = (bits & ((1 << BITS[src]) - 1))[:3]
    if src == TP.BOOL:
        bits = bits & 1

    def typed(b, t):  # the value whose bit pattern is b
        if t in SUB_BYTE:
            return unpack(pack_codes(b, BITS[t]), t, b.shape)
        return b.view(ML[t]) if t in ML else b.view(NP[t]) if t != TP.BOOL else b.astype(bool)

    check(bitcast_model(src, dst), {"x": typed(bits, src)}, expected=[typed(bits, dst)])


# ---- data movement (Reshape, Transpose, Unsqueeze, Squeeze, Flatten, Identity opt in) ---------

@pytest.mark.parametrize("elem", [TP.FLOAT8E4M3FN, TP.FLOAT8E5M2FNUZ, TP.INT4, TP.UINT4,
                                  TP.FLOAT4E2M1, TP.INT2])
def test_data_movement(elem):
    """Bytes are bytes: a chain of layout ops on the storage, expected values from numpy."""
    if elem in SUB_BYTE:  # 15 elements: the last byte is partly used
        x = unpack(pack_codes(rng.integers(0, 1 << BITS[elem], size=15), BITS[elem]), elem, (3, 5))
    else:
        x = rng.integers(0, 256, size=(3, 5), dtype=np.uint8).view(ML[elem])
    m = model_of([helper.make_node("Reshape", ["x", "shape"], ["a"]),
                  helper.make_node("Transpose", ["a"], ["b"], perm=[1, 0]),
                  helper.make_node("Unsqueeze", ["b", "axes"], ["c"]),
                  helper.make_node("Squeeze", ["c", "axes"], ["d"]),
                  helper.make_node("Flatten", ["d"], ["e"], axis=1),
                  helper.make_node("Identity", ["e"], ["y"])],
                 {"x": elem}, {"y": elem},
                 {"shape": np.array([5, 3], np.int64), "axes": np.array([0], np.int64)},
                 opset=25 if elem == TP.INT2 else 23)  # int2 from opset 25
    want = x.reshape(5, 3).T.copy()
    outs = check(m, {"x": x}, expected=[want])
    assert outs[0].tobytes() == want.tobytes()  # bit for bit (NaN codes included)


# ---- what stays off MLX ---------------------------------------------------------------------------

def test_op_without_opt_in_is_declined():
    """A node whose registry entry does not opt in (here Shape) is declined when it touches a
    float8 value, whatever it would do with it: the Cast before it still runs on MLX."""
    m = model_of([helper.make_node("Cast", ["x"], ["q"], to=TP.FLOAT8E4M3FN),
                  helper.make_node("Shape", ["q"], ["y"], name="shape")],
                 {"x": TP.FLOAT}, {"y": TP.INT64})
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so = om.record_assignment(om.session_options(DEVICE, fallback=True, so=so))
    s = ort.InferenceSession(m, sess_options=so)
    placed = om.placement(s)
    assert ("shape", "Shape") in placed.get("CPUExecutionProvider", []), placed
    assert [op for _, op in placed.get(om.EP_NAME, [])] == ["Cast"], placed
    x = float_probe().reshape(-1, 1)
    np.testing.assert_array_equal(s.run(None, {"x": x})[0], np.array(x.shape))
