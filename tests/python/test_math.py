"""Einsum and Det vs ORT's CPU EP (numpy where ORT has no kernel)."""
import numpy as np
import pytest
from onnx import helper

import oracle
from oracle import make_node_model, run_mlx
from test_reduce import BF16, check_f32_ref, check_model  # GPU-aware wrappers

rng = np.random.default_rng(2)


def rand(shape, dtype, lo=-2.0, hi=2.0):
    dtype = np.dtype(dtype)
    if dtype.kind in "iu":
        return rng.integers(int(lo), int(hi) + 1, size=shape).astype(dtype)
    return rng.uniform(lo, hi, size=shape).astype(dtype)


def einsum_model(eq, arrays):
    inputs = {f"x{i}": a for i, a in enumerate(arrays)}
    # explicit output type: ONNX's shape inference leaves some ellipsis forms untyped
    out_type = helper.np_dtype_to_tensor_dtype(arrays[0].dtype)
    return inputs, make_node_model("Einsum", inputs, 1, {"equation": eq}, None, 12,
                                   output_types=[out_type])


def check_einsum(eq, arrays, numpy_ref=False):
    inputs, m = einsum_model(eq, arrays)
    expected = None
    if numpy_ref:
        wide = [a.astype(np.float64 if a.dtype.kind == "f" else a.dtype) for a in arrays]
        expected = [np.asarray(np.einsum(eq, *wide)).astype(arrays[0].dtype)]
    check_model(m, inputs, expected=expected)


FORMS = [
    ("ij,jk->ik", [(2, 3), (3, 4)]),
    ("ij,jk", [(2, 3), (3, 4)]),                       # implicit output
    ("bij,bjk->bik", [(2, 2, 3), (2, 3, 4)]),
    ("bij,bkj->bik", [(2, 2, 3), (2, 4, 3)]),
    ("ii->i", [(3, 3)]),                                # diagonal
    ("ii", [(3, 3)]),                                   # trace
    ("ii->", [(4, 4)]),
    ("iii->i", [(2, 2, 2)]),
    ("iij->j", [(2, 2, 3)]),
    ("iji->j", [(2, 3, 2)]),
    ("bii->bi", [(2, 3, 3)]),
    ("ij->", [(2, 3)]),
    ("ij->ji", [(2, 3)]),
    ("ba", [(2, 3)]),                                   # implicit: sorted labels -> transpose
    ("aB,Bc->ac", [(2, 3), (3, 4)]),                    # upper-case labels
    ("i,i", [(5,), (5,)]),                              # inner product
    ("i,j", [(2,), (3,)]),                              # outer product
    ("i,i->i", [(1,), (3,)]),                           # size-1 label broadcasts
    (",i->i", [(), (3,)]),                              # scalar operand
    ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 5)]),
    ("ij,ij->ij", [(2, 3), (2, 3)]),
    ("ij,ij->", [(2, 3), (2, 3)]),
    ("ij,kj->ik", [(0, 3), (4, 3)]),                    # empty
    ("ij,jk->ik", [(2, 0), (0, 4)]),                    # empty contraction -> zeros
    ("...ij,...jk->...ik", [(2, 2, 3), (2, 3, 4)]),
    ("...ij,...jk", [(2, 1, 2, 3), (1, 5, 3, 4)]),      # implicit, ellipsis dims broadcast
    ("...j,...j->...", [(2, 1, 3), (1, 4, 3)]),
    ("...->...", [(2, 3)]),
    ("i...->...", [(2, 3)]),
    ("...ii->...i", [(4, 3, 3)]),
    ("ii...->i...", [(3, 3, 4)]),
    ("i...,i...->...", [(2, 3), (2, 1)]),
    ("ab...,b...->a...", [(2, 3, 4, 5), (3, 1, 5)]),
    ("...,...", [(2, 3), (2, 3)]),
    ("b i j , b j k -> b i k", [(2, 2, 3), (2, 3, 4)]),  # spaces
]


@pytest.mark.parametrize("eq,shapes", FORMS, ids=[f[0] for f in FORMS])
def test_einsum_forms(eq, shapes):
    check_einsum(eq, [rand(s, np.float32) for s in shapes])


@pytest.mark.parametrize("eq,shapes", FORMS, ids=[f[0] for f in FORMS])
def test_einsum_forms_int64(eq, shapes):
    # integers: MLX's matmul is float only, so these take the broadcast-multiply path
    check_einsum(eq, [rand(s, np.int64, -5, 5) for s in shapes])


@pytest.mark.parametrize("dtype", [np.float16, np.float64, np.int32])
@pytest.mark.parametrize("eq,shapes", [("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]),
                                       ("ii->i", [(4, 4)]), ("i,i", [(6,), (6,)])])
def test_einsum_dtypes(dtype, eq, shapes):
    check_einsum(eq, [rand(s, dtype) for s in shapes])


@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.uint32, np.uint64])
def test_einsum_other_ints(dtype):
    # ORT's CPU EP has no kernel for these: numpy reference (wrapping like numpy)
    arrays = [rand((2, 3), dtype, 0, 9), rand((3, 4), dtype, 0, 9)]
    check_einsum("ij,jk->ik", arrays, numpy_ref=True)


@pytest.mark.parametrize("eq,shapes", [("ij,jk->ik", [(2, 3), (4, 5)]),   # dims differ
                                       ("ii->i", [(2, 3)]),              # non-square diagonal
                                       ("ij->i", [(2, 3, 4)])])          # rank mismatch
def test_einsum_invalid_fails(eq, shapes):
    inputs, m = einsum_model(eq, [rand(s, np.float32) for s in shapes])
    with pytest.raises(Exception):
        run_mlx(m, inputs)


# ---- Det --------------------------------------------------------------------------------------

@pytest.mark.parametrize("shape", [(3, 3), (1, 1), (2, 4, 4), (2, 3, 2, 2), (0, 3, 3)])
@pytest.mark.parametrize("opset", [11, 22])
def test_det(shape, opset):
    x = rand(shape, np.float32)
    check_model(make_node_model("Det", {"x": x}, 1, {}, None, opset), {"x": x})


def test_det_singular_and_float16():
    x = np.array([[1.0, 2.0], [2.0, 4.0]], np.float32)
    check_model(make_node_model("Det", {"x": x}, 1, {}, None, 22), {"x": x})
    x = rand((2, 3, 3), np.float16)
    check_model(make_node_model("Det", {"x": x}, 1, {}, None, 22), {"x": x})


def test_det_float64():
    x = rand((2, 5, 5), np.float64)
    check_model(make_node_model("Det", {"x": x}, 1, {}, None, 22), {"x": x},
                expected=[np.linalg.det(x)])


def test_det_float64_is_float64_accurate():
    # MLX's linalg::det is float32-accurate in float64 (relative errors to ~5e-7 on random 5x5
    # matrices); the EP takes the determinant from MLX's float64 LU instead. 256 matrices from a
    # fixed seed, with the 0x0 and 1x1 cases, against numpy at 1e-12.
    if oracle.DEVICE == "gpu":
        pytest.skip("Det is declined on the GPU (MLX's LU is CPU-only)")
    x = np.random.default_rng(11).uniform(-1, 1, (256, 5, 5))
    for a in (x, np.zeros((3, 0, 0)), x[:4, :1, :1]):
        want = np.linalg.det(a) if a.shape[-1] else np.ones(a.shape[:-2])
        got = check_model(make_node_model("Det", {"x": a}, 1, {}, None, 22), {"x": a}, expected=[want])
        np.testing.assert_allclose(got[0], want, rtol=1e-12, atol=0)


def test_det_bfloat16():
    check_f32_ref("Det", {"x": rand((2, 3, 3), np.float32).astype(BF16)}, {}, opset=22)
