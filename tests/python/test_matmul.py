import json

import ml_dtypes
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import onnxruntime_mlx as om
import oracle
from oracle import BF16_TOL, check_node

rng = np.random.default_rng(0)

BF16 = ml_dtypes.bfloat16


def rand(shape, dtype):
    dtype = np.dtype(dtype)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True)
    return rng.uniform(-1, 1, size=shape).astype(dtype)


def check_bf16(op, inputs, attrs, expected, opset=21):
    """ORT's Python API cannot feed or fetch bfloat16: the model takes float32 inputs, Casts them
    to bf16 (`inputs` maps name -> (array, is_bf16)), runs `op` and Casts back. `op` itself must
    be placed on MLX; the result must match `expected` (computed in numpy)."""
    nodes, feeds, graph_inputs, op_inputs = [], {}, [], []
    for name, (arr, is_bf16) in inputs.items():
        feed = arr.astype(np.float32) if is_bf16 else arr
        feeds[name] = feed
        graph_inputs.append(helper.make_tensor_value_info(
            name, helper.np_dtype_to_tensor_dtype(feed.dtype), list(arr.shape)))
        if is_bf16:
            nodes.append(helper.make_node("Cast", [name], [name + "_bf16"], to=TensorProto.BFLOAT16))
            op_inputs.append(name + "_bf16")
        else:
            op_inputs.append(name)
    nodes.append(helper.make_node(op, op_inputs, ["y"], name="under_test", **attrs))
    out_bf16 = str(expected.dtype) == "bfloat16"
    if out_bf16:
        nodes.append(helper.make_node("Cast", ["y"], ["out"], to=TensorProto.FLOAT))
    out_type = TensorProto.FLOAT if out_bf16 else helper.np_dtype_to_tensor_dtype(expected.dtype)
    g = helper.make_graph(nodes, "bf16", graph_inputs,
                          [helper.make_tensor_value_info("out" if out_bf16 else "y", out_type, None)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 10
    so = om.record_assignment(om.session_options("cpu", fallback=True))
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(m.SerializeToString(), sess_options=so)
    got = sess.run(None, feeds)[0]
    assert ("under_test", op) in om.placement(sess).get(om.EP_NAME, []), om.placement(sess)
    np.testing.assert_allclose(got, expected.astype(np.float32), *BF16_TOL)


# ---- MatMul -----------------------------------------------------------------------------------

MATMUL_SHAPES = [
    ((3, 4), (4, 5)),
    ((4,), (4, 5)),          # 1-D x 2-D
    ((3, 4), (4,)),          # 2-D x 1-D
    ((4,), (4,)),            # 1-D x 1-D -> scalar
    ((4,), (2, 4, 3)),       # 1-D x batched
    ((2, 3, 4), (4,)),       # batched x 1-D
    ((2, 1, 3, 4), (5, 4, 6)),  # batch broadcasting
    ((1, 3, 4), (2, 4, 5)),
    ((0, 4), (4, 5)),        # M = 0
    ((3, 0), (0, 5)),        # K = 0 -> zeros
    ((3, 4), (4, 0)),        # N = 0
    ((2, 0, 3), (3, 4)),     # empty batch rows
]


@pytest.mark.parametrize("shapes", MATMUL_SHAPES)
def test_matmul_shapes_f32(shapes):
    check_node("MatMul", {"a": rand(shapes[0], np.float32), "b": rand(shapes[1], np.float32)})


@pytest.mark.parametrize("dtype", [np.float16, np.float64, np.int32, np.int64, np.uint32,
                                   np.uint64])
@pytest.mark.parametrize("shapes", [((3, 7), (7, 5)), ((7,), (7, 2)), ((2, 1, 3, 4), (5, 4, 6)),
                                    ((3, 0), (0, 2))])
def test_matmul_dtypes(dtype, shapes):
    # Integers use the full value range: products and sums wrap modulo 2^width like ORT's.
    a, b = rand(shapes[0], dtype), rand(shapes[1], dtype)
    # ORT's empty-K MatMul fails for unsigned types: compare with zeros there.
    expected = [np.zeros((3, 2), dtype)] if a.size == 0 and dtype in (np.uint32, np.uint64) else None
    check_node("MatMul", {"a": a, "b": b}, expected=expected)


# A half-precision weight given as an initializer: on MLX's CPU backend its float32 copy is
# prepared once per session (translate_matmul's f32_constant); every run after the first
# reuses it. check_node runs each model several times.
@pytest.mark.parametrize("shapes", [((1, 64), (64, 48)), ((1, 1, 64), (64, 48)), ((9, 64), (64, 48)),
                                    ((2, 3, 64), (64,)), ((64,), (2, 64, 5))])
@pytest.mark.parametrize("transposed", ["0", "1"])
def test_matmul_f16_constant_weight(shapes, transposed):
    # transposed_weights (GPU): a 2-D weight is stored [N, K] and read through a view.
    check_node("MatMul", {"a": rand(shapes[0], np.float16)}, initializers={"b": rand(shapes[1], np.float16)},
               transposed_weights=transposed)


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
@pytest.mark.parametrize("rows", [1, 7])
def test_matmul_weights_shared_and_read_elsewhere(dtype, rows):
    # Two products share w (stored transposed on the GPU); v is also added to itself and u is a
    # graph output (both keep ONNX's layout): every output must match the CPU EP.
    x = helper.make_tensor_value_info("x", helper.np_dtype_to_tensor_dtype(np.dtype(dtype)), [1, rows, 32])
    nodes = [helper.make_node("MatMul", ["x", "w"], ["a"]), helper.make_node("MatMul", ["x", "w"], ["b"]),
             helper.make_node("MatMul", ["x", "v"], ["c"]), helper.make_node("Add", ["v", "v"], ["d"]),
             helper.make_node("MatMul", ["x", "u"], ["e"]), helper.make_node("Identity", ["u"], ["f"])]
    inits = [onnx.numpy_helper.from_array(rand((32, n), dtype), name) for name, n in (("w", 24), ("v", 16), ("u", 8))]
    outs = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(np.dtype(dtype)), None) for n in "abcdef"]
    m = helper.make_model(helper.make_graph(nodes, "shared", [x], outs, inits),
                          opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 10
    oracle.check_model(m, {"x": rand((1, rows, 32), dtype)})


@pytest.mark.parametrize("trans_b", [0, 1])
def test_gemm_f16_constant_weight(trans_b):
    b = rand((6, 5) if not trans_b else (5, 6), np.float16)
    check_node("Gemm", {"a": rand((3, 6), np.float16)}, {"transB": trans_b, "alpha": 0.5},
               initializers={"b": b, "c": rand((5,), np.float16)})


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_matmul_int_small_exact(dtype):
    # Values where no wrap-around happens: the result is the true integer product.
    a = rng.integers(-1000, 1000, size=(4, 300)).astype(dtype)
    b = rng.integers(-1000, 1000, size=(300, 3)).astype(dtype)
    check_node("MatMul", {"a": a, "b": b}, expected=[a @ b])


def test_matmul_bf16():
    # ORT's CPU EP has no bf16 MatMul: compare with a float32 product rounded to bf16.
    a, b = rand((2, 3, 8), BF16), rand((8, 5), BF16)
    ref = (a.astype(np.float32) @ b.astype(np.float32)).astype(BF16)
    check_bf16("MatMul", {"a": (a, True), "b": (b, True)}, {}, ref)


@pytest.mark.parametrize("opset", [1, 9, 13])
def test_matmul_opsets(opset):
    check_node("MatMul", {"a": rand((2, 3), np.float32), "b": rand((3, 4), np.float32)},
               opset=opset)


def test_matmul_constant_weight():
    check_node("MatMul", {"a": rand((2, 5, 8), np.float32)}, initializers={"w": rand((8, 3), np.float32)})


# ---- float32 products of several rows through oneDNN's sgemm (cpu_dnnl_matmul) ----------------

ONEDNN_SHAPES = [((2, 3), (3, 5)), ((7, 33), (33, 17)), ((64, 128), (128, 65)), ((2, 5, 31), (31, 9)),
                 ((2, 3, 4, 16), (16, 1)), ((5, 1), (1, 6)),
                 # batched (attention's products: one sgemm per batch element), broadcast batches
                 ((2, 3, 17, 8), (2, 3, 8, 17)), ((2, 4, 5, 8), (2, 1, 8, 9)), ((5, 8), (3, 8, 9)),
                 ((1, 3, 4), (2, 4, 5))]


@pytest.mark.parametrize("shapes", ONEDNN_SHAPES)
@pytest.mark.parametrize("constant", [True, False])
@pytest.mark.parametrize("cpu_dnnl_matmul", [1, 0])
def test_matmul_through_onednn(shapes, constant, cpu_dnnl_matmul):
    """cpu_dnnl_matmul=1 (off by default): on the CPU device oneDNN's sgemm runs float32 products of
    several rows by a 2-D matrix, or batched ones of several rows per batch element (these small
    ones too: cpu_dnnl_min_flops=0), the matrix a constant weight or an input; =0 keeps MLX's
    matmul. Both must match ORT's CPU EP."""
    a, b = rand(shapes[0], np.float32), rand(shapes[1], np.float32)
    inputs, inits = ({"a": a}, {"b": b}) if constant else ({"a": a, "b": b}, None)
    check_node("MatMul", inputs, initializers=inits, cpu_dnnl_matmul=cpu_dnnl_matmul, cpu_dnnl_min_flops=0)


@pytest.mark.parametrize("trans_a", [0, 1])
@pytest.mark.parametrize("trans_b", [0, 1])
@pytest.mark.parametrize("alpha,beta,c_shape", [(1.0, 1.0, None), (0.5, 2.0, (9,)), (-1.5, 1.0, (7, 9)),
                                                (1.0, 0.0, (7, 1))])
def test_gemm_through_onednn(trans_a, trans_b, alpha, beta, c_shape):
    """Gemm on the oneDNN path: transposed A and B reach sgemm as transposed views, alpha and C
    are applied after it."""
    a = rand((13, 7) if trans_a else (7, 13), np.float32)
    b = rand((9, 13) if trans_b else (13, 9), np.float32)
    inputs = {"a": a}
    if c_shape is not None:
        inputs["c"] = rand(c_shape, np.float32)
    check_node("Gemm", inputs, {"transA": trans_a, "transB": trans_b, "alpha": alpha, "beta": beta},
               initializers={"b": b}, input_order=["a", "b"] + (["c"] if c_shape else []),
               cpu_dnnl_min_flops=0)


def test_products_run_through_onednn_on_the_cpu(tmp_path):
    """An encoder-like chain: a [2, 64, 128] batch of rows by a constant weight, a Gemm with
    transB, alpha and a bias, a product by a second input, a batched product of x by its own
    transpose (attention's scores), and a one-row product. Outputs match
    ORT's CPU EP with cpu_dnnl_matmul on and off. On MLX's CPU device the report counts a oneDNN
    product per several-row product and run when the option is on (none fail), none when it is
    off, and never the one-row product (sgemv's) or one under cpu_dnnl_min_flops (1e5 here); on the GPU
    none at all. (cpu_packed_matmul=0: the EP's own kernel takes the products by constants first.)"""
    r = np.random.default_rng(5)
    w1 = (r.standard_normal((128, 192)) / 11).astype(np.float32)  # outputs of magnitude ~1
    w2 = (r.standard_normal((96, 192)) / 14).astype(np.float32)  # Gemm transB: [N, K]
    c2 = r.standard_normal(96).astype(np.float32)
    w4 = r.standard_normal((96, 2)).astype(np.float32)  # 2 x 128 x 96 x 2 flops: under 1e6
    f = TensorProto.FLOAT
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w1"], ["h"]),                     # 2 x 128 x 128 x 192 flops
         helper.make_node("Reshape", ["h", "shape"], ["h2"]),
         helper.make_node("Gemm", ["h2", "w2", "c2"], ["g"], transB=1, alpha=0.5),
         helper.make_node("MatMul", ["g", "v"], ["p"]),                      # by an input [96, 48]
         helper.make_node("MatMul", ["g", "w4"], ["small"]),
         helper.make_node("Transpose", ["x"], ["xt"], perm=[0, 2, 1]),
         helper.make_node("MatMul", ["x", "xt"], ["scores"]),                # 2 x 2 x 64 x 128 x 64 flops
         helper.make_node("MatMul", ["row", "v"], ["q"])],                   # one row
        "chain", [helper.make_tensor_value_info("x", f, [2, 64, 128]), helper.make_tensor_value_info("v", f, [96, 48]),
                  helper.make_tensor_value_info("row", f, [1, 96])],
        [helper.make_tensor_value_info(n, f, None) for n in ("p", "small", "scores", "q")],
        [onnx.numpy_helper.from_array(v, n) for n, v in
         (("w1", w1), ("w2", w2), ("c2", c2), ("w4", w4), ("shape", np.array([128, 192], np.int64)))])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 9
    feeds = {"x": r.standard_normal((2, 64, 128)).astype(np.float32),
             "v": (r.standard_normal((96, 48)) / 10).astype(np.float32), "row": r.standard_normal((1, 96)).astype(np.float32)}
    ref = oracle.run_cpu(m, feeds)
    counts = []
    runs = 4
    for on in (1, 0, 1):
        report = tmp_path / f"r{len(counts)}.jsonl"
        s = om.InferenceSession(m.SerializeToString(), oracle.DEVICE, fallback=False, report_path=str(report),
                                cpu_dnnl_matmul=on, cpu_dnnl_min_flops=100000, cpu_packed_matmul=0)
        for _ in range(runs):
            got = s.run(None, feeds)
        del s
        line = next(json.loads(ln) for ln in report.read_text().splitlines() if '"fused_node"' in ln)
        assert line["process_dnnl_matmul_failures"] == 0
        counts.append(line["process_dnnl_matmuls"])
        for y, want in zip(got, ref):
            np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-3, err_msg=f"cpu_dnnl_matmul={on}")
    assert counts[1] == counts[0], counts  # cpu_dnnl_matmul=0 ran none
    if oracle.DEVICE == "cpu":
        assert counts[0] >= 4 * runs, counts
        assert counts[2] - counts[1] == 4 * runs, counts  # MatMul, Gemm, the product by v, the scores
    else:
        assert counts[2] == counts[0] == 0, counts


# ---- Gemm -------------------------------------------------------------------------------------

def gemm_ref(a, b, c, trans_a=0, trans_b=0, alpha=1.0, beta=1.0):
    a = a.T if trans_a else a
    b = b.T if trans_b else b
    y = alpha * (a.astype(np.float64) @ b.astype(np.float64))
    if c is not None and beta != 0:
        y = y + beta * c.astype(np.float64)
    return y


@pytest.mark.parametrize("trans_a", [0, 1])
@pytest.mark.parametrize("trans_b", [0, 1])
@pytest.mark.parametrize("alpha,beta", [(1.0, 1.0), (0.5, 2.0), (-1.5, 0.0)])
@pytest.mark.parametrize("c_shape", [None, (), (1,), (5,), (1, 5), (3, 1), (3, 5)])
def test_gemm_attrs(trans_a, trans_b, alpha, beta, c_shape):
    a = rand((4, 3) if trans_a else (3, 4), np.float32)
    b = rand((5, 4) if trans_b else (4, 5), np.float32)
    inputs = {"a": a, "b": b}
    if c_shape is not None:
        inputs["c"] = rand(c_shape, np.float32)
    check_node("Gemm", inputs, {"transA": trans_a, "transB": trans_b, "alpha": alpha, "beta": beta})


@pytest.mark.parametrize("dtype", [np.float16, np.float64])
def test_gemm_dtypes(dtype):
    check_node("Gemm", {"a": rand((3, 6), dtype), "b": rand((5, 6), dtype), "c": rand((5,), dtype)},
               {"transB": 1, "alpha": 0.75})


def test_gemm_bf16():
    a, b, c = rand((3, 6), BF16), rand((6, 5), BF16), rand((5,), BF16)
    ref = gemm_ref(a, b, c, alpha=2.0).astype(BF16)
    check_bf16("Gemm", {"a": (a, True), "b": (b, True), "c": (c, True)}, {"alpha": 2.0}, ref)


def test_gemm_beta_zero_ignores_c():
    c = np.full((3, 5), np.inf, np.float32)
    check_node("Gemm", {"a": rand((3, 4), np.float32), "b": rand((4, 5), np.float32), "c": c},
               {"beta": 0.0})


def test_gemm_empty():
    # K = 0: the product is zero, the result is beta * C (ORT returns C unscaled: numpy here).
    c = rand((5,), np.float32)
    check_node("Gemm", {"a": rand((3, 0), np.float32), "b": rand((0, 5), np.float32), "c": c},
               {"beta": 2.0}, expected=[np.broadcast_to(2 * c, (3, 5))])
    check_node("Gemm", {"a": rand((0, 4), np.float32), "b": rand((4, 5), np.float32),
                        "c": rand((5,), np.float32)})


@pytest.mark.parametrize("opset", [7, 9, 11, 13])
def test_gemm_opsets(opset):
    check_node("Gemm", {"a": rand((3, 4), np.float32), "b": rand((4, 5), np.float32),
                        "c": rand((1, 5), np.float32)}, {"alpha": 1.25}, opset=opset)


@pytest.mark.parametrize("opset,attrs", [(6, {"broadcast": 1}), (6, {"broadcast": 0})])
def test_gemm_legacy_broadcast(opset, attrs):
    # ORT's CPU EP has no Gemm before opset 7: compare with numpy.
    a, b = rand((3, 4), np.float32), rand((5, 4), np.float32)
    c = rand((3, 5) if not attrs["broadcast"] else (5,), np.float32)
    ref = gemm_ref(a, b, c, trans_b=1, beta=0.5).astype(np.float32)
    check_node("Gemm", {"a": a, "b": b, "c": c}, {"transB": 1, "beta": 0.5, **attrs}, opset=opset,
               expected=[ref])


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint32])
def test_gemm_integer(dtype):
    # No ORT kernel for integer Gemm: numpy reference with whole-number alpha/beta.
    a = rng.integers(0, 50, size=(3, 4)).astype(dtype)
    b = rng.integers(0, 50, size=(5, 4)).astype(dtype)
    c = rng.integers(0, 50, size=(5,)).astype(dtype)
    ref = (a @ b.T) * dtype(3) + c * dtype(2)
    check_node("Gemm", {"a": a, "b": b, "c": c}, {"transB": 1, "alpha": 3.0, "beta": 2.0},
               expected=[ref.astype(dtype)])


# ---- MatMulInteger ----------------------------------------------------------------------------

I8 = (np.int8, np.uint8)


def qrand(shape, dtype, lo=None, hi=None):
    info = np.iinfo(dtype)
    return rng.integers(info.min if lo is None else lo, (info.max if hi is None else hi) + 1,
                        size=shape).astype(dtype)


def mmi_ref(a, b, za=None, zb=None):
    a = a.astype(np.int64) - (0 if za is None else np.asarray(za).astype(np.int64))
    b = b.astype(np.int64) - (0 if zb is None else np.asarray(zb).astype(np.int64))
    return np.matmul(a, b).astype(np.int32)


@pytest.mark.parametrize("ta,tb", [(np.uint8, np.uint8), (np.int8, np.int8), (np.int8, np.uint8)])
@pytest.mark.parametrize("shapes", [((3, 40), (40, 5)), ((40,), (40, 5)), ((3, 40), (40,)),
                                    ((2, 1, 3, 8), (5, 8, 6)), ((3, 0), (0, 4)), ((0, 3), (3, 4))])
def test_matmul_integer(ta, tb, shapes):
    a, b = qrand(shapes[0], ta), qrand(shapes[1], tb)
    za = qrand((), ta)
    zb = qrand((), tb)
    # ORT leaves an empty-K output uninitialised: numpy reference there.
    expected = (lambda *z: [mmi_ref(a, b, *z)]) if a.shape[-1] == 0 else (lambda *z: None)
    check_node("MatMulInteger", {"a": a, "b": b, "za": za, "zb": zb}, expected=expected(za, zb))
    check_node("MatMulInteger", {"a": a, "b": b}, expected=expected())


@pytest.mark.parametrize("ta,tb", [(np.uint8, np.uint8), (np.int8, np.int8)])
def test_matmul_integer_per_column(ta, tb):
    a, b = qrand((4, 64), ta), qrand((64, 6), tb)
    check_node("MatMulInteger", {"a": a, "b": b, "za": qrand((), ta), "zb": qrand((6,), tb)})
    # batched B with a [D, 1, N] zero point
    b3 = qrand((2, 64, 6), tb)
    check_node("MatMulInteger", {"a": a, "b": b3, "za": qrand((1,), ta), "zb": qrand((2, 1, 6), tb)})


def test_matmul_integer_per_row():
    # ORT takes only a scalar A zero point: numpy reference for the per-row form.
    a, b = qrand((4, 9), np.uint8), qrand((9, 3), np.uint8)
    za = qrand((4,), np.uint8)
    zb = qrand((3,), np.uint8)
    check_node("MatMulInteger", {"a": a, "b": b, "za": za, "zb": zb},
               expected=[mmi_ref(a, b, za[:, None], zb)])
    a3 = qrand((2, 4, 9), np.int8)
    za3 = qrand((2, 4, 1), np.int8)
    check_node("MatMulInteger", {"a": a3, "b": b, "za": za3},
               expected=[mmi_ref(a3, b, za3)])


def test_matmul_integer_u8s8_exact():
    # uint8 x int8 over the full range: ORT's AVX2 kernel saturates 16-bit pair sums
    # (vpmaddubsw) and is wrong here, so compare with the exact integer product ...
    a, b = qrand((8, 256), np.uint8), qrand((256, 8), np.int8)
    check_node("MatMulInteger", {"a": a, "b": b}, expected=[mmi_ref(a, b)])
    za, zb = np.uint8(200), np.int8(-100)
    check_node("MatMulInteger", {"a": a, "b": b, "za": np.array(za), "zb": np.array(zb)},
               expected=[mmi_ref(a, b, za, zb)])
    # ... and with ORT where its pair sums fit in int16.
    b = qrand((256, 8), np.int8, -64, 63)
    check_node("MatMulInteger", {"a": a, "b": b})


def test_matmul_integer_extremes():
    # |a - za| = |b - zb| = 255 everywhere: the largest products, long K.
    a = np.full((2, 1000), 255, np.uint8)
    b = np.zeros((1000, 3), np.uint8)
    check_node("MatMulInteger", {"a": a, "b": b, "za": np.array(0, np.uint8), "zb": np.array(255, np.uint8)})
    a = np.full((2, 1000), -128, np.int8)
    b = np.full((1000, 3), 127, np.int8)
    check_node("MatMulInteger", {"a": a, "b": b, "za": np.array(127, np.int8), "zb": np.array(-128, np.int8)})


def test_matmul_integer_constant_weight():
    a = qrand((3, 16), np.uint8)
    check_node("MatMulInteger", {"a": a, "za": np.array(128, np.uint8)},
               initializers={"b": qrand((16, 4), np.uint8), "zb": np.array(3, np.uint8)},
               input_order=["a", "b", "za", "zb"])


# ---- QLinearMatMul ----------------------------------------------------------------------------

def qlmm_ref(a, sa, za, b, sb, zb, sy, zy):
    acc = mmi_ref(a, b, za, zb)
    scale = (np.asarray(sa, np.float32) * np.asarray(sb, np.float32)) / np.float32(sy)
    v = np.round(acc.astype(np.float32) * scale) + np.float32(zy)
    info = np.iinfo(np.asarray(zy).dtype)
    return np.clip(v, info.min, info.max).astype(np.asarray(zy).dtype)


def qlmm_inputs(a, b, sa, za, sb, zb, sy, zy, ty=None):
    f = lambda v: np.asarray(v, np.float32)  # noqa: E731
    return {"a": a, "sa": f(sa), "za": np.asarray(za, a.dtype), "b": b, "sb": f(sb),
            "zb": np.asarray(zb, b.dtype), "sy": f(sy), "zy": np.asarray(zy, ty or a.dtype)}


@pytest.mark.parametrize("ta,tb,ty", [(np.uint8, np.uint8, np.uint8), (np.int8, np.int8, np.int8),
                                      (np.uint8, np.int8, np.uint8)])
@pytest.mark.parametrize("shapes", [((3, 16), (16, 5)), ((16,), (16, 5)), ((3, 16), (16,)),
                                    ((2, 1, 3, 8), (5, 8, 6)), ((3, 0), (0, 4))])
def test_qlinear_matmul(ta, tb, ty, shapes):
    a = qrand(shapes[0], ta)
    b = qrand(shapes[1], tb, *((-64, 63) if tb is np.int8 and ta is np.uint8 else (None, None)))
    za, zb, zy = qrand((), ta), qrand((), tb), qrand((), ty)
    inputs = qlmm_inputs(a, b, 0.02, za, 0.03, zb, 0.9, zy, ty)
    ref = [qlmm_ref(a, 0.02, za, b, 0.03, zb, 0.9, zy)]
    if a.shape[-1]:  # ORT leaves an empty-K output uninitialised
        check_node("QLinearMatMul", inputs)
    check_node("QLinearMatMul", inputs, expected=ref)


def test_qlinear_matmul_per_column():
    a, b = qrand((4, 32), np.uint8), qrand((32, 6), np.uint8)
    sb = rng.uniform(0.01, 0.05, 6).astype(np.float32)
    zb = qrand((6,), np.uint8)
    # ORT wants [1, N] for a 2-D B; the spec's 1-D [N] form is checked against numpy.
    check_node("QLinearMatMul", qlmm_inputs(a, b, 0.05, 130, sb.reshape(1, 6), zb.reshape(1, 6), 0.7, 120))
    check_node("QLinearMatMul", qlmm_inputs(a, b, 0.05, 130, sb, zb, 0.7, 120),
               expected=[qlmm_ref(a, 0.05, np.uint8(130), b, sb, zb, 0.7, np.uint8(120))])
    b3 = qrand((2, 32, 6), np.uint8)
    sb3 = rng.uniform(0.01, 0.05, (2, 1, 6)).astype(np.float32)
    check_node("QLinearMatMul", qlmm_inputs(a, b3, 0.05, 130, sb3, qrand((2, 1, 6), np.uint8), 0.7, 120))


def test_qlinear_matmul_per_row():
    # ORT takes only a scalar A scale/zero point: numpy reference for the per-row form.
    a, b = qrand((4, 32), np.int8), qrand((32, 6), np.int8)
    sa = rng.uniform(0.01, 0.05, 4).astype(np.float32)
    za = qrand((4,), np.int8)
    ref = qlmm_ref(a, sa[:, None], za[:, None], b, 0.03, -5, 0.4, np.int8(-7))
    check_node("QLinearMatMul", qlmm_inputs(a, b, sa, za, 0.03, -5, 0.4, np.int8(-7)), expected=[ref])


def test_qlinear_matmul_saturation():
    # Large accumulators saturate at both ends of the output range.
    a = np.concatenate([np.full((1, 64), 255, np.uint8), np.zeros((1, 64), np.uint8)])
    b = np.full((64, 3), 255, np.uint8)
    check_node("QLinearMatMul", qlmm_inputs(a, b, 0.1, 128, 0.1, 0, 0.01, 10))
    check_node("QLinearMatMul", qlmm_inputs(a, b, 0.1, 0, 0.1, 0, 1e-3, 250))


@pytest.mark.parametrize("ta", [np.uint8, np.int8])
def test_qlinear_matmul_fp16_scales(ta):
    # Opset 21 fp16 scales: ORT has no kernel, ONNX's reference evaluator is the oracle.
    if oracle.DEVICE == "gpu":
        pytest.skip("fp16 scales need float64 requantization: declined on the GPU")
    from onnx.reference import ReferenceEvaluator
    from oracle import make_node_model
    a, b = qrand((2, 3, 16), ta), qrand((16, 5), ta)
    h = lambda v: np.asarray(v, np.float16)  # noqa: E731
    inputs = {"a": a, "sa": h(0.02), "za": qrand((), ta), "b": b, "sb": h(0.03), "zb": qrand((), ta),
              "sy": h(0.2), "zy": qrand((), ta)}
    ref = ReferenceEvaluator(make_node_model("QLinearMatMul", inputs)).run(None, inputs)
    check_node("QLinearMatMul", inputs, expected=ref)
