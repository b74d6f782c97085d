"""Shape/layout ops and generators (src/ops/onnx/shape.cc, shape_gen.cc) against ORT's CPU EP.

Parameters such as Reshape's shape or Pad's pads are tested both as constant initializers and
as run-time graph inputs: both must run on MLX."""
import numpy as np
import pytest
from onnx import helper, TensorProto

from oracle import DEVICE, check_node, check_model, make_node_model, placement_of
import onnxruntime_mlx as om
from onnxruntime_mlx import runner

rng = np.random.default_rng(1)
I64 = np.int64

DTYPES = [np.float32, np.float16, np.float64, np.int8, np.int32, np.int64, np.uint8, np.uint64,
          np.bool_]


def rand(shape, dtype=np.float32):
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return np.asarray(rng.random(shape) > 0.5)
    if dtype.kind in "iu":
        lo = 0 if dtype.kind == "u" else -50
        return np.asarray(rng.integers(lo, 50, size=shape), dtype)
    return np.asarray(rng.uniform(-3, 3, size=shape), dtype)


def params(runtime, **kw):
    """Parameter tensors as graph inputs (runtime) or initializers."""
    return ({"inputs": kw} if runtime else {"initializers": kw})


def check_param(op, x, runtime, attrs=None, opset=21, **param_arrays):
    """check_node with `x` as data input and the keyword arrays as parameters, in order."""
    order = ["x"] + list(param_arrays)
    if runtime:
        return check_node(op, {"x": x, **param_arrays}, attrs, opset=opset, input_order=order)
    return check_node(op, {"x": x}, attrs, initializers=param_arrays, opset=opset,
                      input_order=order)


# ---- Reshape ---------------------------------------------------------------------------------

@pytest.mark.parametrize("runtime", [False, True])
@pytest.mark.parametrize("shape,target", [
    ((2, 3, 4), [4, 6]), ((2, 3, 4), [-1]), ((2, 3, 4), [0, -1]), ((2, 3, 4), [0, 0, 2, 2]),
    ((2, 3, 4), [-1, 0, 1]), ((6,), [1, 2, 1, 3]), ((), [1, 1]), ((1,), []), ((0, 3), [5, 0, -1]),
    ((0, 3), [0, 5, 7]), ((2, 0, 3), [-1, 3])])
def test_reshape(shape, target, runtime):
    check_param("Reshape", rand(shape), runtime, shape=np.array(target, I64))


def test_reshape_allowzero():
    x = rand((0, 3, 4))
    check_param("Reshape", x, False, {"allowzero": 1}, shape=np.array([3, 4, 0], I64))
    check_param("Reshape", rand((2, 3)), True, {"allowzero": 1}, shape=np.array([3, 2], I64))


@pytest.mark.parametrize("dtype", DTYPES)
def test_reshape_dtypes(dtype):
    check_param("Reshape", rand((2, 6), dtype), False, shape=np.array([3, -1], I64))


def test_reshape_bad_shape_fails():
    m = make_node_model("Reshape", {"x": rand((2, 3)), "s": np.array([4, 2], I64)})
    with pytest.raises(Exception):
        check_model(m, {"x": rand((2, 3)), "s": np.array([4, 2], I64)}, expected=[None])


# ---- Transpose, Concat, Split ----------------------------------------------------------------

@pytest.mark.parametrize("perm", [None, [0, 1, 2], [2, 0, 1], [1, 2, 0], [2, 1, 0]])
@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.bool_])
def test_transpose(perm, dtype):
    check_node("Transpose", {"x": rand((2, 3, 4), dtype)}, None if perm is None else {"perm": perm})


def test_transpose_edge():
    check_node("Transpose", {"x": rand(())})
    check_node("Transpose", {"x": rand((0, 3))}, {"perm": [1, 0]})


@pytest.mark.parametrize("axis", [0, 1, 2, -1, -3])
def test_concat(axis):
    shapes = [[2, 3, 4]] * 3
    for i, s in enumerate(shapes):
        s = list(s)
        s[axis] = i + 1
        shapes[i] = s
    check_node("Concat", {f"x{i}": rand(s) for i, s in enumerate(shapes)}, {"axis": axis})


def test_concat_mixed():
    check_node("Concat", {"a": rand((2, 0), np.int64), "b": rand((2, 3), np.int64)}, {"axis": 1})
    check_node("Concat", {"a": rand((2,), np.bool_)}, {"axis": 0})
    check_node("Concat", {"a": rand((2, 2))}, {"axis": 0}, initializers={"b": rand((1, 2))})


def _empty_operand_runs(model, feeds, report):
    """Runs `model` twice on the EP with a report; returns its outputs and the fused node's
    empty_operand_runs (eager runs whose MLX graph touched a zero-size array)."""
    import gc
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    s = ort.InferenceSession(model.SerializeToString(),
                             sess_options=om.session_options(DEVICE, so=so, report_path=str(report)))
    outs = [s.run(None, feeds) for _ in range(2)][-1]
    del s
    gc.collect()  # the statistics line is written when the session goes
    stats = runner.read_fused_node_stats(report)
    assert len(stats) == 1, stats
    return outs, stats[0]["empty_operand_runs"]


def test_concat_leaves_out_empty_operands(tmp_path):
    """Inputs empty along the axis add nothing to a Concat, and the EP leaves them out of the MLX
    graph: on the GPU a graph that touches a zero-size array runs on the CPU stream (an LLM's
    first prompt appends to an empty KV cache). All inputs empty still gives the empty result,
    and the statistic shows that graph's zero-size arrays."""
    feeds = {"a": rand((2, 0, 4)), "b": rand((2, 3, 4)), "c": rand((2, 0, 4)), "d": rand((2, 2, 4))}
    model = make_node_model("Concat", feeds, attrs={"axis": 1})
    check_node("Concat", feeds, {"axis": 1})
    outs, empty_runs = _empty_operand_runs(model, feeds, tmp_path / "some_empty.jsonl")
    np.testing.assert_array_equal(outs[0], np.concatenate(list(feeds.values()), 1))
    assert empty_runs == 0
    feeds = {"a": rand((2, 0)), "b": rand((2, 0))}
    outs, empty_runs = _empty_operand_runs(make_node_model("Concat", feeds, attrs={"axis": 1}), feeds,
                                           tmp_path / "all_empty.jsonl")
    assert outs[0].shape == (2, 0) and empty_runs >= 1


@pytest.mark.parametrize("runtime", [False, True])
@pytest.mark.parametrize("split,axis,n", [([2, 3, 1], 1, 3), ([6], 1, 1), ([0, 3], -1, 2),
                                          ([1, 1], 0, 2)])
def test_split_sizes(split, axis, n, runtime):
    x = rand((2, 6, 3))
    order = ["x", "split"]
    kw = dict(attrs={"axis": axis}, outputs=n, input_order=order)
    if runtime:
        check_node("Split", {"x": x, "split": np.array(split, I64)}, **kw)
    else:
        check_node("Split", {"x": x}, initializers={"split": np.array(split, I64)}, **kw)


@pytest.mark.parametrize("opset", [11, 13, 18])
def test_split_equal(opset):
    attrs = {"axis": 1}
    if opset >= 18:
        attrs["num_outputs"] = 3
    check_node("Split", {"x": rand((2, 6), np.int32)}, attrs, outputs=3, opset=opset)


def test_split_attr_and_uneven():
    check_node("Split", {"x": rand((2, 6)), "s": np.zeros(0, I64)}, {"axis": 1}, outputs=2)
    check_node("Split", {"x": rand((7, 2))}, {"split": [3, 4]}, outputs=2, opset=11)
    check_node("Split", {"x": rand((7, 2))}, {"num_outputs": 3}, outputs=3, opset=18)
    check_node("Split", {"x": rand((5,))}, {"num_outputs": 2}, outputs=2, opset=18)


# ---- Unsqueeze, Squeeze, Flatten -------------------------------------------------------------

@pytest.mark.parametrize("runtime", [False, True])
@pytest.mark.parametrize("shape,axes", [((3, 4), [0]), ((3, 4), [2]), ((3, 4), [-1]),
                                        ((3, 4), [0, 3]), ((3, 4), [4, 0, -3]), ((), [0]),
                                        ((0, 2), [1])])
def test_unsqueeze(shape, axes, runtime):
    check_param("Unsqueeze", rand(shape), runtime, axes=np.array(axes, I64))


def test_unsqueeze_attr():
    check_node("Unsqueeze", {"x": rand((3, 4))}, {"axes": [0, -1]}, opset=11)


@pytest.mark.parametrize("runtime", [False, True])
@pytest.mark.parametrize("shape,axes", [((1, 3, 1, 4), [0]), ((1, 3, 1, 4), [-2, 0]),
                                        ((1,), [0]), ((3, 1), [1])])
def test_squeeze(shape, axes, runtime):
    check_param("Squeeze", rand(shape), runtime, axes=np.array(axes, I64))


def test_squeeze_all_and_attr():
    # an empty axes tensor squeezes every 1 (what ORT does)
    check_param("Squeeze", rand((1, 3, 1)), True, axes=np.zeros(0, I64))
    check_node("Squeeze", {"x": rand((1, 3, 1, 4))})
    check_node("Squeeze", {"x": rand((1, 1))})
    check_node("Squeeze", {"x": rand((1, 0, 1))})
    check_node("Squeeze", {"x": rand((1, 3, 1))}, {"axes": [-1]}, opset=11)


@pytest.mark.parametrize("axis", [0, 1, 2, 3, -1, -3])
def test_flatten(axis):
    check_node("Flatten", {"x": rand((2, 3, 4))}, {"axis": axis})


def test_flatten_edge():
    check_node("Flatten", {"x": rand((2, 0, 4), np.int64)}, {"axis": 2})
    check_node("Flatten", {"x": rand((5,))})


# ---- Expand, Tile ----------------------------------------------------------------------------

@pytest.mark.parametrize("runtime", [False, True])
@pytest.mark.parametrize("shape,target", [((3, 1), [2, 3, 4]), ((3, 1), [1]), ((3, 1), [3, 1]),
                                          ((1, 4), [5, 1, 1]), ((), [2, 2]), ((2, 1), [2, 0]),
                                          ((4,), [3, 1])])
def test_expand(shape, target, runtime):
    check_param("Expand", rand(shape), runtime, shape=np.array(target, I64))


@pytest.mark.parametrize("dtype", [np.bool_, np.int8, np.float16])
def test_expand_dtypes(dtype):
    check_param("Expand", rand((3, 1), dtype), False, shape=np.array([2, 1, 4], I64))


@pytest.mark.parametrize("runtime", [False, True])
@pytest.mark.parametrize("shape,reps", [((2, 3), [1, 1]), ((2, 3), [2, 3]), ((2, 3), [0, 2]),
                                        ((3,), [4]), ((2, 1, 3), [1, 5, 1])])
def test_tile(shape, reps, runtime):
    check_param("Tile", rand(shape, np.int32), runtime, repeats=np.array(reps, I64))


# ---- Pad, CenterCropPad ----------------------------------------------------------------------

PADS = [[0, 0, 0, 0], [1, 2, 3, 0], [0, 1, 2, 1], [-1, 0, 1, -2], [2, 2, 2, 2]]


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge", "wrap"])
@pytest.mark.parametrize("pads", PADS)
@pytest.mark.parametrize("runtime", [False, True])
def test_pad_modes(mode, pads, runtime):
    x = rand((4, 5))
    check_param("Pad", x, runtime, {"mode": mode}, pads=np.array(pads, I64))


@pytest.mark.parametrize("runtime", [False, True])
@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.float16, np.bool_, np.int64])
def test_pad_constant_value(dtype, runtime):
    x = rand((2, 3, 4), dtype)
    cv = np.array(True if dtype == np.bool_ else 7, dtype)
    check_param("Pad", x, runtime, pads=np.array([0, 1, 2, 1, 0, 1], I64), value=cv)


@pytest.mark.parametrize("runtime", [False, True])
@pytest.mark.parametrize("axes,pads", [([1], [2, 1]), ([-1, 0], [1, -1, 0, 2]), ([], [])])
def test_pad_axes(axes, pads, runtime):
    x = rand((3, 4, 5))
    if runtime:
        check_node("Pad", {"x": x, "pads": np.array(pads, I64), "axes": np.array(axes, I64)},
                   input_order=["x", "pads", "cv", "axes"])
    else:
        check_node("Pad", {"x": x}, initializers={"pads": np.array(pads, I64), "cv": None,
                                                 "axes": np.array(axes, I64)},
                   input_order=["x", "pads", "cv", "axes"])


def test_pad_attr_opsets():
    x = rand((3, 4))
    check_node("Pad", {"x": x}, {"pads": [1, 0, 0, 2], "value": 1.5}, opset=2)
    check_node("Pad", {"x": x}, {"pads": [1, 1, 0, 2], "mode": "reflect"}, opset=2)
    check_node("Pad", {"x": x}, {"pads": [0, 1, 2, 0], "mode": "edge"}, opset=10)


def test_pad_4d_edge_and_empty():
    check_param("Pad", rand((1, 2, 3, 3)), False, {"mode": "edge"},
                pads=np.array([0, 0, 1, 1, 0, 0, 1, 1], I64))
    check_param("Pad", rand((0, 3)), False, pads=np.array([1, 0, 1, 0], I64))


@pytest.mark.parametrize("runtime", [False, True])
@pytest.mark.parametrize("shape,target,axes", [((5, 6), [3, 8], None), ((5, 6), [5, 6], None),
                                               ((4, 7, 3), [2, 10], [0, 1]),
                                               ((4, 7, 3), [6, 2], [-1, 0])])
def test_center_crop_pad(shape, target, axes, runtime):
    attrs = {"axes": axes} if axes else None
    check_param("CenterCropPad", rand(shape), runtime, attrs, opset=18,
                shape=np.array(target, I64))


# ---- Identity, Dropout, DepthToSpace, SpaceToDepth, Trilu ------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
def test_identity(dtype):
    check_node("Identity", {"x": rand((2, 3), dtype)})


def test_identity_scalar_empty():
    check_node("Identity", {"x": rand(())})
    check_node("Identity", {"x": rand((0, 4))})


@pytest.mark.parametrize("opset", [7, 10, 12, 13, 22])
def test_dropout(opset):
    check_node("Dropout", {"x": rand((3, 4))}, outputs=2 if opset >= 10 else 1, opset=opset)


def test_dropout_ratio_training_false():
    check_node("Dropout", {"x": rand((3, 4))}, initializers={
        "ratio": np.array(0.3, np.float32), "training_mode": np.array(False)}, outputs=2)
    check_node("Dropout", {"x": rand((3, 4)), "ratio": np.array(0.5, np.float32),
                           "training_mode": np.array(False)}, outputs=2)


def test_dropout_training_declined():
    m = make_node_model("Dropout", {"x": rand((3, 4))}, outputs=1,
                        initializers={"r": np.array(0.5, np.float32), "t": np.array(True)})
    placed = placement_of(m, {"x": rand((3, 4))})
    assert om.EP_NAME not in placed


@pytest.mark.parametrize("mode", ["DCR", "CRD"])
def test_depth_to_space(mode):
    check_node("DepthToSpace", {"x": rand((2, 8, 3, 4))}, {"blocksize": 2, "mode": mode})
    check_node("DepthToSpace", {"x": rand((1, 9, 2, 2), np.uint8)}, {"blocksize": 3, "mode": mode})


def test_space_to_depth():
    check_node("SpaceToDepth", {"x": rand((2, 3, 4, 6))}, {"blocksize": 2})
    check_node("SpaceToDepth", {"x": rand((1, 2, 3, 3), np.float16)}, {"blocksize": 3})


@pytest.mark.parametrize("upper", [0, 1])
@pytest.mark.parametrize("k", [None, 0, 1, -1, 3, -4, 100, -100])
@pytest.mark.parametrize("runtime", [False, True])
def test_trilu(upper, k, runtime):
    x = rand((2, 3, 4), np.int32 if k == 1 else np.float32)
    if k is None:
        check_node("Trilu", {"x": x}, {"upper": upper})
    else:
        check_param("Trilu", x, runtime, {"upper": upper}, k=np.array(k, I64))


def test_trilu_bool_and_empty():
    check_node("Trilu", {"x": rand((4, 4), np.bool_)})
    check_node("Trilu", {"x": rand((0, 3))}, {"upper": 0})


# ---- Shape, Size -----------------------------------------------------------------------------

def check_dynamic(op, inputs, attrs=None, opset=21):
    """check_node with symbolic input dims: with static shapes ORT folds Shape/Size away."""
    m = make_node_model(op, inputs, attrs=attrs, opset=opset)
    for vi in m.graph.input:
        for i, d in enumerate(vi.type.tensor_type.shape.dim):
            d.dim_param = f"{vi.name}_d{i}"
    del m.graph.value_info[:]
    return check_model(m, inputs)


@pytest.mark.parametrize("start,end", [(None, None), (1, None), (None, -1), (-2, None), (1, 2),
                                       (2, 1), (-10, 10), (0, 0)])
def test_shape(start, end):
    attrs = {k: v for k, v in (("start", start), ("end", end)) if v is not None}
    check_dynamic("Shape", {"x": rand((2, 3, 4, 5))}, attrs)


def test_shape_empty_and_size():
    # (a scalar's Shape/Size is always folded by ORT: its shape is static)
    check_dynamic("Shape", {"x": rand((0, 3), np.bool_)}, opset=13)
    for shape in [(1,), (0, 3), (2, 3, 4)]:
        check_dynamic("Size", {"x": rand(shape, np.int8)})


def test_shape_reshape_chain():
    # Shape -> Reshape: the shape read is shape-only, so the program compiles.
    g = helper.make_graph(
        [helper.make_node("Shape", ["y"], ["s"]),
         helper.make_node("Reshape", ["x", "s"], ["out"])],
        "chain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n"]),
         helper.make_tensor_value_info("y", TensorProto.FLOAT, ["a", "b", "c"])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])
    m.ir_version = 10
    check_model(m, {"x": rand((24,)), "y": rand((2, 3, 4))})
    check_model(m, {"x": rand((6,)), "y": rand((3, 2, 1))})


# ---- Cast, CastLike --------------------------------------------------------------------------

CAST_TYPES = {
    np.float32: TensorProto.FLOAT, np.float16: TensorProto.FLOAT16, np.float64: TensorProto.DOUBLE,
    np.int8: TensorProto.INT8, np.int16: TensorProto.INT16, np.int32: TensorProto.INT32,
    np.int64: TensorProto.INT64, np.uint8: TensorProto.UINT8, np.uint16: TensorProto.UINT16,
    np.uint32: TensorProto.UINT32, np.uint64: TensorProto.UINT64, np.bool_: TensorProto.BOOL,
}


def cast_source(src, dst):
    """Values that are representable in `dst` (out-of-range casts are undefined in ONNX)."""
    if np.dtype(src) == np.bool_:
        return rand((3, 5), np.bool_)
    x = rng.uniform(0 if np.dtype(dst).kind in "ub" else -100, 100, size=(3, 5))
    if np.dtype(dst).kind == "b":
        x[0, :2] = 0
    if np.dtype(src).kind in "iu":
        x = np.round(x)
    if np.dtype(dst) == np.int8 or np.dtype(src) == np.int8:
        x = np.clip(x, -100, 100)
    return x.astype(src)


@pytest.mark.parametrize("src", list(CAST_TYPES))
@pytest.mark.parametrize("dst", list(CAST_TYPES))
def test_cast(src, dst):
    check_node("Cast", {"x": cast_source(src, dst)}, {"to": CAST_TYPES[dst]})


def test_cast_truncation_and_nan():
    x = np.array([-2.7, -0.5, 0.5, 2.7, 1e3, -1e3], np.float32)
    check_node("Cast", {"x": x}, {"to": TensorProto.INT32})
    check_node("Cast", {"x": x}, {"to": TensorProto.INT64})
    check_node("Cast", {"x": x}, {"to": TensorProto.INT16})
    y = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-30], np.float32)
    check_node("Cast", {"x": y}, {"to": TensorProto.BOOL})
    check_node("Cast", {"x": y}, {"to": TensorProto.FLOAT16})
    check_node("Cast", {"x": y}, {"to": TensorProto.DOUBLE})
    check_node("Cast", {"x": np.array([70000.0, 65504.0, 1e-8], np.float32)},
               {"to": TensorProto.FLOAT16})


def test_cast_saturate_attr_and_old_opsets():
    check_node("Cast", {"x": rand((2, 3))}, {"to": TensorProto.FLOAT16}, opset=19)
    check_node("Cast", {"x": rand((2, 3))}, {"to": TensorProto.INT32}, opset=6)
    check_node("Cast", {"x": rand((0, 3))}, {"to": TensorProto.INT32})
    check_node("Cast", {"x": rand(())}, {"to": TensorProto.DOUBLE})


def test_cast_float8e8m0_placement():
    # float8e8m0 is held as its byte codes (values: test_lowp.py); a round_mode ONNX does not
    # define is declined at claim time (ORT's placement, without running).
    import onnxruntime as ort
    for mode, on_mlx in (("nearest", True), ("sideways", False)):
        m = make_node_model("Cast", {"x": rand((2, 3))},
                            attrs={"to": TensorProto.FLOAT8E8M0, "round_mode": mode}, opset=24)
        so = om.record_assignment(om.session_options("cpu", fallback=True))
        try:
            sess = ort.InferenceSession(m.SerializeToString(), sess_options=so)
        except Exception as e:  # ORT's own CPU kernel may refuse the attribute: not on MLX either
            assert not on_mlx, e
            continue
        assert (om.EP_NAME in om.placement(sess)) == on_mlx, (mode, om.placement(sess))


@pytest.mark.parametrize("dst", [np.float16, np.int32, np.bool_, np.float64])
def test_cast_like(dst):
    check_node("CastLike", {"x": rand((3, 4)), "t": rand((1,), dst)})
    check_node("CastLike", {"x": rand((3, 4))}, initializers={"t": rand((), dst)})


# ---- ConstantOfShape, Constant, Range, EyeLike -----------------------------------------------

@pytest.mark.parametrize("runtime", [False, True])
@pytest.mark.parametrize("shape", [[2, 3], [], [0], [4, 0, 2]])
@pytest.mark.parametrize("value", [None, np.array([2.5], np.float32), np.array([7], np.int64),
                                   np.array([True]), np.array([-3], np.int8),
                                   np.array([1.5], np.float16)])
def test_constant_of_shape(shape, value, runtime):
    from onnx import numpy_helper
    attrs = None if value is None else {"value": numpy_helper.from_array(value, "v")}
    s = np.array(shape, I64)
    if runtime:
        check_node("ConstantOfShape", {"s": s}, attrs)
    else:
        # ORT folds a ConstantOfShape of a constant shape itself; when it does not, MLX runs it.
        m = make_node_model("ConstantOfShape", {}, attrs=attrs, initializers={"s": s})
        check_model(m, {}, require_all_on_mlx=False)


def _constant_model(attrs, consume_dtype):
    from onnx import numpy_helper  # noqa: F401
    g = helper.make_graph(
        [helper.make_node("Constant", [], ["c"], **attrs),
         helper.make_node("Identity", ["c"], ["out"])],
        "const", [], [helper.make_tensor_value_info("out", consume_dtype, None)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])
    m.ir_version = 10
    return m


@pytest.mark.parametrize("attrs,dtype", [
    ({"value_float": 1.5}, TensorProto.FLOAT), ({"value_floats": [1.0, -2.0]}, TensorProto.FLOAT),
    ({"value_int": 7}, TensorProto.INT64), ({"value_ints": [3, 4, 5]}, TensorProto.INT64),
    ({"value": helper.make_tensor("t", TensorProto.INT32, [2, 2], [1, 2, 3, 4])},
     TensorProto.INT32),
    ({"value": helper.make_tensor("t", TensorProto.FLOAT16, [3], np.array(
        [1.5, -2, 0.25], np.float16).view(np.uint16).tolist())}, TensorProto.FLOAT16),
    ({"value": helper.make_tensor("t", TensorProto.BOOL, [2], [True, False])}, TensorProto.BOOL)])
def test_constant(attrs, dtype):
    # ORT may fold a Constant into an initializer; when it reaches the EP it must run on MLX.
    m = _constant_model(attrs, dtype)
    check_model(m, {}, require_all_on_mlx=False)


@pytest.mark.parametrize("runtime", [False, True])
@pytest.mark.parametrize("dtype,start,limit,delta", [
    (np.float32, 0, 10, 1), (np.float32, 1.5, 7.2, 0.7), (np.float32, 10, -3, -2.5),
    (np.float64, -1, 1, 0.1), (np.int32, 3, 9, 3), (np.int32, 10, 4, -2), (np.int64, 0, 1000, 7),
    (np.int16, -5, 5, 2), (np.int64, 5, 5, 1), (np.int64, 5, 0, 1), (np.float32, 0, 1, 2)])
def test_range(dtype, start, limit, delta, runtime):
    a = {"start": np.array(start, dtype), "limit": np.array(limit, dtype),
         "delta": np.array(delta, dtype)}
    if runtime:
        check_node("Range", a)
    else:
        check_node("Range", {"start": a["start"]}, initializers={"limit": a["limit"],
                                                                  "delta": a["delta"]})


@pytest.mark.parametrize("shape", [(3, 3), (2, 5), (5, 2), (0, 3)])
@pytest.mark.parametrize("k", [0, 1, -1, 4, -7])
def test_eye_like(shape, k):
    check_node("EyeLike", {"x": rand(shape)}, {"k": k})


def test_eye_like_dtype():
    check_node("EyeLike", {"x": rand((3, 4), np.int32)}, {"dtype": TensorProto.FLOAT})
    check_node("EyeLike", {"x": rand((3, 4))}, {"dtype": TensorProto.INT64, "k": 2})
    check_node("EyeLike", {"x": rand((3, 3), np.float64)}, {"dtype": TensorProto.UINT64})


def test_dynamic_shape_subgraph():
    # The exporter pattern Shape -> Gather -> Unsqueeze -> Concat -> Reshape, with symbolic dims:
    # all on MLX, re-run with a second input shape.
    from onnx import numpy_helper
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "i0"], ["b"], axis=0),
        helper.make_node("Unsqueeze", ["b", "ax0"], ["b1"]),
        helper.make_node("Concat", ["b1", "tail"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["y"]),
        helper.make_node("Transpose", ["y"], ["yt"], perm=[0, 2, 1, 3]),
        helper.make_node("Slice", ["yt", "st", "en", "ax1"], ["out"]),
    ]
    inits = [numpy_helper.from_array(np.array(0, I64), "i0"),
             numpy_helper.from_array(np.array([0], I64), "ax0"),
             numpy_helper.from_array(np.array([-1, 2, 4], I64), "tail"),
             numpy_helper.from_array(np.array([1], I64), "st"),
             numpy_helper.from_array(np.array([np.iinfo(np.int64).max], I64), "en"),
             numpy_helper.from_array(np.array([2], I64), "ax1")]
    g = helper.make_graph(nodes, "dyn",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", "S", 8])],
                          [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])
    m.ir_version = 10
    from oracle import assert_close, run_cpu, run_mlx
    for shape in [(2, 5, 8), (3, 1, 8)]:
        feeds = {"x": rand(shape)}
        # ORT's optimizers may rewrite part of the chain; whatever is left must be on MLX.
        outs, placed = run_mlx(m, feeds, fallback=False)
        assert set(placed) == {om.EP_NAME}, placed
        assert_close(outs[0], run_cpu(m, feeds)[0])
