"""The less common numeric ops on the MLX EP against ORT's CPU EP: AffineGrid, Col2Im,
MaxUnpool, DeformConv, TensorScatter, NonMaxSuppression, ConvInteger, QLinearConv,
BatchNormalization in training mode, Dropout with a run-time training_mode, LabelEncoder,
RoiAlign (also against ONNX's reference for opset 22)."""
import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxruntime_mlx as om
from oracle import check_model, check_node, make_node_model, placement_of, run_cpu, run_mlx

rng = np.random.default_rng(0)
I64 = np.int64


def rand(shape, dtype=np.float32, lo=-1.0, hi=1.0):
    if np.issubdtype(dtype, np.integer):
        return rng.integers(int(lo), int(hi) + 1, size=shape).astype(dtype)
    return rng.uniform(lo, hi, size=shape).astype(dtype)


# ---- AffineGrid ------------------------------------------------------------------------------

@pytest.mark.parametrize("align", [0, 1])
@pytest.mark.parametrize("size", [(2, 3, 5, 7), (1, 1, 4, 4), (3, 2, 1, 6),
                                  (2, 1, 3, 4, 5), (1, 2, 2, 1, 3)])
def test_affine_grid(align, size):
    nd = len(size) - 2
    theta = rand((size[0], nd, nd + 1), lo=-2, hi=2)
    check_node("AffineGrid", {"theta": theta, "size": np.array(size, I64)},
               {"align_corners": align}, opset=20)


def test_affine_grid_float64_and_constant_size():
    theta = rand((2, 2, 3)).astype(np.float64)
    check_node("AffineGrid", {"theta": theta}, initializers={"size": np.array([2, 1, 6, 3], I64)},
               opset=20)


# ---- Col2Im ----------------------------------------------------------------------------------

def col2im_input(n, c, image, block, strides=None, dil=None, pads=None):
    nd = len(image)
    strides, dil, pads = strides or [1] * nd, dil or [1] * nd, pads or [0] * (2 * nd)
    L = 1
    for d in range(nd):
        padded = image[d] + pads[d] + pads[nd + d]
        L *= (padded - ((block[d] - 1) * dil[d] + 1)) // strides[d] + 1
    return rand((n, c * int(np.prod(block)), L))


@pytest.mark.parametrize("image,block,attrs", [
    ([5, 5], [1, 5], {}),
    ([5, 5], [2, 2], {}),
    ([6, 7], [2, 3], {"strides": [2, 1]}),
    ([5, 5], [2, 2], {"dilations": [2, 2]}),
    ([5, 5], [3, 3], {"pads": [1, 0, 1, 2]}),
    ([6, 5], [3, 2], {"pads": [1, 1, 1, 1], "strides": [2, 2], "dilations": [1, 2]}),
    ([3, 4, 5], [2, 2, 2], {}),
    ([4, 4, 4], [2, 1, 3], {"strides": [2, 1, 1], "pads": [0, 1, 0, 0, 1, 1]}),
])
def test_col2im(image, block, attrs):
    x = col2im_input(2, 3, image, block, attrs.get("strides"), attrs.get("dilations"),
                     attrs.get("pads"))
    check_node("Col2Im", {"x": x, "image_shape": np.array(image, I64),
                          "block_shape": np.array(block, I64)}, attrs, opset=18)


# ---- MaxUnpool -------------------------------------------------------------------------------

def max_pool(x, attrs):
    """Values and indices of a MaxPool on ORT's CPU EP (the inputs MaxUnpool inverts)."""
    m = make_node_model("MaxPool", {"x": x}, outputs=2, attrs=attrs, opset=12)
    return run_cpu(m, {"x": x})


@pytest.mark.parametrize("shape,attrs", [
    ((1, 2, 4, 4), {"kernel_shape": [2, 2], "strides": [2, 2]}),
    ((2, 3, 6, 4), {"kernel_shape": [3, 2], "strides": [3, 2]}),
    ((1, 1, 8), {"kernel_shape": [2], "strides": [2]}),
    ((1, 2, 4, 4, 4), {"kernel_shape": [2, 2, 2], "strides": [2, 2, 2]}),
])
@pytest.mark.parametrize("opset", [11, 22])
def test_max_unpool(shape, attrs, opset):
    x = rng.permutation(np.prod(shape)).reshape(shape).astype(np.float32)  # unique maxima
    y, ind = max_pool(x, attrs)
    check_node("MaxUnpool", {"x": y, "i": ind}, attrs, opset=opset)


def test_max_unpool_output_shape():
    x = rng.permutation(2 * 3 * 5 * 5).reshape(2, 3, 5, 5).astype(np.float32)
    attrs = {"kernel_shape": [2, 2], "strides": [2, 2]}
    y, ind = max_pool(x, attrs)
    # The default unpooled shape is 4x4; output_shape restores the pooled input's 5x5.
    check_node("MaxUnpool", {"x": y, "i": ind, "shape": np.array([2, 3, 5, 5], I64)}, attrs,
               opset=11)


# ---- DeformConv ------------------------------------------------------------------------------

@pytest.mark.parametrize("xs,ws,attrs,og,mask,bias", [
    ((1, 1, 3, 3), (1, 1, 2, 2), {}, 1, False, False),
    ((1, 1, 3, 3), (1, 1, 2, 2), {"pads": [1, 1, 1, 1]}, 1, False, False),
    ((2, 4, 6, 5), (6, 2, 3, 3), {"group": 2, "pads": [1, 1, 1, 1]}, 2, True, True),
    ((1, 4, 7, 7), (4, 4, 3, 3), {"strides": [2, 2], "dilations": [2, 1]}, 4, True, False),
    ((1, 3, 5, 6), (2, 3, 2, 3), {"strides": [1, 2], "pads": [0, 1, 2, 0]}, 1, False, True),
])
@pytest.mark.parametrize("opset", [19, 22])
def test_deform_conv(xs, ws, attrs, og, mask, bias, opset):
    kh, kw = ws[2:]
    st, dl = attrs.get("strides", [1, 1]), attrs.get("dilations", [1, 1])
    p = attrs.get("pads", [0, 0, 0, 0])
    oh = (xs[2] + p[0] + p[2] - (kh - 1) * dl[0] - 1) // st[0] + 1
    ow = (xs[3] + p[1] + p[3] - (kw - 1) * dl[1] - 1) // st[1] + 1
    inputs = {"x": rand(xs), "w": rand(ws),
              # offsets up to +-2.5 pixels: samples fall between pixels and off the image
              "offset": rand((xs[0], og * kh * kw * 2, oh, ow), lo=-2.5, hi=2.5),
              "b": rand((ws[0],)) if bias else None,
              "mask": rand((xs[0], og * kh * kw, oh, ow), lo=0, hi=1) if mask else None}
    check_node("DeformConv", inputs, {**attrs, "offset_group": og, "kernel_shape": [kh, kw]},
               opset=opset, input_order=["x", "w", "offset", "b", "mask"])


# ---- TensorScatter ---------------------------------------------------------------------------

def tensor_scatter_model(past, update, wi, attrs):
    inputs = {"past": past, "update": update}
    if wi is not None:
        inputs["wi"] = wi
    m = make_node_model("TensorScatter", inputs, attrs=attrs, opset=24)
    m.ir_version = 11
    return m, inputs


@pytest.mark.parametrize("mode", ["linear", "circular"])
@pytest.mark.parametrize("past_shape,upd_len,axis", [
    ((2, 3, 8, 4), 3, -2), ((3, 10, 5), 4, 1), ((2, 2, 6, 3), 1, 2), ((1, 4, 2, 5), 2, -1)])
def test_tensor_scatter(mode, past_shape, upd_len, axis):
    a = axis % len(past_shape)
    ushape = list(past_shape)
    ushape[a] = upd_len
    length = past_shape[a]
    if mode == "linear":
        wi = rng.integers(0, length - upd_len + 1, size=past_shape[0]).astype(I64)
    else:  # wraps around the end for some rows
        wi = rng.integers(0, length, size=past_shape[0]).astype(I64)
        wi[0] = length - 1
    m, inputs = tensor_scatter_model(rand(past_shape), rand(tuple(ushape)), wi,
                                     {"mode": mode, "axis": axis})
    check_model(m, inputs)


def test_tensor_scatter_no_indices_and_fp16():
    m, inputs = tensor_scatter_model(rand((2, 5, 3), np.float16), rand((2, 2, 3), np.float16),
                                     None, {"axis": 1})
    check_model(m, inputs)


# ---- NonMaxSuppression -----------------------------------------------------------------------

def nms_inputs(batches, classes, n, center=False, grid=False):
    if grid:  # overlapping boxes on a small grid: many IoU ties and suppressions
        xy = rng.integers(0, 4, size=(batches, n, 2)).astype(np.float32)
        wh = rng.integers(1, 4, size=(batches, n, 2)).astype(np.float32)
    else:
        xy = rand((batches, n, 2), lo=0, hi=10)
        wh = rand((batches, n, 2), lo=0.5, hi=4)
    if center:
        boxes = np.concatenate([xy, wh], -1)
    else:  # [y1, x1, y2, x2], corners sometimes flipped
        boxes = np.concatenate([xy[..., ::-1], xy[..., ::-1] + wh[..., ::-1]], -1)
        flip = rng.random((batches, n)) < 0.3
        boxes[flip] = boxes[flip][:, [2, 3, 0, 1]]
    scores = rand((batches, classes, n), lo=0, hi=1)
    if grid:
        scores = np.round(scores * 4) / 4  # equal scores: ties broken by the lower index
    return boxes.astype(np.float32), scores.astype(np.float32)


@pytest.mark.parametrize("center", [0, 1])
@pytest.mark.parametrize("grid", [False, True])
@pytest.mark.parametrize("params", [
    (3, 0.5, None), (10, 0.3, 0.4), (1, 0.0, None), (100, 1.0, 0.2), (2, 0.7, 0.95), (0, 0.5, None)])
def test_nms(center, grid, params):
    max_out, iou, thr = params
    boxes, scores = nms_inputs(2, 3, 12, center, grid)
    inputs = {"boxes": boxes, "scores": scores, "max": np.array([max_out], I64),
              "iou": np.array([iou], np.float32),
              "thr": None if thr is None else np.array([thr], np.float32)}
    check_node("NonMaxSuppression", inputs, {"center_point_box": center}, opset=11,
               input_order=["boxes", "scores", "max", "iou", "thr"])


def test_nms_defaults_and_opset10():
    boxes, scores = nms_inputs(1, 2, 6)
    check_node("NonMaxSuppression", {"boxes": boxes, "scores": scores}, opset=11)  # no output
    check_node("NonMaxSuppression", {"boxes": boxes, "scores": scores,
                                     "max": np.array([4], I64)}, opset=10)


# ---- ConvInteger / QLinearConv ---------------------------------------------------------------

INT_CONV_CASES = [
    ((1, 1, 3, 3), (1, 1, 2, 2), {}),
    ((2, 3, 7, 6), (4, 3, 3, 3), {"pads": [1, 1, 1, 1]}),
    ((1, 4, 9, 8), (6, 2, 3, 2), {"group": 2, "strides": [2, 1], "dilations": [1, 2]}),
    ((1, 3, 8, 8), (2, 3, 3, 3), {"auto_pad": "SAME_UPPER", "strides": [2, 2]}),
    ((2, 2, 11), (3, 2, 4), {"pads": [2, 1]}),
    ((1, 2, 4, 5, 4), (2, 2, 2, 3, 2), {}),
    # K = 64 * 9 = 576 products per sum: more than float32 holds exactly without chunking
    ((1, 64, 5, 5), (3, 64, 3, 3), {"pads": [1, 1, 1, 1]}),
]


@pytest.mark.parametrize("xs,ws,attrs", INT_CONV_CASES)
@pytest.mark.parametrize("wtype", [np.uint8, np.int8])
def test_conv_integer(xs, ws, attrs, wtype):
    lo, hi = (0, 255) if wtype == np.uint8 else (-128, 127)
    # ORT's kernel takes per-tensor zero points only (a scalar or a 1-element vector)
    inputs = {"x": rand(xs, np.uint8, 0, 255), "w": rand(ws, wtype, lo, hi),
              "xz": np.array(rng.integers(0, 256), np.uint8),
              "wz": np.array([rng.integers(lo, hi + 1)], wtype)}
    check_node("ConvInteger", inputs, attrs, opset=10)
    inputs["wz"] = np.array(3, wtype)
    check_node("ConvInteger", inputs, attrs, opset=10)


def test_conv_integer_no_zero_points():
    check_node("ConvInteger", {"x": rand((1, 2, 5, 5), np.uint8, 0, 255),
                               "w": rand((3, 2, 3, 3), np.uint8, 0, 255)}, opset=10)


@pytest.mark.parametrize("xs,ws,attrs", INT_CONV_CASES)
@pytest.mark.parametrize("xtype,wtype", [(np.uint8, np.uint8), (np.uint8, np.int8),
                                         (np.int8, np.int8)])
@pytest.mark.parametrize("per_channel", [False, True])
def test_qlinear_conv(xs, ws, attrs, xtype, wtype, per_channel):
    lim = {np.uint8: (0, 255), np.int8: (-128, 127)}
    # ORT's u8s8 kernels on x86 without VNNI sum pairs of u8*s8 products in saturating int16
    # (vpmaddubsw): int8 weights of a uint8 input stay in 7 bits there, as ORT advises
    # (reduce_range), so that the reference is exact.
    wlim = (-64, 63) if (xtype, wtype) == (np.uint8, np.int8) else lim[wtype]
    M = ws[0]
    inputs = {"x": rand(xs, xtype, *lim[xtype]),
              "xs": np.array(0.02, np.float32), "xz": np.array(lim[xtype][0] + 100, xtype),
              "w": rand(ws, wtype, *wlim),
              "ws": (rand((M,), lo=0.002, hi=0.01) if per_channel else np.array(0.005, np.float32)),
              # ORT takes a per-channel weight zero point only for int8 weights (all zero)
              "wz": (np.zeros((M,), wtype) if per_channel else np.array(wlim[0] + 7, wtype)),
              "ys": np.array(0.5 * np.prod(ws[1:]) / 27, np.float32),
              "yz": np.array(lim[xtype][0] + 60, xtype),
              "b": rand((M,), np.int32, -5000, 5000)}
    if per_channel and wtype == np.uint8:
        pytest.skip("ORT's CPU kernel has no per-channel uint8 weight zero points")
    check_node("QLinearConv", inputs, attrs, opset=10)


# ---- BatchNormalization training mode --------------------------------------------------------

@pytest.mark.parametrize("shape", [(2, 3, 4, 5), (4, 2), (3, 2, 7)])
@pytest.mark.parametrize("opset", [14, 15])
def test_batch_norm_training(shape, opset):
    C = shape[1]
    inputs = {"x": rand(shape, lo=-3, hi=3), "s": rand((C,)), "b": rand((C,)),
              "mean": rand((C,)), "var": rand((C,), lo=0.5, hi=2)}
    attrs = {"training_mode": 1, "momentum": 0.8, "epsilon": 1e-3}
    # training mode has exactly 3 outputs (ONNX rejects fewer)
    check_node("BatchNormalization", inputs, attrs, outputs=3, opset=opset)


# ---- Dropout with run-time training_mode ----------------------------------------------------

def test_dropout_training_zero_ratio():
    inputs = {"x": rand((3, 4, 5)), "r": np.array(0.0, np.float32), "t": np.array(True)}
    check_node("Dropout", inputs, outputs=2, opset=13)
    check_node("Dropout", inputs, outputs=1, opset=22)


def test_dropout_training_random_is_an_error():
    inputs = {"x": rand((3, 4)), "r": np.array(0.5, np.float32), "t": np.array(True)}
    m = make_node_model("Dropout", inputs, outputs=2, opset=13)
    with pytest.raises(Exception, match="Dropout.*ratio"):
        run_mlx(m, inputs, runs=1)
    # ratio 0 in the same session still runs (the host read is per run)
    s = ort.InferenceSession(m.SerializeToString(), sess_options=om.session_options(
        "cpu", fallback=False))
    y, mask = s.run(None, {**inputs, "r": np.array(0.0, np.float32)})
    np.testing.assert_array_equal(y, inputs["x"])
    assert mask.all()


# ---- LabelEncoder ----------------------------------------------------------------------------

def label_encoder(x, attrs, out_type, opset):
    g_in = [helper.make_tensor_value_info("x", helper.np_dtype_to_tensor_dtype(x.dtype), x.shape)]
    node = helper.make_node("LabelEncoder", ["x"], ["y"], domain="ai.onnx.ml", **attrs)
    g = helper.make_graph([node], "le", g_in, [helper.make_tensor_value_info("y", out_type, None)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 19),
                                            helper.make_opsetid("ai.onnx.ml", opset)])
    m.ir_version = 10
    return m


@pytest.mark.parametrize("opset", [2, 3, 4])
def test_label_encoder_int_to_float(opset):
    x = rng.integers(-2, 8, size=(4, 5)).astype(I64)
    m = label_encoder(x, {"keys_int64s": [0, 3, 5, 7, -1], "values_floats": [0.5, 1.5, -2, 9, 4],
                          "default_float": 42.0}, TensorProto.FLOAT, opset)
    check_model(m, {"x": x})


@pytest.mark.parametrize("opset", [2, 4])
def test_label_encoder_float_to_int(opset):
    x = rng.choice(np.array([0.5, 1.25, -3.0, 7.0, 2.0], np.float32), size=(11,))
    m = label_encoder(x, {"keys_floats": [0.5, -3.0, 7.0], "values_int64s": [10, 20, 30]},
                      TensorProto.INT64, opset)  # default_int64: -1
    check_model(m, {"x": x})


def test_label_encoder_tensor_attrs_and_nan():
    x = np.array([1.0, np.nan, 2.0, 3.5, np.nan, -1.0], np.float64)
    keys = numpy_helper.from_array(np.array([1.0, np.nan, 3.5], np.float64), "keys_tensor")
    vals = numpy_helper.from_array(np.array([100, 200, 300], I64), "values_tensor")
    dflt = numpy_helper.from_array(np.array([-7], I64), "default_tensor")
    m = label_encoder(x, {"keys_tensor": keys, "values_tensor": vals, "default_tensor": dflt},
                      TensorProto.INT64, 4)
    check_model(m, {"x": x})


def test_label_encoder_strings_declined():
    x = rng.integers(0, 3, size=(4,)).astype(I64)
    m = label_encoder(x, {"keys_int64s": [0, 1, 2], "values_strings": ["a", "b", "c"]},
                      TensorProto.STRING, 2)
    placed = placement_of(m, {"x": x})
    assert om.EP_NAME not in placed and placed  # ran, on the CPU EP


# ---- RoiAlign ----------------------------------------------------------------------------------
# ORT's CPU EP has RoiAlign up to opset 16 (the oracle there); opset 22 (the same computation,
# more types) is compared with ONNX's reference implementation.

ROI_CASES = [
    # x shape, rois, attrs
    ((1, 1, 10, 10), [[0, 0, 9, 9], [0, 5, 4, 9], [5, 5, 9, 9]],
     {"output_height": 5, "output_width": 5, "sampling_ratio": 2}),
    ((2, 3, 12, 9), [[1.5, 2.2, 7.1, 10.4], [-2, -1, 4, 3], [3, 3, 3.5, 3.2], [0, 0, 20, 20]],
     {"output_height": 3, "output_width": 4, "sampling_ratio": 3, "spatial_scale": 0.5}),
    ((2, 2, 8, 8), [[0.3, 0.7, 6.2, 5.1], [2, 1, 7.9, 7.9], [1, 1, 1, 1]],
     {"output_height": 2, "output_width": 3, "sampling_ratio": 0}),
    ((1, 4, 6, 7), [[0, 0, 6, 7], [1.2, 0.4, 5.5, 3.3]],
     {"output_height": 4, "output_width": 2, "sampling_ratio": 0, "spatial_scale": 1.3}),
]


def _roi_inputs(shape, rois, batch=None):
    x = rand(shape, lo=-2, hi=2)
    r = np.array(rois, np.float32)
    b = np.array(batch if batch is not None else [i % shape[0] for i in range(len(rois))], I64)
    return {"X": x, "rois": r, "batch_indices": b}


@pytest.mark.parametrize("shape,rois,attrs", ROI_CASES)
@pytest.mark.parametrize("mode", ["avg", "max"])
@pytest.mark.parametrize("ctm", ["half_pixel", "output_half_pixel"])
def test_roi_align_opset16_against_cpu(shape, rois, attrs, mode, ctm):
    check_node("RoiAlign", _roi_inputs(shape, rois),
               {**attrs, "mode": mode, "coordinate_transformation_mode": ctm}, opset=16)


@pytest.mark.parametrize("shape,rois,attrs", ROI_CASES)
@pytest.mark.parametrize("mode", ["avg", "max"])
def test_roi_align_opset10_against_cpu(shape, rois, attrs, mode):
    # opset 10 has no coordinate_transformation_mode: output_half_pixel
    check_node("RoiAlign", _roi_inputs(shape, rois), {**attrs, "mode": mode}, opset=10)


@pytest.mark.parametrize("shape,rois,attrs", ROI_CASES)
@pytest.mark.parametrize("mode", ["avg", "max"])
@pytest.mark.parametrize("ctm", ["half_pixel", "output_half_pixel"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_roi_align_opset22_against_reference(shape, rois, attrs, mode, ctm, dtype):
    from onnx.reference import ReferenceEvaluator
    inputs = _roi_inputs(shape, rois)
    inputs["X"] = inputs["X"].astype(dtype)
    inputs["rois"] = inputs["rois"].astype(dtype)
    a = {**attrs, "mode": mode, "coordinate_transformation_mode": ctm}
    model = make_node_model("RoiAlign", inputs, 1, a, opset=22)
    expected = ReferenceEvaluator(model).run(None, inputs)
    check_model(model, inputs, expected=expected)


def test_roi_align_new_rois_with_sampling_ratio_0():
    # sampling_ratio 0 reads the rois on the host: the same session must follow new values
    base = _roi_inputs((1, 2, 8, 8), [[0, 0, 7, 7], [1, 1, 3, 5]])
    model = make_node_model("RoiAlign", base, 1, {"output_height": 2, "output_width": 2}, opset=16)
    for rois in ([[0, 0, 7, 7], [1, 1, 3, 5]], [[0, 0, 2, 2], [0.5, 1, 7.5, 6]]):
        feeds = {**base, "rois": np.array(rois, np.float32)}
        check_model(model, feeds)


def test_roi_align_batch_index_out_of_range_fails():
    inputs = _roi_inputs((2, 1, 4, 4), [[0, 0, 3, 3]], batch=[2])
    model = make_node_model("RoiAlign", inputs, 1, {"sampling_ratio": 1}, opset=16)
    with pytest.raises(Exception, match="batch_indices"):
        run_mlx(model, inputs, runs=1)
