"""Indexing ops (src/ops/onnx/index.cc) against ORT's CPU EP: gathers, scatters, Slice, OneHot,
Compress, NonZero, ReverseSequence. Index/parameter tensors are tested both as constant
initializers and as run-time graph inputs."""
import numpy as np
import pytest

import oracle
from oracle import check_node, make_node_model, placement_of

rng = np.random.default_rng(2)


def om_ep():
    import onnxruntime_mlx as om
    return om.EP_NAME
I64 = np.int64


def rand(shape, dtype=np.float32):
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return np.asarray(rng.random(shape) > 0.5)
    if dtype.kind in "iu":
        return np.asarray(rng.integers(0 if dtype.kind == "u" else -50, 50, size=shape), dtype)
    return np.asarray(rng.uniform(-3, 3, size=shape), dtype)


def check(op, data, params, runtime, attrs=None, opset=21, outputs=1):
    """`data` inputs are always graph inputs; `params` are inputs or initializers."""
    order = list(data) + list(params)
    x = next(iter(data.values()))
    if oracle.DEVICE == "gpu" and op.startswith("Scatter") and x.dtype in (np.int64, np.uint64):
        # MLX's GPU scatter has no 64-bit data: declined at claim time, run by ORT's CPU EP.
        m = make_node_model(op, data, outputs, attrs, params, opset, input_order=order)
        assert om_ep() not in placement_of(m, data), f"{op} on 64-bit data not declined on the GPU"
        return None
    if runtime:
        return check_node(op, {**data, **params}, attrs, opset=opset, input_order=order,
                          outputs=outputs)
    return check_node(op, data, attrs, initializers=params, opset=opset, input_order=order,
                      outputs=outputs)


# ---- Gather ----------------------------------------------------------------------------------

@pytest.mark.parametrize("runtime", [False, True])
@pytest.mark.parametrize("shape,axis,idx", [
    ((5, 4), 0, [0, 4, -1, -5]), ((5, 4), 1, [[0, 1], [-1, 3]]), ((5, 4), -1, 2),
    ((2, 3, 4), 1, [[[2]], [[-3]]]), ((5,), 0, []), ((0, 3), 1, [0, 2]), ((3,), 0, -1)])
@pytest.mark.parametrize("itype", [np.int64, np.int32])
def test_gather(shape, axis, idx, itype, runtime):
    check("Gather", {"x": rand(shape)}, {"i": np.array(idx, itype)}, runtime, {"axis": axis})


@pytest.mark.parametrize("dtype", [np.float16, np.float64, np.int8, np.uint64, np.bool_, np.int64])
def test_gather_dtypes(dtype):
    check("Gather", {"x": rand((4, 3), dtype)}, {"i": np.array([3, 0, -2], I64)}, False,
          {"axis": 0})


def test_gather_opset1():
    check("Gather", {"x": rand((4, 3))}, {"i": np.array([2, 0], I64)}, True, {"axis": 1}, opset=1)


@pytest.mark.parametrize("runtime", [False, True])
@pytest.mark.parametrize("shape,ishape,axis", [((3, 4), (3, 4), 0), ((3, 4), (2, 4), 1),
                                               ((3, 4), (5, 2), 0), ((2, 3, 4), (2, 3, 1), -1),
                                               ((3, 4), (0, 4), 0), ((3,), (6,), 0)])
def test_gather_elements(shape, ishape, axis, runtime):
    n = shape[axis]
    idx = rng.integers(-n, n, size=ishape).astype(I64)
    check("GatherElements", {"x": rand(shape, np.int32)}, {"i": idx}, runtime, {"axis": axis})


@pytest.mark.parametrize("runtime", [False, True])
@pytest.mark.parametrize("dshape,idx,b", [
    ((2, 2), [[0, 0], [1, 1]], 0), ((2, 2), [[1], [0]], 0), ((2, 2, 2), [[0, 1], [1, 0]], 0),
    ((2, 2, 2), [[[0, 1]], [[1, 0]]], 0), ((2, 2, 2), [[1], [0]], 1),
    ((3, 4, 5), [[[1, -1], [0, 2]], [[2, 3], [-3, 0]], [[0, 0], [1, 4]]], 1),
    ((2, 3, 4, 5), [[[1], [0]], [[2], [1]]], 1), ((2, 3, 4), [[[1], [3], [0]], [[0], [2], [-1]]], 2),
    ((4, 3), np.zeros((0, 1), I64), 0)])
def test_gather_nd(dshape, idx, b, runtime):
    check("GatherND", {"x": rand(dshape)}, {"i": np.array(idx, I64)}, runtime, {"batch_dims": b})


# ---- Scatter ---------------------------------------------------------------------------------

def unique_indices(n, shape, axis):
    """Indices along `axis` without duplicates per line (reduction=none needs that)."""
    idx = np.argsort(rng.random(shape[:axis] + (n,) + shape[axis + 1:]), axis=axis)
    idx = np.take(idx, np.arange(shape[axis]), axis=axis)
    return (idx - n * (rng.random(idx.shape) < 0.3)).astype(I64)  # some negative


@pytest.mark.parametrize("runtime", [False, True])
@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
@pytest.mark.parametrize("dshape,ishape,axis", [((4, 5), (2, 5), 0), ((4, 5), (3, 2), 1),
                                                ((3, 4, 2), (3, 2, 2), -2), ((4,), (4,), 0)])
def test_scatter_elements(reduction, dshape, ishape, axis, runtime):
    ax = axis % len(dshape)
    if reduction == "none":
        idx = unique_indices(dshape[ax], ishape, ax)
    else:
        idx = rng.integers(-dshape[ax], dshape[ax], size=ishape).astype(I64)
    x = rand(dshape)
    upd = rand(ishape)
    check("ScatterElements", {"x": x}, {"i": idx, "u": upd}, runtime,
          {"axis": axis, "reduction": reduction})


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.float16, np.float64])
def test_scatter_elements_dtypes(dtype):
    idx = np.array([[1, 0, 2], [0, 2, 1]], I64)
    check("ScatterElements", {"x": rand((3, 3), dtype)}, {"i": idx, "u": rand((2, 3), dtype)},
          False, {"axis": 0}, opset=13)
    if dtype != np.float16:  # ORT's CPU EP has no fp16 scatter reductions
        check("ScatterElements", {"x": rand((3, 3), dtype)}, {"i": idx, "u": rand((2, 3), dtype)},
              True, {"axis": 1, "reduction": "add"}, opset=16)


def test_scatter_elements_empty_and_old():
    check("ScatterElements", {"x": rand((3, 3))},
          {"i": np.zeros((0, 3), I64), "u": np.zeros((0, 3), np.float32)}, False)
    check("Scatter", {"x": rand((3, 3))},
          {"i": np.array([[2, 0, 1]], I64), "u": rand((1, 3))}, True, {"axis": 0}, opset=9)
    check("ScatterElements", {"x": rand((3, 3), np.bool_)},
          {"i": np.array([[2, 0, 1]], np.int32), "u": rand((1, 3), np.bool_)}, False, {"axis": 0})


@pytest.mark.parametrize("runtime", [False, True])
@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
@pytest.mark.parametrize("dshape,idx", [
    ((8,), [[4], [3], [1], [7]]), ((4, 4, 4), [[0], [2]]), ((4, 4, 4), [[0, 1], [2, -1]]),
    ((4, 4, 4), [[[0, 1, 2], [3, 3, 3]]]), ((3, 5), [[[2, 4]], [[-3, 0]]])])
def test_scatter_nd(reduction, dshape, idx, runtime):
    idx = np.array(idx, I64)
    k = idx.shape[-1]
    upd = rand(idx.shape[:-1] + dshape[k:])
    check("ScatterND", {"x": rand(dshape)}, {"i": idx, "u": upd}, runtime,
          {"reduction": reduction})


def test_scatter_nd_int_and_empty():
    check("ScatterND", {"x": rand((4, 3), np.int64)},
          {"i": np.array([[1], [3]], I64), "u": rand((2, 3), np.int64)}, False, opset=13)
    check("ScatterND", {"x": rand((4, 3))},
          {"i": np.zeros((0, 1), I64), "u": np.zeros((0, 3), np.float32)}, False)


# ---- Slice -----------------------------------------------------------------------------------

BIG = np.iinfo(np.int64).max
SLICES = [  # starts, ends, axes, steps
    ([0, 1], [3, 3], None, None), ([1], [-1], [1], None), ([-3], [BIG], [0], None),
    ([0, 0], [BIG, BIG], [0, 1], [2, 3]), ([BIG], [-BIG - 1], [1], [-1]), ([-1], [-BIG - 1], [0], [-2]),
    ([4, 3], [0, 1], [0, 1], [-1, -1]), ([10], [20], [0], None), ([-10], [2], [1], None),
    ([2], [2], [0], None), ([3], [1], [0], None), ([1, 0], [3, 5], [-1, -2], [2, 1]),
    ([5], [-10], [1], [-3]), ([0], [1], [0], [100]), ([-1], [-2], [-1], [1])]


@pytest.mark.parametrize("runtime", [False, True])
@pytest.mark.parametrize("starts,ends,axes,steps", SLICES)
@pytest.mark.parametrize("itype", [np.int64, np.int32])
def test_slice(starts, ends, axes, steps, itype, runtime):
    if itype == np.int32:
        clip = lambda v: [int(np.clip(e, -2**31, 2**31 - 1)) for e in v]  # noqa: E731
        starts, ends = clip(starts), clip(ends)
    x = rand((5, 6, 3))
    p = {"starts": np.array(starts, itype), "ends": np.array(ends, itype)}
    if axes is not None:
        p["axes"] = np.array(axes, itype)
    if steps is not None:
        if axes is None:
            p["axes"] = np.arange(len(starts), dtype=itype)
        p["steps"] = np.array(steps, itype)
    check("Slice", {"x": x}, p, runtime)


@pytest.mark.parametrize("dtype", [np.bool_, np.int8, np.float16, np.uint64])
def test_slice_dtypes(dtype):
    check("Slice", {"x": rand((4, 5), dtype)},
          {"s": np.array([1, -1], I64), "e": np.array([4, 0], I64), "a": np.array([0, 1], I64),
           "st": np.array([2, -2], I64)}, False)


def test_slice_opset1_and_empty():
    check_node("Slice", {"x": rand((4, 5))}, {"starts": [1, -3], "ends": [100, -1], "axes": [0, 1]},
               opset=1)
    check_node("Slice", {"x": rand((4, 5))}, {"starts": [1], "ends": [3]}, opset=9)
    check("Slice", {"x": rand((0, 5))}, {"s": np.array([1], I64), "e": np.array([3], I64),
                                         "a": np.array([1], I64)}, True)


# ---- OneHot ----------------------------------------------------------------------------------

@pytest.mark.parametrize("runtime", [False, True])
@pytest.mark.parametrize("axis", [-1, 0, 1, -2])
@pytest.mark.parametrize("itype", [np.int64, np.int32, np.float32])  # ORT: depth has that type too
def test_one_hot(axis, itype, runtime):
    idx = np.array([[0, 3, -1], [9, -10, 2]], itype)  # 9 / -10 are out of range
    p = {"depth": np.array(4, itype), "values": np.array([0.5, 2.0], np.float32)}
    check("OneHot", {"i": idx}, p, runtime, {"axis": axis})


def test_one_hot_variants():
    idx = np.array([1, 0, 2], I64)
    check("OneHot", {"i": idx}, {"depth": np.array([3], I64),
                                 "values": np.array([0, 1], np.int64)}, True)
    check("OneHot", {"i": idx}, {"depth": np.array(5, np.int32),
                                 "values": np.array([3, 7], np.float32)}, False, opset=9)
    check("OneHot", {"i": idx}, {"depth": np.array(5, np.float32),
                                 "values": np.array([3, 7], np.int32)}, True)
    check("OneHot", {"i": idx.astype(np.float32)}, {"depth": np.array(5, I64),
                                                    "values": np.array([3, 7], I64)}, True)


# ---- Compress, NonZero -----------------------------------------------------------------------

@pytest.mark.parametrize("runtime", [False, True])
@pytest.mark.parametrize("axis,cond", [(None, [1, 0, 1, 1]), (0, [0, 1, 1]), (1, [1, 0]),
                                       (-1, [0, 0, 1, 0]), (1, [0, 0, 0]), (0, [1, 0, 1, 0, 0, 0]),
                                       (1, [1, 0, 0, 1, 0, 1])])  # past the end: ignored
def test_compress(axis, cond, runtime):
    x = rand((3, 4), np.int32) if axis != 0 or len(cond) <= 3 else rand((6, 2))
    attrs = None if axis is None else {"axis": axis}
    check("Compress", {"x": x}, {"c": np.array(cond, bool)}, runtime, attrs)


@pytest.mark.parametrize("shape", [(5,), (3, 4), (2, 3, 4), (0, 3), ()])
@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.bool_, np.uint8, np.float16])
def test_non_zero(shape, dtype):
    x = rand(shape, dtype)
    if dtype != np.bool_:
        x = np.asarray(x * (rng.random(shape) < 0.5), dtype)
    check_node("NonZero", {"x": x})


def test_non_zero_nan_and_large():
    x = np.array([0.0, np.nan, -0.0, 1.0], np.float32)
    check_node("NonZero", {"x": x})
    check_node("NonZero", {"x": (rng.random((70, 80)) < 0.1).astype(np.float32)})


# ---- ReverseSequence -------------------------------------------------------------------------

@pytest.mark.parametrize("runtime", [False, True])
@pytest.mark.parametrize("time_axis,batch_axis", [(0, 1), (1, 0)])
def test_reverse_sequence(time_axis, batch_axis, runtime):
    T, B = 5, 4
    shape = (T, B, 3) if time_axis == 0 else (B, T, 3)
    lens = np.array([1, 5, 3, 0], I64)
    check("ReverseSequence", {"x": rand(shape)}, {"lens": lens}, runtime,
          {"time_axis": time_axis, "batch_axis": batch_axis})
    check("ReverseSequence", {"x": rand(shape[:2], np.int64)}, {"lens": lens}, runtime,
          {"time_axis": time_axis, "batch_axis": batch_axis})


# ---- Unique ----------------------------------------------------------------------------------

@pytest.mark.parametrize("sorted_", [0, 1])
@pytest.mark.parametrize("axis", [None, 0, 1, -1])
@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.int8, np.float64])
def test_unique(sorted_, axis, dtype):
    x = np.asarray(rng.integers(-2, 3, size=(4, 3, 2)), dtype)
    x[2] = x[0]  # duplicate rows along axis 0
    attrs = {"sorted": sorted_}
    if axis is not None:
        attrs["axis"] = axis
    check_node("Unique", {"x": x}, attrs, outputs=4)


def test_unique_nan_groups():
    # ORT's CPU EP merges everything with a NaN; MLX keeps the numpy result (NaNs last, once).
    x = np.array([np.nan, 1, np.nan, 3, 1], np.float32)
    exp = [np.array([1, 3, np.nan], np.float32), np.array([1, 3, 0], I64),
           np.array([2, 0, 2, 1, 0], I64), np.array([2, 1, 2], I64)]
    check_node("Unique", {"x": x}, outputs=4, expected=exp)
