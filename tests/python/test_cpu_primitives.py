"""The CPU device's primitive count: each MLX primitive costs a hand-off to MLX's stream thread
(several microseconds), more than the arithmetic of a small tensor. These tests hold the
translators and the EP's CPU kernels to the forms that keep the count down, and compare every
output with ORT's CPU EP."""
import json
import os
import re
import subprocess
import sys

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import oracle

pytestmark = pytest.mark.skipif(oracle.DEVICE != "cpu", reason="the CPU device's kernels")


def _avx512():
    from onnxruntime_mlx.doctor import cpu_flags
    return "avx512f" in cpu_flags()


def _avx512_core():
    from onnxruntime_mlx.doctor import cpu_flags
    return {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= cpu_flags()


# oneDNN 2.6 leaves a convolution's output channel-blocked (nChw8c, nChw16c) on AVX2 machines and
# channels-last (acdb) on AVX-512 ones (its brgconv kernels). Concatenations, per-channel maps
# and max pooling take either layout (channels-last: any channel counts, e.g. the 24 channels
# below: one block of 16 lanes and a remainder).
CHANNELS_LAST = _avx512_core()


def _init(name, array):
    return onnx.numpy_helper.from_array(np.asarray(array, np.float32), name)


def _run(nodes, feeds, inits, capfd, rtol, atol, runs=3, shapes=None, unoptimized=False, outputs=("y",), keep=None,
         **options):
    """Runs a graph of `nodes` (inputs `feeds`, declared with their shapes or `shapes[name]`,
    outputs `outputs`) on the MLX EP's CPU device and on ORT's CPU EP, asserts the outputs
    agree, and returns the MLX primitives of the EP's last run (log_level=3). `unoptimized`:
    ORT's graph optimizations off for the EP's session (its own fusions would rewrite the nodes
    first). `keep`: a list the EP's last outputs are appended to."""
    import onnxruntime_mlx as om
    shapes = shapes or {}
    inputs = [helper.make_tensor_value_info(k, TensorProto.FLOAT, shapes.get(k, list(v.shape))) for k, v in feeds.items()]
    g = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs],
                          inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    model = model.SerializeToString()
    want = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)
    so = om.session_options("cpu", fallback=False, log_level=3, **options)
    if unoptimized:
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model, sess_options=so)
    capfd.readouterr()
    for _ in range(runs):
        got = sess.run(None, feeds)
    lines = [ln for ln in capfd.readouterr().err.splitlines() if "evaluates:" in ln]
    assert lines
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=rtol, atol=atol)
    if keep is not None:
        keep.append(got)
    return {k: int(v) for k, v in re.findall(r" (\w+)=(\d+)", lines[-1].split("evaluates:")[1])}


def test_small_transcendentals_fuse_with_their_neighbours(capfd):
    """Under 256 elements Sigmoid and Tanh stay MLX's ops (kernels/cpu/kernels.h,
    kCpuUnaryMinElements), which a compiled program fuses with the elementwise ops around them
    into one primitive: each primitive costs a hand-off to MLX's stream thread, more than the
    arithmetic on so few values. Outputs equal ORT's CPU EP."""
    nodes = [helper.make_node("Add", ["x", "b"], ["a"]), helper.make_node("Tanh", ["a"], ["t"]),
             helper.make_node("Mul", ["t", "b"], ["m"]), helper.make_node("Sigmoid", ["m"], ["y"])]
    x = np.linspace(-4, 4, 64, dtype=np.float32).reshape(1, 64)
    # cpu_fuse=1: MLX's fused kernels always (the default times fused against unfused first)
    prims = _run(nodes, {"x": x}, [_init("b", np.linspace(-1, 1, 64))], capfd, 1e-6, 1e-7, cpu_fuse=1)
    assert "SigmoidMap" not in prims and "TanhMap" not in prims, prims
    fused = [k for k in prims if k.startswith("Compiled")]
    assert len(fused) == 1 and "Tanh" in fused[0] and "Sigmoid" in fused[0], prims


@pytest.mark.parametrize("op,kernel", [("Sigmoid", "SigmoidMap"), ("Softmax", "RowSoftmax"), ("Concat", "ChunkConcat"),
                                       ("MaxPool", "MaxPool2d"), ("Conv", "DnnlConv")])
def test_row_kernels_read_views_in_place(op, kernel, capfd):
    """The EP's CPU kernels (sigmoid, softmax, concatenation, pooling, oneDNN's convolution) take
    a transposed view as their input and gather it themselves (RowMajorInput): no Contiguous
    primitive in front of them. Outputs equal ORT's CPU EP."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((1, 8, 18, 16)).astype(np.float32) * 4
    inits, attrs, ins = [], {}, ["t"]
    if op == "Concat":
        attrs, ins = {"axis": 1}, ["t", "t"]
    elif op == "MaxPool":
        attrs = {"kernel_shape": [3, 3], "strides": [2, 2]}
    elif op == "Conv":
        inits = [_init("w", rng.standard_normal((16, 8, 3, 3))), _init("b", rng.standard_normal(16))]
        ins = ["t", "w", "b"]
    nodes = [helper.make_node("Transpose", ["x"], ["t"], perm=[0, 1, 3, 2]), helper.make_node(op, ins, ["y"], **attrs)]
    prims = _run(nodes, {"x": x}, inits, capfd, 2e-6, 2e-5 if op == "Conv" else 1e-7)
    if op == "Conv":  # (its output left blocked, then unblocked: cpu_dnnl_blocked)
        prims[kernel] = prims.get(kernel, 0) + prims.pop("DnnlConvBlocked", 0)
    assert prims.get(kernel) == 1, prims
    # the output's own row-contiguous copy is the only Contiguous left
    assert prims.get("Contiguous", 0) <= 1 and prims.get("Transpose") == 1, prims


@pytest.mark.parametrize("batch", [1, 2])
@pytest.mark.parametrize("groups,cin,cout,hw", [(4, 64, 20, (9, 7)), (3, 54, 21, (5, 3)), (1, 16, 13, (17, 1)),
                                                (2, 136, 136, (14, 14)), (4, 24, 112, (11, 13))])
@pytest.mark.parametrize("act", ["Relu", "Sigmoid", None])
@pytest.mark.parametrize("avx512", [1, 0])
def test_pointwise_conv_is_one_primitive(batch, groups, cin, cout, hw, act, avx512, capfd):
    """A 1x1 convolution that oneDNN does not take (grouped, or below its size) runs as the EP's
    kernel over NCHW as it lies (kernels/cpu/pointwise.cc: 6 x 16 register tiles, 6 x 32 with
    AVX-512 where the CPU has it and cpu_avx512=1, masked at the edges), its bias and a Relu
    after it inside: one primitive, where MLX's form was reshapes
    around a batched product. Output channels not a multiple of 6 and positions not a multiple
    of 16 take the edge tiles; shufflenet's first grouped layer has 6 input channels a group
    (groups of fewer than 4 stay MLX's product, see test_grouped_pointwise_conv_has_no_weight_views).
    Outputs equal ORT's CPU EP."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((batch, cin, *hw)).astype(np.float32)
    inits = [_init("w", rng.standard_normal((cout, cin // groups, 1, 1))), _init("b", rng.standard_normal(cout))]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c" if act else "y"], group=groups)]
    if act:
        nodes.append(helper.make_node(act, ["c"], ["y"]))
    # cpu_dnnl=0: the kernel also for the ungrouped case, which oneDNN would otherwise take
    prims = _run(nodes, {"x": x}, inits, capfd, 2e-5, 2e-5, cpu_fuse=1, cpu_dnnl=0 if groups == 1 else 1,
                 cpu_avx512=avx512)
    assert prims.get("PointwiseConv") == 1 and "Matmul" not in prims and "Broadcast" not in prims, prims
    assert "Reshape" not in prims, prims
    if act == "Relu" and groups > 1:  # (the Relu joins the Conv where oneDNN is on: graph/fuse_conv_activation)
        assert "Maximum" not in prims and not any(k.startswith("Compiled") for k in prims), prims


@pytest.mark.parametrize("channels,then", [((16, 24), "Conv"), ((16, 24), "MaxPool"), ((12, 24), "Conv")])
def test_concatenated_convolutions_stay_blocked(channels, then, capfd):
    """A channel concatenation of oneDNN convolutions' blocked outputs (squeezenet's fire
    modules, inception's branches) is made in their blocked layout (cpu_dnnl_blocked_concat): one
    copy per input, no unblocking of each input, and a following convolution takes the result
    as it is; a pooling after it unblocks the concatenation once. Channels that are not a
    multiple of the layout's block (12) take the plain path. Outputs equal ORT's CPU EP."""
    rng = np.random.default_rng(11)
    x = rng.standard_normal((1, 8, 12, 10)).astype(np.float32)
    c1, c2 = channels
    inits = [_init("w1", rng.standard_normal((c1, 8, 1, 1)) * 0.3), _init("w2", rng.standard_normal((c2, 8, 3, 3)) * 0.3),
             _init("w3", rng.standard_normal((16, c1 + c2, 1, 1)) * 0.3)]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"]),
             helper.make_node("Conv", ["x", "w2"], ["b"], pads=[1, 1, 1, 1]),
             helper.make_node("Concat", ["a", "b"], ["c"], axis=1)]
    if then == "Conv":
        nodes.append(helper.make_node("Conv", ["c", "w3"], ["y"]))
    else:
        nodes.append(helper.make_node("MaxPool", ["c"], ["y"], kernel_shape=[2, 2], strides=[2, 2]))
    prims = _run(nodes, {"x": x}, inits, capfd, 2e-5, 2e-5)
    blocked = CHANNELS_LAST or (c1 % 8 == 0 and c2 % 8 == 0)
    assert prims.get("DnnlBlockedConcat", 0) == (1 if blocked else 0), prims
    if blocked:
        # no unblocking of the two inputs; the pooling's concatenation is unblocked once, and the
        # convolution's output (the graph's) once
        assert prims.get("DnnlUnblock", 0) == 1 and "ChunkConcat" not in prims, prims


@pytest.mark.parametrize("avx512", [1, 0])
def test_large_blocked_concatenation_and_pool(avx512, capfd):
    """A concatenation large enough to be copied by both threads (two images of 64 + 48 channels,
    24 x 24: its copy split into chunks that end inside a position's channels), then a 3 x 3
    stride-2 max pooling of its 112 channels (in AVX-512 registers with cpu_avx512=1 on such a
    machine: 64 channels a pass, then 16 at a time) and a convolution. Outputs equal ORT's CPU EP.
    Broken by a chunk copied from the wrong input or offset, or a pass that misses lanes."""
    rng = np.random.default_rng(37)
    x = rng.standard_normal((2, 8, 24, 24)).astype(np.float32)
    inits = [_init("w1", rng.standard_normal((64, 8, 1, 1)) * 0.3), _init("w2", rng.standard_normal((48, 8, 3, 3)) * 0.3),
             _init("w3", rng.standard_normal((16, 112, 1, 1)) * 0.3)]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"]), helper.make_node("Conv", ["x", "w2"], ["b"], pads=[1, 1, 1, 1]),
             helper.make_node("Concat", ["a", "b"], ["c"], axis=1),
             helper.make_node("MaxPool", ["c"], ["p"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["p", "w3"], ["y"])]
    prims = _run(nodes, {"x": x}, inits, capfd, 2e-5, 2e-5, cpu_avx512=avx512)
    assert prims.get("DnnlBlockedConcat") == 1 and prims.get("DnnlBlockedPool") == 1, prims


@pytest.mark.parametrize("first", ["MaxPool", "Conv"])
def test_densenet_layer_stays_blocked(first, capfd):
    """densenet's layer: a concatenation (its first input a pooling's plain output, reordered into
    the blocked layout once, or a convolution's), then BatchNormalization, a per-channel Mul and
    Add and a Relu (cpu_dnnl_blocked_channel_map: per-channel parameters laid out like the
    blocked buffer), then a convolution that takes the blocked result as it is: no unblocking
    but the graph output's. Outputs equal ORT's CPU EP."""
    rng = np.random.default_rng(21)
    x = rng.standard_normal((1, 16, 12, 12)).astype(np.float32)
    c = 16 + 8
    inits = [_init("w0", rng.standard_normal((16, 16, 3, 3)) * 0.2), _init("w1", rng.standard_normal((8, 16, 3, 3)) * 0.2),
             _init("w2", rng.standard_normal((8, c, 1, 1)) * 0.2), _init("scale", rng.uniform(0.5, 1.5, c)),
             _init("bias", rng.standard_normal(c)), _init("mean", rng.standard_normal(c) * 0.1),
             _init("var", rng.uniform(0.5, 1.5, c)), _init("k", rng.uniform(0.5, 1.5, (1, c, 1, 1))),
             _init("d", rng.standard_normal((c, 1, 1)))]
    nodes = [helper.make_node("MaxPool", ["x"], ["p"], kernel_shape=[1, 1]) if first == "MaxPool"
             else helper.make_node("Conv", ["x", "w0"], ["p"], pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["x", "w1"], ["q"], pads=[1, 1, 1, 1]),
             helper.make_node("Concat", ["p", "q"], ["c"], axis=1),
             helper.make_node("BatchNormalization", ["c", "scale", "bias", "mean", "var"], ["n"]),
             helper.make_node("Mul", ["k", "n"], ["m"]), helper.make_node("Add", ["m", "d"], ["a"]),
             helper.make_node("Relu", ["a"], ["r"]), helper.make_node("Conv", ["r", "w2"], ["y"])]
    prims = _run(nodes, {"x": x}, inits, capfd, 2e-5, 2e-5)
    assert prims.get("DnnlBlockedConcat") == 1 and prims.get("DnnlUnblock") == 1, prims
    assert prims.get("DnnlBlock", 0) == (1 if first == "MaxPool" else 0), prims


@pytest.mark.parametrize("op,pool", [
    ("MaxPool", dict(kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1])),
    ("MaxPool", dict(kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1)),
    ("MaxPool", dict(kernel_shape=[2, 2], strides=[2, 2], dilations=[2, 2])),
    ("AveragePool", dict(kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1])),
    ("AveragePool", dict(kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1], count_include_pad=1)),
    ("AveragePool", dict(kernel_shape=[3, 2], strides=[2, 2], ceil_mode=1))])
@pytest.mark.parametrize("channels", [(16, 8), (64, 24)])
def test_pool_of_blocked_outputs_stays_blocked(op, pool, channels, capfd):
    """Max and average pooling of a concatenation of convolutions' blocked outputs (inception's
    pool branches) pool the blocked buffer into the same layout (cpu_dnnl_blocked_pool), and the
    next convolution takes it as it is: the only unblocking is the graph output's. Windows with
    padding (counted in the average or not), ceil mode's partial windows and dilation; 24 and 88
    channels (channels-last on AVX-512 machines: 16-lane blocks and a rest). Outputs equal ORT's
    CPU EP. Broken by an average divided by the wrong window's count or a lane past the block."""
    rng = np.random.default_rng(31)
    ca, cb = channels
    x = rng.standard_normal((1, 8, 13, 11)).astype(np.float32)
    inits = [_init("w1", rng.standard_normal((ca, 8, 1, 1)) * 0.3), _init("w2", rng.standard_normal((cb, 8, 3, 3)) * 0.3),
             _init("w3", rng.standard_normal((16, ca + cb, 1, 1)) * 0.3)]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"]), helper.make_node("Conv", ["x", "w2"], ["b"], pads=[1, 1, 1, 1]),
             helper.make_node("Concat", ["a", "b"], ["c"], axis=1), helper.make_node(op, ["c"], ["p"], **pool),
             helper.make_node("Conv", ["p", "w3"], ["y"])]
    prims = _run(nodes, {"x": x}, inits, capfd, 2e-5, 2e-5)
    assert prims.get("DnnlBlockedPool") == 1 and prims.get("DnnlUnblock") == 1, prims


def test_residual_of_a_per_channel_map_and_a_convolution(capfd):
    """A residual Add of a convolution's blocked output (a flat buffer) and a per-channel map of it
    (its buffer shaped [N, C / b, H * W, b]) adds the two blocked buffers (PaddleOCR's detector
    has this: squeeze-and-excite, then the residual). Outputs equal ORT's CPU EP."""
    rng = np.random.default_rng(29)
    x = rng.standard_normal((1, 8, 10, 10)).astype(np.float32)
    inits = [_init("w1", rng.standard_normal((16, 8, 3, 3)) * 0.2)]
    # squeeze-and-excite as in the detector: a per-channel factor computed from the tensor itself
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"], pads=[1, 1, 1, 1]),
             helper.make_node("GlobalAveragePool", ["a"], ["g"]), helper.make_node("Sigmoid", ["g"], ["k"]),
             helper.make_node("Mul", ["a", "k"], ["m"]), helper.make_node("Add", ["a", "m"], ["y"])]
    _run(nodes, {"x": x}, inits, capfd, 2e-5, 2e-5)


def test_blocked_output_times_a_row_vector_is_not_per_channel(capfd):
    """A [C] parameter broadcasts over NCHW's last axis, not the channels: a blocked convolution
    output (16 channels, width 16) times a length-16 vector is not a per-channel map, and is
    computed on the plain tensor. Outputs equal ORT's CPU EP."""
    rng = np.random.default_rng(23)
    x = rng.standard_normal((1, 8, 6, 16)).astype(np.float32)
    inits = [_init("w", rng.standard_normal((16, 8, 3, 3)) * 0.2), _init("v", rng.standard_normal(16))]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Mul", ["c", "v"], ["y"])]
    _run(nodes, {"x": x}, inits, capfd, 2e-5, 2e-5)


def test_pointwise_conv_weight_fed_each_run_is_read_each_run():
    """The kernel lays a constant weight out for its tiles once (kernels/cpu/pointwise.cc); a
    weight that is a graph input is laid out again on every run, even when it comes in the same
    buffer with new values (here one numpy array rewritten in place between compiled runs).
    Every run's output equals ORT's CPU EP's."""
    import onnxruntime_mlx as om
    rng = np.random.default_rng(9)
    x = rng.standard_normal((1, 32, 6, 10)).astype(np.float32)
    w = np.zeros((20, 16, 1, 1), np.float32)
    g = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"], group=2)], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape)),
                           helper.make_tensor_value_info("w", TensorProto.FLOAT, list(w.shape))],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    ref = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    sess = ort.InferenceSession(model, sess_options=om.session_options("cpu", fallback=False))
    for k in range(6):
        w[...] = rng.standard_normal(w.shape)
        np.testing.assert_allclose(sess.run(None, {"x": x, "w": w})[0], ref.run(None, {"x": x, "w": w})[0],
                                   rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("batch", [1, 2])
def test_grouped_pointwise_conv_has_no_weight_views(batch, capfd):
    """A grouped 1x1 convolution of fewer than 4 input channels a group runs as one batched
    product over NCHW (nn.cc, pointwise_conv_as_product) with its weight and bias reshaped once
    per program, and a single image without a batch axis, so no Broadcast of the weight: x's
    reshape, the product, the result's reshape and the bias add remain. Outputs equal ORT's CPU
    EP."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((batch, 12, 9, 7)).astype(np.float32)
    inits = [_init("w", rng.standard_normal((20, 3, 1, 1))), _init("b", rng.standard_normal(20))]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], group=4), helper.make_node("Relu", ["c"], ["y"])]
    prims = _run(nodes, {"x": x}, inits, capfd, 1e-5, 1e-5, cpu_fuse=1)
    assert prims.get("Matmul") == 1 and "PointwiseConv" not in prims, prims
    assert "Broadcast" not in prims or batch > 1, prims
    assert prims.get("Reshape", 0) <= 2, prims


@pytest.mark.parametrize("shape,bias,transposed", [((2, 16, 384), True, False), ((3, 7, 37), False, False),
                                                  ((4, 300, 24), True, True), ((1, 1, 5), True, False)])
def test_layer_norm_is_one_primitive(shape, bias, transposed, capfd):
    """LayerNormalization over the last axis (float32, vector scale and bias) runs as the EP's
    row kernel (kernels/cpu/layer_norm.cc): one primitive where MLX's CPU fast::layer_norm is its
    composed form (two sums, a square and two elementwise kernels), also on a transposed view
    and on rows whose length is not a multiple of 8. Outputs equal ORT's CPU EP."""
    rng = np.random.default_rng(9)
    x = (rng.standard_normal(shape) * 3 + 1).astype(np.float32)
    n = shape[1] if transposed else shape[-1]
    inits = [_init("g", rng.standard_normal(n))]
    ins = ["t" if transposed else "x", "g"]
    if bias:
        inits.append(_init("b", rng.standard_normal(n)))
        ins.append("b")
    nodes = [helper.make_node("LayerNormalization", ins, ["y"], axis=-1, epsilon=1e-5)]
    if transposed:
        nodes.insert(0, helper.make_node("Transpose", ["x"], ["t"], perm=[0, 2, 1]))
    prims = _run(nodes, {"x": x}, inits, capfd, 1e-5, 1e-5)
    assert prims.get("RowLayerNorm") == 1 and "Sum" not in prims, prims


@pytest.mark.parametrize("op", ["SimplifiedLayerNormalization", "SkipSimplifiedLayerNormalization",
                                "SkipLayerNormalization", "AddLayerNormalization"])
@pytest.mark.parametrize("skip_norm", [1, 0])
@pytest.mark.parametrize("with_sum", [False, True])
@pytest.mark.parametrize("avx512", ["1", "0"])
def test_transformer_norms_are_one_kernel(op, skip_norm, with_sum, avx512, capfd):
    """RMS normalization (SimplifiedLayerNormalization) runs as the row kernel with the mean taken
    as 0 (RowRmsNorm). The skip forms, and a LayerNormalization over the last axis whose input
    is an Add read by it alone (graph/fuse_skip_norm: an encoder's residual connection), run
    with their add as one kernel (RowSkipRmsNorm, RowSkipLayerNorm: kernels/cpu/layer_norm.cc),
    each row's sum made and normalized in one pass, the sum a second output of the kernel when
    the node's fourth output is read (a decoder's residual stream); no Add, no Sum among the
    primitives. With cpu_skip_norm=0, MLX's Add and then the row kernel. Outputs equal ORT's
    CPU EP, with the 16-lane rows (four sums in flight, rows of 67: a masked tail) and the 8-lane
    ones (cpu_avx512=0). Broken by the add left out of the kernel (a row's sum wrong) or by the
    fusion dropped."""
    if with_sum and op in ("SimplifiedLayerNormalization", "AddLayerNormalization"):
        pytest.skip("no sum output")
    rng = np.random.default_rng(13)
    feeds = {"x": rng.standard_normal((2, 5, 67)).astype(np.float32)}
    inits = [_init("g", rng.standard_normal(67))]
    outs = ["y"]
    if op == "SimplifiedLayerNormalization":
        nodes = [helper.make_node(op, ["x", "g"], ["y"], axis=-1, epsilon=1e-6)]
    elif op == "AddLayerNormalization":
        feeds["s"] = rng.standard_normal((2, 5, 67)).astype(np.float32)
        inits.append(_init("b", rng.standard_normal(67)))
        nodes = [helper.make_node("Add", ["x", "s"], ["a"]),
                 helper.make_node("LayerNormalization", ["a", "g", "b"], ["y"], axis=-1, epsilon=1e-6)]
    else:
        feeds["s"] = rng.standard_normal((2, 5, 67)).astype(np.float32)
        ins = ["x", "s", "g"]
        if op == "SkipLayerNormalization":
            inits += [_init("b", rng.standard_normal(67)), _init("bias", rng.standard_normal(67))]
            ins += ["b", "bias"]
        else:
            inits.append(_init("bias", rng.standard_normal(67)))
            ins.append("bias")
        if with_sum:
            outs = ["y", "", "", "sum"]
        nodes = [helper.make_node(op, ins, outs, domain="com.microsoft", epsilon=1e-6)]
    prims = _run(nodes, feeds, inits, capfd, 1e-5, 1e-5, cpu_skip_norm=skip_norm, cpu_avx512=avx512,
                 outputs=[o for o in outs if o], unoptimized=op == "AddLayerNormalization")
    if op == "SimplifiedLayerNormalization":
        assert prims.get("RowRmsNorm") == 1 and "Sum" not in prims, prims
    elif skip_norm:
        kernel = "RowSkipRmsNorm" if op == "SkipSimplifiedLayerNormalization" else "RowSkipLayerNorm"
        # (one primitive; the log counts its arrays: the sum is its second)
        assert prims.get(kernel) == (2 if with_sum else 1) and "Add" not in prims and "Sum" not in prims, prims
    else:
        kernel = "RowRmsNorm" if op == "SkipSimplifiedLayerNormalization" else "RowLayerNorm"
        assert prims.get(kernel) == 1 and "Add" in prims, prims


@pytest.mark.parametrize("blocked", [1, 0])
def test_convolutions_hand_on_their_blocked_output(blocked, capfd):
    """With cpu_dnnl_blocked=1 a oneDNN convolution leaves its output in its blocked layout
    (DnnlConvBlocked) behind an unblocking (DnnlUnblock); the next convolution takes the blocked
    buffer, and a residual Add of two blocked outputs in one layout adds the blocked buffers
    (kernels.h, cpu_dnnl_blocked_steps: the EP's kernel), so the one unblocking evaluated is the
    pool's input (cpu_dnnl_add=0: the Add as a step of its own, not the convolution's post-op). With
    0 every convolution writes NCHW. Outputs equal ORT's CPU EP either way."""
    rng = np.random.default_rng(17)
    x = rng.standard_normal((1, 16, 20, 20)).astype(np.float32)
    inits = [_init(n, rng.standard_normal(s) * 0.2) for n, s in
             (("w1", (16, 16, 3, 3)), ("w2", (16, 16, 3, 3)), ("w3", (16, 16, 1, 1)))]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["a"], ["r"]),
             helper.make_node("Conv", ["r", "w2"], ["b"], pads=[1, 1, 1, 1]),   # reads the blocked output
             helper.make_node("Conv", ["b", "w3"], ["c"]),                      # and this one too
             helper.make_node("Add", ["c", "r"], ["s"]),                        # on the blocked buffers
             helper.make_node("MaxPool", ["s"], ["y"], kernel_shape=[2, 2], strides=[2, 2])]  # reads NCHW
    prims = _run(nodes, {"x": x}, inits, capfd, 1e-4, 1e-4, cpu_dnnl_blocked=blocked, cpu_dnnl_add=0)
    if blocked:
        assert prims.get("DnnlConvBlocked") == 3 and prims.get("DnnlUnblock") == 1 and "DnnlConv" not in prims, prims
        if _avx512():  # (the two blocked buffers added by the chain kernel; MLX's Add elsewhere)
            assert prims.get("BlockedSteps") == 1 and "Add" not in prims, prims
    else:
        assert prims.get("DnnlConv") == 3 and "DnnlUnblock" not in prims and "DnnlConvBlocked" not in prims, prims


def test_residual_sum_and_relu_stay_blocked(capfd):
    """A ResNet block as Caffe2 exports it: Sum of a convolution and the block's input (itself a
    convolution's output), Relu, then the next convolution: the Sum and the Relu run on the blocked
    buffers (they map zeros to zero, so the layout's channel padding stays zero), and only the
    model's output is unblocked (cpu_dnnl_add=0: the Sum not the convolution's post-op). Outputs
    equal ORT's CPU EP."""
    rng = np.random.default_rng(19)
    x = rng.standard_normal((1, 8, 12, 12)).astype(np.float32)
    inits = [_init(n, rng.standard_normal(s) * 0.2) for n, s in
             (("w0", (16, 8, 3, 3)), ("w1", (16, 16, 3, 3)), ("w2", (16, 16, 1, 1)))]
    nodes = [helper.make_node("Conv", ["x", "w0"], ["a"], pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["a", "w1"], ["b"], pads=[1, 1, 1, 1]),
             helper.make_node("Sum", ["b", "a"], ["s"]),
             helper.make_node("Relu", ["s"], ["r"]),
             helper.make_node("Conv", ["r", "w2"], ["y"])]
    prims = _run(nodes, {"x": x}, inits, capfd, 1e-4, 1e-4, cpu_fuse=1, cpu_dnnl_add=0)
    assert prims.get("DnnlConvBlocked") == 3 and prims.get("DnnlUnblock") == 1, prims
    if _avx512():
        assert prims.get("BlockedSteps") == 1 and not [k for k in prims if k.startswith(("Add", "Maximum", "Compiled"))]


def _resnet_stage(rng, C, read_after):
    """Three ResNet bottleneck-like blocks (a projection block, two identity blocks), each
    Conv -> BN -> Relu -> Conv -> BN, its Add/Sum with the shortcut, Relu. `read_after`: the
    first block's output also read after the second block's Add (a GlobalAveragePool, an output)
    and the second block's output an output of the graph: those residuals must stay as they are."""
    def w(name, shape):
        return _init(name, rng.standard_normal(shape) * (2.0 / np.prod(shape[1:])) ** 0.5)
    inits, nodes = [], []

    def bn(name, x, y):
        inits.extend([_init(name + "s", rng.uniform(0.5, 1.5, C)), _init(name + "b", rng.standard_normal(C) * 0.1),
                      _init(name + "m", rng.standard_normal(C) * 0.1), _init(name + "v", rng.uniform(0.5, 2, C))])
        nodes.append(helper.make_node("BatchNormalization", [x, name + "s", name + "b", name + "m", name + "v"], [y]))

    inits.append(w("w0", (C, 8, 3, 3)))
    nodes += [helper.make_node("Conv", ["x", "w0"], ["c0"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c0"], ["r0"])]
    shortcut = "r0"
    for k in range(3):
        inits += [w(f"wa{k}", (C // 2, C, 1, 1)), w(f"wb{k}", (C, C // 2, 3, 3))]
        nodes += [helper.make_node("Conv", [shortcut, f"wa{k}"], [f"a{k}"]), helper.make_node("Relu", [f"a{k}"], [f"ar{k}"]),
                  helper.make_node("Conv", [f"ar{k}", f"wb{k}"], [f"b{k}"], pads=[1, 1, 1, 1])]
        bn(f"n{k}", f"b{k}", f"bn{k}")
        res = shortcut
        if k == 0:  # the projection: a convolution of the block's input, added in the other order
            inits.append(w("wp", (C, C, 1, 1)))
            nodes.append(helper.make_node("Conv", [shortcut, "wp"], ["p"]))
            res = "p"
        add = helper.make_node("Sum", [res, f"bn{k}"], [f"s{k}"]) if k == 0 else \
            helper.make_node("Add", [f"bn{k}", res], [f"s{k}"])
        nodes += [add, helper.make_node("Relu", [f"s{k}"], [f"r{k + 1}"])]
        shortcut = f"r{k + 1}"
    nodes.append(helper.make_node("Identity", ["r3"], ["y"]))
    outputs = ["y"]
    if read_after:
        nodes.append(helper.make_node("GlobalAveragePool", ["r1"], ["g"]))
        outputs += ["g", "r2"]
    return nodes, inits, outputs


@pytest.mark.parametrize("read_after", [False, True])
def test_residual_add_is_the_convolutions_post_op(read_after, capfd, tmp_path):
    """A ResNet's residual Add/Sum after a convolution (and BN folded into it), and the Relu after
    it, are the convolution's post-ops (oneDNN's Sum, then Relu: kernels.h, cpu_dnnl_conv_add):
    one DnnlConvAdd a block, no BlockedSteps, Add or Maximum; the shortcut's buffer becomes the
    output where nothing reads it afterwards (graph/fuse_conv_activation.h, kConvResidualFree: the
    report's process_dnnl_conv_adds_in_place), and stays as it is where something does (an output,
    a later reader). Outputs equal ORT's CPU EP, with cpu_dnnl_add=0 too. Broken by the Sum
    post-op left out or applied to the wrong buffer, or by a residual written over while it is
    still to be read."""
    import onnxruntime_mlx as om
    rng = np.random.default_rng(41)
    C = 32
    x = rng.standard_normal((1, 8, 14, 14)).astype(np.float32)
    nodes, inits, outputs = _resnet_stage(rng, C, read_after)
    prims = _run(nodes, {"x": x}, inits, capfd, 1e-4, 1e-4, outputs=outputs, runs=4)
    assert prims.get("DnnlConvAdd") == 3, prims
    assert not [k for k in prims if k.startswith(("BlockedSteps", "Add", "Maximum", "Compiled"))], prims
    off = _run(nodes, {"x": x}, inits, capfd, 1e-4, 1e-4, outputs=outputs, cpu_dnnl_add=0)
    assert "DnnlConvAdd" not in off, off
    # the in-place count of a fresh process (the report's counters are the process's)
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))],
                          [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs], inits)
    model = tmp_path / "m.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(model))
    report = tmp_path / "r.jsonl"
    code = f"""
import json, numpy as np, onnxruntime as ort, onnxruntime_mlx as om
x = np.load({str(tmp_path / "x.npy")!r})
s = ort.InferenceSession({str(model)!r}, sess_options=om.session_options("cpu", fallback=False, report_path={str(report)!r}))
want = ort.InferenceSession({str(model)!r}, providers=["CPUExecutionProvider"]).run(None, {{"x": x}})
for _ in range(6):
    got = s.run(None, {{"x": x}})
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)
del s
line = [json.loads(ln) for ln in open({str(report)!r}) if "process_dnnl_conv_adds" in ln][-1]
print(json.dumps([line["process_dnnl_conv_adds"], line["process_dnnl_conv_adds_in_place"]]))
"""
    np.save(tmp_path / "x.npy", x)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    adds, in_place = json.loads(out.stdout.strip().splitlines()[-1])
    assert adds >= 3 * 6, (adds, in_place)
    # every block's shortcut is free without later readers; with them, only the third block's
    # (the second's output is a graph output, the first's is read after the second block)
    if read_after:
        assert 0 < in_place <= adds // 3, (adds, in_place)
    else:
        assert in_place >= adds * 2 // 3, (adds, in_place)


def _winograd_graph(rng, mid, hw, classes):
    """A VGG-like stack: a first 3 x 3 convolution of 3 channels, two 3 x 3 stride-1 ones of
    `mid` channels (the second after a max pooling, with a residual Add), a fire module's 1 x 1
    and 3 x 3 expansions concatenated, a 1 x 1 classifier of `classes` channels, each with a
    Relu, and a global average pooling of the classifier's output; weights scaled as a trained
    network's (He)."""
    def w(name, m, c, k):
        return _init(name, rng.standard_normal((m, c, k, k)) * np.sqrt(2.0 / (c * k * k)))
    inits = [w("w0", mid, 3, 3), w("w1", mid, mid, 3), w("w2", mid, mid, 3), w("w3", mid, mid, 1), w("w4", mid, mid, 3),
             w("w5", classes, 2 * mid, 1)] + [_init(f"b{i}", rng.standard_normal(n) * 0.1)
                                               for i, n in enumerate([mid] * 5 + [classes])]
    p = [1, 1, 1, 1]
    nodes = [helper.make_node("Conv", ["x", "w0", "b0"], ["c0"], pads=p), helper.make_node("Relu", ["c0"], ["r0"]),
             helper.make_node("Conv", ["r0", "w1", "b1"], ["c1"], pads=p), helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("MaxPool", ["r1"], ["m1"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Conv", ["m1", "w2", "b2"], ["c2"], pads=p), helper.make_node("Add", ["c2", "m1"], ["a2"]),
             helper.make_node("Relu", ["a2"], ["r2"]),
             helper.make_node("Conv", ["r2", "w3", "b3"], ["c3"]), helper.make_node("Relu", ["c3"], ["r3"]),
             helper.make_node("Conv", ["r2", "w4", "b4"], ["c4"], pads=p), helper.make_node("Relu", ["c4"], ["r4"]),
             helper.make_node("Concat", ["r3", "r4"], ["cat"], axis=1),
             helper.make_node("Conv", ["cat", "w5", "b5"], ["c5"]), helper.make_node("Relu", ["c5"], ["y"]),
             helper.make_node("GlobalAveragePool", ["y"], ["gap"])]
    x = rng.standard_normal((1, 3) + hw).astype(np.float32)
    return nodes, inits, x


def _conv_reference(nodes, inits, x):
    """The graph of _winograd_graph in float64 (numpy): what the float32 runs are measured against."""
    vals = {"x": x.astype(np.float64)}
    vals.update({t.name: onnx.numpy_helper.to_array(t).astype(np.float64) for t in inits})
    for n in nodes:
        a = [vals[i] for i in n.input]
        if n.op_type == "Conv":
            xx, ww, bb = a
            k = ww.shape[2]
            pad = k // 2
            xp = np.pad(xx[0], ((0, 0), (pad, pad), (pad, pad)))
            H, W = xx.shape[2], xx.shape[3]
            cols = np.stack([xp[:, i:i + H, j:j + W] for i in range(k) for j in range(k)], 1)
            y = np.einsum("ckhw,ock->ohw", cols, ww.reshape(ww.shape[0], ww.shape[1], k * k)) + bb[:, None, None]
            out = y[None]
        elif n.op_type == "Relu":
            out = np.maximum(a[0], 0)
        elif n.op_type == "Add":
            out = a[0] + a[1]
        elif n.op_type == "Concat":
            out = np.concatenate(a, axis=1)
        elif n.op_type == "GlobalAveragePool":
            out = a[0].mean(axis=(2, 3), keepdims=True)
        else:  # MaxPool 2 x 2 / 2
            v = a[0]
            out = v.reshape(v.shape[0], v.shape[1], v.shape[2] // 2, 2, v.shape[3] // 2, 2).max(axis=(3, 5))
        vals[n.output[0]] = out
    return vals["y"], vals["gap"]


@pytest.mark.skipif(not _avx512_core(), reason="oneDNN's Winograd kernels and the 16-channel blocks are AVX-512's")
@pytest.mark.parametrize("mid,classes,hw", [(32, 10, (28, 28)), (64, 1000, (14, 18)), (24, 16, (16, 16))])
def test_winograd_convolutions_in_16_channel_blocks(mid, classes, hw, tmp_path):
    """Where every convolution's channels are multiples of 16 (a first layer's input and a last
    layer's output aside: graph/fuse_conv_activation.h, mark_blocked16_convs), the 3 x 3 stride-1
    ones on planes of 8 x 8 and more run as oneDNN's Winograd kernels (the report's process_dnnl_winograd_runs), all in 16-channel
    blocks, the run a kept walk (a classifier's padded last block pooled from its blocked buffer,
    not left to MLX: process_caller_replays); a network with a layer of 24 channels keeps oneDNN's own layout and direct kernels
    throughout. Outputs equal ORT's CPU EP, and lie as close to a float64 reference as the direct
    kernels' (cpu_dnnl_winograd=0, cpu_dnnl_blocked16=0) do: Winograd's F(2 x 2, 3 x 3) and
    F(4 x 4, 3 x 3) transforms cost no accuracy worth the name. Broken by a Winograd kernel's
    output written at another channel block or position, or by the 24-channel network mixing
    layouts."""
    rng = np.random.default_rng(mid + classes)
    nodes, inits, x = _winograd_graph(rng, mid, hw, classes)
    ref, ref_gap = _conv_reference(nodes, inits, x)
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))],
                          [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in ("y", "gap")], inits)
    model = tmp_path / "m.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(model))
    np.save(tmp_path / "x.npy", x)
    code = f"""
import json, sys, numpy as np, onnxruntime as ort, onnxruntime_mlx as om
x = np.load({str(tmp_path / "x.npy")!r})
opts = json.loads(sys.argv[1])
s = ort.InferenceSession({str(model)!r}, sess_options=om.session_options("cpu", fallback=False,
                         report_path={str(tmp_path / "r.jsonl")!r}, **opts))
for _ in range(8):
    y, gap = s.run(None, {{"x": x}})
np.save({str(tmp_path / "y.npy")!r}, y)
np.save({str(tmp_path / "gap.npy")!r}, gap)
del s
line = [json.loads(ln) for ln in open({str(tmp_path / "r.jsonl")!r}) if "process_dnnl_winograd_runs" in ln][-1]
print(json.dumps([line["process_dnnl_winograd_runs"], line["process_dnnl_convs"], line["process_caller_replays"]]))
"""

    def run(**opts):
        out = subprocess.run([sys.executable, "-c", code, json.dumps({k: str(v) for k, v in opts.items()})],
                             capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-3000:]
        return (json.loads(out.stdout.strip().splitlines()[-1]), np.load(tmp_path / "y.npy").astype(np.float64),
                np.load(tmp_path / "gap.npy").astype(np.float64))

    def rms_rel(y, r):
        return float(np.sqrt(((y - r) ** 2).mean() / (r ** 2).mean()))

    want, want_gap = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    (wino, convs, replays), y, gap = run()
    scale = float(np.abs(want).max())
    np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-5 * scale)
    np.testing.assert_allclose(gap, want_gap, rtol=1e-4, atol=1e-5 * scale)
    assert replays >= 4, replays  # the walk kept from the fourth run on
    (wino_off, convs_off, _), y_direct, gap_direct = run(cpu_dnnl_winograd=0, cpu_dnnl_blocked16=0)
    assert wino_off == 0 and convs_off == convs, (wino_off, convs_off, convs)
    if mid % 16:  # a 24-channel layer: no convolution changes layout or kernel
        assert wino == 0, wino
        np.testing.assert_array_equal(y, y_direct)
        return
    # three 3 x 3 stride-1 convolutions of `mid` channels, the second and third after the 2 x 2
    # pooling; Winograd's on planes of 8 x 8 and more; eight runs
    pooled = (hw[0] // 2, hw[1] // 2)
    assert wino == (1 + 2 * (min(pooled) >= 8)) * 8, (wino, convs)
    assert rms_rel(y, ref) <= max(2.0 * rms_rel(y_direct, ref), 2e-6), (rms_rel(y, ref), rms_rel(y_direct, ref))
    assert rms_rel(gap, ref_gap) <= max(2.0 * rms_rel(gap_direct, ref_gap), 2e-6)


@pytest.mark.skipif(not _avx512_core(), reason="the 16-channel blocks are AVX-512's")
@pytest.mark.parametrize("also_output", [False, True])
def test_convolutions_write_into_their_concatenation(also_output, capfd):
    """In 16-channel blocks an image's channels of one convolution are one run of a channel
    concatenation's buffer: a fire module's expansions (a 1 x 1 and a Winograd 3 x 3, each with
    its Relu) and an inception block's three branches are computed straight into their Concat
    (DnnlConvsConcat, graph/fuse_conv_activation.h kConcatOfConvs), no concatenation copy left;
    where a branch is also a graph output the Concat copies as before. Outputs equal ORT's CPU
    EP, with cpu_dnnl_concat_convs=0 too. Broken by a convolution written at another channel
    offset, or one left out of the buffer."""
    rng = np.random.default_rng(7)
    x = rng.standard_normal((1, 32, 15, 17)).astype(np.float32)

    def w(name, m, c, k):
        return _init(name, rng.standard_normal((m, c, k, k)) * np.sqrt(2.0 / (c * k * k)))
    inits = [w("ws", 16, 32, 1), w("e1", 32, 16, 1), w("e3", 48, 16, 3), w("b1", 16, 80, 1), w("b2", 32, 80, 3),
             w("b3", 16, 80, 5), w("wo", 16, 64, 3)] + [_init(f"bias{i}", rng.standard_normal(n) * 0.1)
                                                         for i, n in enumerate([16, 32, 48, 16, 32, 16, 16])]
    nodes = [helper.make_node("Conv", ["x", "ws", "bias0"], ["s"]), helper.make_node("Relu", ["s"], ["sr"]),
             helper.make_node("Conv", ["sr", "e1", "bias1"], ["c1"]), helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["sr", "e3", "bias2"], ["c3"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c3"], ["r3"]),
             helper.make_node("Concat", ["r1", "r3"], ["fire"], axis=1),
             helper.make_node("Conv", ["fire", "b1", "bias3"], ["d1"]),
             helper.make_node("Conv", ["fire", "b2", "bias4"], ["d2"], pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["fire", "b3", "bias5"], ["d3"], pads=[2, 2, 2, 2]),
             helper.make_node("Concat", ["d1", "d2", "d3"], ["inc"], axis=1),
             helper.make_node("Conv", ["inc", "wo", "bias6"], ["y"], pads=[1, 1, 1, 1])]
    outputs = ["y", "r3"] if also_output else ["y"]
    prims = _run(nodes, {"x": x}, inits, capfd, 1e-4, 1e-4, outputs=outputs, runs=4)
    # every Concat fused but the fire module's where r3 is an output too
    assert prims.get("DnnlConvsConcat") == (1 if also_output else 2), prims
    assert prims.get("DnnlBlockedConcat", 0) == (1 if also_output else 0), prims
    off = _run(nodes, {"x": x}, inits, capfd, 1e-4, 1e-4, outputs=outputs, cpu_dnnl_concat_convs=0)
    assert "DnnlConvsConcat" not in off and off.get("DnnlBlockedConcat") == 2, off


@pytest.mark.parametrize("channels,hw", [(32, (12, 12)), (48, (7, 9)), (64, (3, 70))])
@pytest.mark.parametrize("avx512", [1, 0])
def test_blocked_chains_are_one_kernel(channels, hw, avx512, capfd):
    """Elementwise steps between convolutions on their blocked outputs (a DenseNet's
    BatchNormalization -> Relu pre-activation after a concatenation, a per-channel Mul and Add, a
    residual Add -> Relu) run as the EP's kernel (kernels/cpu/blocked_steps.cc), each chain one
    BlockedSteps primitive over the blocked buffer (split over the threads, tiles of positions
    with the channel block's lanes), no MLX Multiply, Add, Maximum or generated kernel. Positions
    not a multiple of the tile's, channels of two and more blocks; NaN kept through the Relu.
    Outputs equal ORT's CPU EP (cpu_dnnl_add=0: the residual Add not the convolution's post-op).
    Broken by a step reading the wrong channel's parameter, a tile left out, or a chain computed
    as two kernels."""
    rng = np.random.default_rng(channels + hw[1])
    C, (H, W) = channels, hw
    x = rng.standard_normal((1, 16, H, W)).astype(np.float32)
    x[0, 3, 1, 2] = np.nan
    inits = [_init("w1", rng.standard_normal((C // 2, 16, 3, 3)) * 0.2),
             _init("w2", rng.standard_normal((C // 2, 16, 1, 1)) * 0.2),
             _init("w3", rng.standard_normal((C, C, 1, 1)) * 0.2), _init("w4", rng.standard_normal((C, C, 1, 1)) * 0.2),
             _init("s", rng.uniform(0.5, 2, C)), _init("bb", rng.standard_normal(C)), _init("mu", rng.standard_normal(C)),
             _init("var", rng.uniform(0.5, 2, C)), _init("m", rng.uniform(0.5, 1.5, (C, 1, 1))),
             _init("a", rng.standard_normal((1, C, 1, 1)))]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["x", "w2"], ["c2"]),
             helper.make_node("Concat", ["c1", "c2"], ["cat"], axis=1),
             helper.make_node("BatchNormalization", ["cat", "s", "bb", "mu", "var"], ["n"], epsilon=1e-3),
             helper.make_node("Relu", ["n"], ["r"]),
             helper.make_node("Conv", ["r", "w3"], ["c3"]),
             helper.make_node("Mul", ["c3", "m"], ["p"]), helper.make_node("Add", ["a", "p"], ["q"]),
             helper.make_node("Conv", ["q", "w4"], ["c4"]),
             helper.make_node("Add", ["c4", "c3"], ["t"]), helper.make_node("Relu", ["t"], ["y"])]
    prims = _run(nodes, {"x": x}, inits, capfd, 1e-4, 1e-4, unoptimized=True, cpu_avx512=avx512, cpu_fuse=1,
                 cpu_dnnl_add=0)
    if not (avx512 and _avx512()):  # (the kernel is AVX-512's: MLX's generated kernel elsewhere)
        assert "BlockedSteps" not in prims, prims
        return
    assert prims.get("BlockedSteps") == 3, prims
    assert not [k for k in prims if k.startswith(("Add", "Multiply", "Maximum", "Compiled"))], prims


@pytest.mark.parametrize("kernel,stride,pads,dil,act", [
    (3, 1, [1, 1, 1, 1], 1, None), (3, 2, [1, 1, 1, 1], 1, "Relu"), (5, 2, [2, 1, 0, 2], 1, None),
    (3, 1, [0, 0, 0, 0], 2, "Relu"), (7, 1, [3, 3, 3, 3], 1, None), (3, 3, [1, 1, 1, 1], 1, None)])
@pytest.mark.parametrize("avx512", [1, 0])
def test_depthwise_conv_is_the_eps_kernel(kernel, stride, pads, dil, act, avx512, capfd):
    """A 2-D depthwise convolution of small planes runs as one DepthwiseConv over NCHW
    (kernels/cpu/depthwise.cc; with cpu_dnnl=0 it takes any input), strides 1 and 2 vectorized,
    others scalar, with padding, dilation and bias; stride 1 16 outputs a step with AVX-512
    (cpu_avx512=1), 8 without; outputs equal ORT's CPU EP, and with cpu_depthwise=0 the kernel is
    not used."""
    rng = np.random.default_rng(kernel * 10 + stride)
    C, H, W = 12, 15, 21
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c" if act else "y"], group=C, kernel_shape=[kernel, kernel],
                              strides=[stride, stride], pads=pads, dilations=[dil, dil])]
    if act:
        nodes.append(helper.make_node(act, ["c"], ["y"]))
    inits = [_init("w", rng.standard_normal((C, 1, kernel, kernel))), _init("b", rng.standard_normal(C))]
    x = rng.standard_normal((2, C, H, W)).astype(np.float32)
    prims = _run(nodes, {"x": x}, inits, capfd, 1e-5, 1e-5, cpu_dnnl=0, cpu_avx512=avx512)
    assert prims.get("DepthwiseConv") == 1 and "Transpose" not in prims, prims
    off = _run(nodes, {"x": x}, inits, capfd, 1e-5, 1e-5, cpu_dnnl=0, cpu_depthwise=0)
    assert "DepthwiseConv" not in off, off


def test_depthwise_conv_after_a_channel_shuffle(capfd):
    """With oneDNN loaded, a depthwise convolution whose input is a channel shuffle (shufflenet's
    Reshape, Transpose, Reshape) runs as the EP's kernel over NCHW: oneDNN would reorder its input
    into its blocked layout and its output back. The kernel reads the planes where the
    transposed view leaves them: the last Reshape's copy is not evaluated (one Reshape, the
    first one's view, against two). Outputs equal ORT's CPU EP."""
    rng = np.random.default_rng(5)
    C, G = 24, 4
    nodes = [helper.make_node("Reshape", ["x", "s1"], ["r1"]), helper.make_node("Transpose", ["r1"], ["t"], perm=[0, 2, 1, 3, 4]),
             helper.make_node("Reshape", ["t", "s2"], ["r2"]),
             helper.make_node("Conv", ["r2", "w", "b"], ["y"], group=C, kernel_shape=[3, 3], pads=[1, 1, 1, 1])]
    inits = [onnx.numpy_helper.from_array(np.array([1, G, C // G, 14, 14], np.int64), "s1"),
             onnx.numpy_helper.from_array(np.array([1, C, 14, 14], np.int64), "s2"),
             _init("w", rng.standard_normal((C, 1, 3, 3))), _init("b", rng.standard_normal(C))]
    x = rng.standard_normal((1, C, 14, 14)).astype(np.float32)
    prims = _run(nodes, {"x": x}, inits, capfd, 1e-5, 1e-5)
    assert prims.get("DepthwiseConv") == 1 and "DnnlConvBlocked" not in prims and "DnnlUnblock" not in prims, prims
    assert prims.get("Reshape", 0) <= 1, prims


_OPENMP_PROBE = """
import json, sys, numpy as np, onnxruntime as ort, onnxruntime_mlx as om
from onnx import TensorProto, helper, numpy_helper
from onnxruntime_mlx.doctor import process_getenv
rng = np.random.default_rng(0)
w = numpy_helper.from_array(rng.standard_normal((16, 8, 3, 3)).astype(np.float32) * 0.1, "w")
g = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
                       helper.make_node("MaxPool", ["c"], ["p"], kernel_shape=[3, 3], strides=[2, 2]),
                       helper.make_node("Softmax", ["p"], ["y"], axis=-1)], "g",
                      [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8, 96, 96])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w])
m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
m.ir_version = 9
x = rng.standard_normal((2, 8, 96, 96)).astype(np.float32)
report = sys.argv[1]
s = ort.InferenceSession(m.SerializeToString(), sess_options=om.session_options("cpu", fallback=False, report_path=report))
for _ in range(3):
    y = s.run(None, {"x": x})[0]
ref = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
del s
line = next(json.loads(ln) for ln in open(report) if '"fused_node"' in ln)
print(json.dumps({"regions": line["process_openmp_regions"], "convs": line["process_dnnl_convs"],
                  "diff": float(np.abs(y - ref).max()), "spincount": process_getenv("GOMP_SPINCOUNT") or ""}))
"""


@pytest.mark.parametrize("env", [{}, {"ORT_MLX_CPU_OPENMP_POOL": "0"}, {"OMP_WAIT_POLICY": "PASSIVE"}])
def test_cpu_kernels_share_openmps_threads(env, tmp_path):
    """With oneDNN loaded, the EP's CPU kernels split their loops over OpenMP's threads (the ones
    oneDNN's convolutions run on), and libgomp's workers spin 5000 pauses between regions unless
    the user chose a wait policy; ORT_MLX_CPU_OPENMP_POOL=0 keeps the EP's own pool. Outputs equal
    ORT's CPU EP either way. Broken by the loops back on a separate pool, the spin count not set,
    or a user's OMP_WAIT_POLICY overridden."""
    import json
    import os
    import subprocess
    import sys
    if (os.cpu_count() or 1) < 2:
        pytest.skip("one core: the kernels do not split")
    base = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    out = subprocess.run([sys.executable, "-c", _OPENMP_PROBE, str(tmp_path / "r.jsonl")],
                         env={**base, **env}, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    if got["convs"] == 0:
        pytest.skip("oneDNN is not loaded here")
    assert got["diff"] < 1e-4, got
    if env.get("ORT_MLX_CPU_OPENMP_POOL") == "0":
        assert got["regions"] == 0, got
    else:
        assert got["regions"] >= 3, got  # the pooling and the softmax of each run, at least
    assert got["spincount"] == ("" if "OMP_WAIT_POLICY" in env else "5000"), got


@pytest.mark.parametrize("channels", [16, 24])
def test_affine_steps_fold_into_the_convolution(channels, capfd):
    """PP-LCNet's block: Conv, a scalar affine, HardSwish (as Add, Clip, Mul, Div), another scalar
    affine, Conv. oneDNN 2.6 cannot take both affines as post-ops (a linear post-op repeated with
    other constants computes with the first one's), so the first goes into the convolution's
    weight and bias (as ORT's Conv-Mul and Conv-Add fusions do) and HardSwish and the second
    affine are its post-ops: no elementwise primitive is left, the next convolution reads the
    output blocked and the one unblocking evaluated is the model's output's. 24 channels:
    channels-last on AVX-512 machines, a partial nChw16c block (unblocked as before) elsewhere.
    Outputs equal ORT's CPU EP. Broken by the first affine left as a post-op (the second then
    runs as MLX's Multiply and Add) or folded with the wrong constants."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((1, channels, 20, 20)).astype(np.float32)
    inits = [_init("w1", rng.standard_normal((channels, channels, 3, 3)) * 0.1),
             _init("w2", rng.standard_normal((channels, channels, 1, 1)) * 0.1)]
    inits += [_init(n, v) for n, v in (("a1", 1.1), ("b1", 0.1), ("three", 3.0), ("zero", 0.0), ("six", 6.0),
                                       ("a2", 0.9), ("b2", -0.2))]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Mul", ["c1", "a1"], ["m1"]), helper.make_node("Add", ["m1", "b1"], ["l1"]),
             helper.make_node("Add", ["l1", "three"], ["h1"]), helper.make_node("Clip", ["h1", "zero", "six"], ["h2"]),
             helper.make_node("Mul", ["l1", "h2"], ["h3"]), helper.make_node("Div", ["h3", "six"], ["h4"]),
             helper.make_node("Mul", ["h4", "a2"], ["m2"]), helper.make_node("Add", ["m2", "b2"], ["l2"]),
             helper.make_node("Conv", ["l2", "w2"], ["y"])]
    prims = _run(nodes, {"x": x}, inits, capfd, 1e-4, 1e-4)
    assert prims.get("DnnlConvBlocked") == 2, prims
    assert "Multiply" not in prims and "Add" not in prims, prims
    if channels % 16 == 0 or CHANNELS_LAST:
        assert prims.get("DnnlUnblock") == 1, prims


@pytest.mark.parametrize("scales,attrs,hw", [
    ((1, 1, 2, 2), {}, (10, 40)), ((1, 1, 2, 2), dict(coordinate_transformation_mode="half_pixel"), (7, 21)),
    ((1, 1, 3, 2), dict(coordinate_transformation_mode="asymmetric", nearest_mode="floor"), (5, 9)),
    ((1, 1, 2, 3), {}, (4, 33)), ((1, 1, 1.5, 2), {}, (6, 8))])
@pytest.mark.parametrize("avx512", [1, 0])
def test_nearest_upsampling_is_the_eps_kernel(scales, attrs, hw, avx512, capfd):
    """Resize in nearest mode by whole factors of H and W (an FPN's or a DB neck's upsampling)
    runs as one NearestUpsample over NCHW (kernels/cpu/upsample.cc: 16 inputs into 32 outputs a
    step with AVX-512 for a factor of 2 across, the rest element by element, rows copied down),
    under the coordinate modes that make every input repeat k times; a factor of 1.5 keeps MLX's
    form. Outputs equal ORT's CPU EP. Broken by a row written once for a factor of 2 down or a
    wrong permutation across."""
    rng = np.random.default_rng(len(attrs) + hw[1])
    x = rng.standard_normal((2, 3) + hw).astype(np.float32)
    nodes = [helper.make_node("Resize", ["x", "", "s"], ["y"], mode="nearest", **attrs)]
    prims = _run(nodes, {"x": x}, [_init("s", scales)], capfd, 0, 0, cpu_avx512=avx512)
    whole = all(float(v).is_integer() for v in scales)
    assert (prims.get("NearestUpsample") == 1) == whole, prims
    if whole:
        assert "Broadcast" not in prims and "Gather" not in prims, prims


@pytest.mark.parametrize("groups,bias,spatial", [(1, True, False), (1, False, False), (4, True, False), (1, True, True)])
def test_channel_affine_folds_into_the_convolution(groups, bias, spatial, capfd):
    """Conv, BatchNormalization (constant statistics), Mul and Add by per-channel constants
    ([C, 1, 1]; a scalar), Relu (inception's and most exported CNNs' blocks): the BN, Mul and Add
    go into the convolution's weight and bias (graph/fuse_conv_activation), as ORT's Conv-BN,
    Conv-Mul and Conv-Add fusions do, and the Relu is a post-op: the convolution is the one
    primitive computing (oneDNN's, or the pointwise kernel for groups). A Mul by a [1, H, W]
    constant scales positions, not channels, and stays a Multiply. Outputs equal ORT's CPU EP.
    Broken by a scale applied to the wrong output channel or the BN's mean left out."""
    rng = np.random.default_rng(11 + groups)
    C, M, H, W = 16 * groups, 32, 12, 12  # (16 input channels a group: the pointwise kernel's least)
    x = rng.standard_normal((1, C, H, W)).astype(np.float32)
    k = 1 if groups > 1 else 3
    inits = [_init("w", rng.standard_normal((M, C // groups, k, k)) * 0.2),
             _init("s", rng.uniform(0.5, 2, M)), _init("bb", rng.standard_normal(M)),
             _init("mu", rng.standard_normal(M)), _init("var", rng.uniform(0.5, 2, M)),
             _init("m", rng.uniform(0.5, 1.5, (1, H, W)) if spatial else rng.uniform(0.5, 1.5, (M, 1, 1))),
             _init("a", rng.standard_normal((M, 1, 1))), _init("half", 0.5)]
    if bias:
        inits.append(_init("b", rng.standard_normal(M)))
    nodes = [helper.make_node("Conv", ["x", "w", "b"] if bias else ["x", "w"], ["c"], group=groups,
                              pads=[k // 2] * 4),
             helper.make_node("BatchNormalization", ["c", "s", "bb", "mu", "var"], ["n"], epsilon=1e-3),
             helper.make_node("Mul", ["m", "n"], ["p"]), helper.make_node("Add", ["p", "a"], ["q"]),
             helper.make_node("Mul", ["q", "half"], ["r"]), helper.make_node("Relu", ["r"], ["y"])]
    prims = _run(nodes, {"x": x}, inits, capfd, 1e-4, 1e-4, unoptimized=True)
    conv = "PointwiseConv" if groups > 1 else "DnnlConvBlocked"
    assert prims.get(conv) == 1, prims
    elementwise = [p for p in prims if p.startswith("Compiled") or p in ("Multiply", "Add", "Maximum")]
    if spatial:
        assert elementwise, prims
    else:
        assert not elementwise, prims


@pytest.mark.parametrize("batch,cin,cout,k,hw,bias", [
    (1, 24, 24, (2, 2), (9, 21), True), (1, 24, 1, (2, 2), (16, 16), True), (2, 5, 3, (2, 2), (7, 40), False),
    (1, 8, 19, (2, 2), (3, 33), True), (1, 6, 4, (3, 3), (5, 7), True), (2, 4, 2, (1, 2), (4, 6), False),
    (1, 3, 2, (2, 3), (5, 18), True)])
@pytest.mark.parametrize("avx512", [1, 0])
def test_patch_deconvolution_is_the_eps_kernel(batch, cin, cout, k, hw, bias, avx512, capfd):
    """A 2-D ConvTranspose whose kernel equals its stride (a DB head's or a U-Net's upsampling)
    runs as one PatchDeconv over NCHW (kernels/cpu/patch_deconv.cc): eight, two and one output
    rows a pass with AVX-512 for kw = 2 (columns in blocks of 16 and a masked remainder), the
    scalar loop otherwise; with bias or without, batched. Outputs equal ORT's CPU EP; with
    cpu_patch_deconv=0 the kernel is not used. Broken by a wrong interleave of a patch's columns
    or a wrong weight index."""
    rng = np.random.default_rng(cin * 7 + cout)
    nodes = [helper.make_node("ConvTranspose", ["x", "w", "b"] if bias else ["x", "w"], ["y"], kernel_shape=list(k),
                              strides=list(k))]
    inits = [_init("w", rng.standard_normal((cin, cout) + k))] + ([_init("b", rng.standard_normal(cout))] if bias else [])
    x = rng.standard_normal((batch, cin) + hw).astype(np.float32)
    prims = _run(nodes, {"x": x}, inits, capfd, 1e-5, 1e-5, cpu_avx512=avx512)
    assert prims.get("PatchDeconv") == 1 and "Transpose" not in prims, prims
    off = _run(nodes, {"x": x}, inits, capfd, 1e-5, 1e-5, cpu_patch_deconv=0)
    assert "PatchDeconv" not in off, off


def test_squeeze_excitation_reads_the_blocked_output(capfd):
    """An SE block (MobileNetV3, PP-LCNet): a convolution's output x, its GlobalAveragePool, two
    1x1 convolutions, HardSigmoid, then x times that per-channel scale, then a convolution. The
    pooling reads x's blocked buffer (kernels.h, cpu_dnnl_blocked_global_mean) and the rescaling
    runs on it, so x is never unblocked: the one unblocking evaluated is the output's. Outputs
    equal ORT's CPU EP. Broken by the pooling reading NCHW again (x unblocked for it)."""
    rng = np.random.default_rng(9)
    x = rng.standard_normal((1, 32, 24, 24)).astype(np.float32)
    inits = [_init(n, rng.standard_normal(s) * 0.2) for n, s in
             (("w1", (32, 32, 3, 3)), ("w2", (8, 32, 1, 1)), ("w3", (32, 8, 1, 1)), ("w4", (16, 32, 1, 1)))]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"], pads=[1, 1, 1, 1]),
             helper.make_node("GlobalAveragePool", ["a"], ["p"]),
             helper.make_node("Conv", ["p", "w2"], ["q"]), helper.make_node("Relu", ["q"], ["r"]),
             helper.make_node("Conv", ["r", "w3"], ["t"]), helper.make_node("HardSigmoid", ["t"], ["h"]),
             helper.make_node("Mul", ["a", "h"], ["m"]),
             helper.make_node("Conv", ["m", "w4"], ["y"])]
    prims = _run(nodes, {"x": x}, inits, capfd, 1e-4, 1e-4, cpu_dnnl_min_flops=0)
    assert prims.get("DnnlUnblock") == 1, prims


@pytest.mark.parametrize("m,k,n", [(2, 16, 5), (7, 100, 47), (9, 600, 48), (16, 384, 100), (33, 40, 97), (3, 1030, 20),
                                   (1, 600, 100), (1, 40, 5), (1, 600, 500), (1, 1100, 1000), (200, 640, 1000)])
@pytest.mark.parametrize("op", ["MatMul", "MatMul3d", "Gemm", "GemmBias"])
@pytest.mark.parametrize("avx512", [1, 0])
def test_products_by_a_constant_are_the_packed_kernel(m, k, n, op, avx512, capfd):
    """Float32 rows times a constant matrix run as the EP's kernel (kernels/cpu/
    packed_gemm.cc: the weight laid out once as panels of 48 columns, 16 without AVX-512; 8 x 48
    and 6 x 16 register tiles, masked at the last panel's edge, K in blocks (of 512 here:
    cpu_packed_depth) summed into the output, rows in blocks of 128): one primitive, no MLX Matmul. Rows not a multiple of the
    tile's or past one row block, columns not a
    multiple of the panel's, K past one block, a batch of rows taken flat, one row (a decode
    step's MatMul; a Gemm of one row with alpha or beta stays the row kernel, and so does one of
    a weight over 2^20 elements; a Gemm of one row with a bias C takes the kernel, the bias its
    sums' start, no Add), and Gemm's transposed weight (read through its strides), alpha and C.
    Outputs equal ORT's CPU EP (float32 sums in another order)."""
    rng = np.random.default_rng(m * 1000 + n)
    w = rng.standard_normal((k, n)).astype(np.float32) / np.sqrt(k)
    if op.startswith("Gemm"):
        x = rng.standard_normal((m, k)).astype(np.float32)
        inits = [_init("w", w.T), _init("c", rng.standard_normal(n))]
        scales = {} if op == "GemmBias" else {"alpha": 0.5, "beta": 2.0}
        nodes = [helper.make_node("Gemm", ["x", "w", "c"], ["y"], transB=1, **scales)]
    else:
        x = rng.standard_normal((2, m, k) if op == "MatMul3d" else (m, k)).astype(np.float32)
        inits, nodes = [_init("w", w)], [helper.make_node("MatMul", ["x", "w"], ["y"])]
    prims = _run(nodes, {"x": x}, inits, capfd, 2e-5, 2e-5, cpu_avx512=avx512, cpu_packed_depth=512)
    if op.startswith("Gemm") and m == 1 and (op == "Gemm" or k * n > 1 << 20):
        assert prims.get("RowGemv") == 1 and "Matmul" not in prims, prims
    else:
        assert prims.get("PackedMatmul") == 1 and "Matmul" not in prims, prims
    if op == "GemmBias" and m == 1 and k * n <= 1 << 20:
        assert "Add" not in prims, prims


def test_products_by_an_activation_are_mlxs(capfd):
    """A product whose right operand is not a constant (attention's) stays MLX's Matmul: the
    kernel's layout of the weight is made once, for a buffer whose contents never change.
    With cpu_packed_matmul=0 a constant's product is MLX's too. Outputs equal ORT's CPU EP."""
    rng = np.random.default_rng(11)
    x = rng.standard_normal((16, 64)).astype(np.float32)
    b = rng.standard_normal((64, 32)).astype(np.float32)
    prims = _run([helper.make_node("MatMul", ["x", "b"], ["y"])], {"x": x, "b": b}, [], capfd, 2e-5, 2e-5)
    assert "PackedMatmul" not in prims and prims.get("Matmul") == 1, prims
    prims = _run([helper.make_node("MatMul", ["x", "w"], ["y"])], {"x": x}, [_init("w", b)], capfd, 2e-5, 2e-5,
                 cpu_packed_matmul=0)
    assert "PackedMatmul" not in prims and prims.get("Matmul") == 1, prims


@pytest.mark.parametrize("case", ["bias", "bias_first", "rows_symbolic", "read_twice", "bias_2d", "bias_input"])
def test_matmul_bias_add_is_the_kernels_start(case, capfd):
    """A MatMul by a constant whose output only an Add of a constant [N] reads takes that bias
    into the node (graph/fuse_matmul_bias): the packed kernel starts its sums from it, no Add
    primitive after it. ORT's own optimizer may first write the pair as a Gemm (between reshapes
    for 3-D rows), whose C of [N] the kernel starts from the same way (a C fed as an input too:
    it is read each run). Not fused: a product read by another node too, or a bias of another
    shape ([1, N] could change the output's rank). Outputs equal ORT's CPU EP."""
    rng = np.random.default_rng(23)
    x = rng.standard_normal((2, 5, 40)).astype(np.float32)
    inits = [_init("w", rng.standard_normal((40, 24)) / 6)]
    feeds = {"x": x}
    bias = rng.standard_normal((1, 24) if case == "bias_2d" else 24).astype(np.float32)
    if case == "bias_input":
        feeds["b"] = bias
    else:
        inits.append(_init("b", bias))
    add_in = ["b", "p"] if case == "bias_first" else ["p", "b"]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["p"]),
             helper.make_node("Add", add_in, ["y" if case != "read_twice" else "q"])]
    if case == "read_twice":
        nodes.append(helper.make_node("Mul", ["q", "p"], ["y"]))
    # rows_symbolic: a batch dim ORT's optimizer cannot see through, so the MatMul and the Add
    # reach the EP as they are
    shapes = {"x": ["n", 5, 40]} if case == "rows_symbolic" else None
    prims = _run(nodes, feeds, inits, capfd, 2e-5, 2e-5, shapes=shapes, cpu_fuse=1)
    assert prims.get("PackedMatmul") == 1, prims
    if case == "rows_symbolic":
        assert "Reshape" not in prims, prims  # no Gemm between reshapes: the EP's own fusion
    adds = sum(v for k, v in prims.items() if "Add" in k)
    assert adds == (1 if case in ("read_twice", "bias_2d") else 0), prims


def test_sibling_products_share_their_biases(capfd):
    """Two products of one input by constants, each with its bias Add (attention's q, k, v
    projections): the biases join their MatMuls first (graph/fuse_matmul_bias), then the
    siblings become one product with weights and biases concatenated (graph/fuse_matmuls): one
    packed kernel starting from both biases, no Add. Outputs equal ORT's CPU EP."""
    rng = np.random.default_rng(29)
    x = rng.standard_normal((3, 4, 32)).astype(np.float32)
    inits = [_init("w1", rng.standard_normal((32, 20)) / 6), _init("b1", rng.standard_normal(20)),
             _init("w2", rng.standard_normal((32, 20)) / 6), _init("b2", rng.standard_normal(20))]
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["p1"]), helper.make_node("Add", ["p1", "b1"], ["q1"]),
             helper.make_node("MatMul", ["x", "w2"], ["p2"]), helper.make_node("Add", ["b2", "p2"], ["q2"]),
             helper.make_node("Mul", ["q1", "q2"], ["y"])]
    prims = _run(nodes, {"x": x}, inits, capfd, 2e-5, 2e-5, shapes={"x": ["n", 4, 32]}, cpu_fuse=1)
    assert prims.get("PackedMatmul") == 1, prims
    assert not any("Add" in k for k in prims), prims


@pytest.mark.parametrize("perm,collapses", [([2, 0, 1, 3], True), ([0, 3, 2, 1], False)])
def test_reshape_reads_through_views(perm, collapses, capfd):
    """A Reshape after other views that keep the elements' order (Squeeze, Unsqueeze, a
    Transpose that moves only axes of size 1) reads their input instead
    (engine/translation.cc, shorten_reshape_chains): the views between drop out of the run's
    primitives. A Transpose that reorders axes of other sizes stays. Outputs equal ORT's CPU EP."""
    rng = np.random.default_rng(31)
    x = rng.standard_normal((1, 6, 1, 4)).astype(np.float32)
    inits = [onnx.numpy_helper.from_array(np.array([0, 1] if collapses else [0, 2], np.int64), "axes"),
             onnx.numpy_helper.from_array(np.array([3, 8], np.int64), "shape")]
    nodes = [helper.make_node("Transpose", ["x"], ["t"], perm=perm), helper.make_node("Squeeze", ["t", "axes"], ["q"]),
             helper.make_node("Reshape", ["q", "shape"], ["r"]), helper.make_node("Relu", ["r"], ["y"])]
    prims = _run(nodes, {"x": x}, inits, capfd, 0, 0)
    if collapses:
        assert "Transpose" not in prims and "Squeeze" not in prims and prims.get("Reshape") == 1, prims
    else:
        assert prims.get("Transpose") == 1, prims


@pytest.mark.parametrize("rows", [2, 33])
@pytest.mark.parametrize("avx512", ["1", "0"])
def test_prompt_attention_uses_the_cpu_kernels(rows, avx512, capfd):
    """Attention over several query rows (a prompt) on the CPU: with AVX-512 the EP's attention
    kernel (FusedAttention, one primitive); without (cpu_avx512=0) the explicit math with the
    EP's vectorized softmax (RowSoftmax) instead of MLX's fused attention, whose composed CPU
    form runs exp one lane at a time. Outputs equal ORT's CPU EP."""
    if avx512 == "1" and not _avx512_core():
        pytest.skip("no AVX-512 here")
    rng = np.random.default_rng(37)
    q, k, v = (rng.standard_normal((1, rows, 32)).astype(np.float32) for _ in range(3))
    nodes = [helper.make_node("MultiHeadAttention", ["q", "k", "v"], ["y"], domain="com.microsoft", num_heads=4)]
    prims = _run(nodes, {"q": q, "k": k, "v": v}, [], capfd, 1e-5, 1e-5, cpu_avx512=avx512)
    if avx512 == "1":
        assert prims.get("FusedAttention") == 1 and "Matmul" not in prims, prims
    else:
        assert prims.get("RowSoftmax") == 1 and "Softmax" not in prims, prims


def test_int4_prompt_products_are_the_packed_kernel(capfd):
    """MatMulNBits over a prompt's rows on the CPU: the weight dequantized once per program
    (exactly, as ORT's CPU EP does), then the EP's packed product kernel. Outputs equal ORT's
    CPU EP."""
    rng = np.random.default_rng(41)
    k, n, block = 64, 40, 32
    x = rng.standard_normal((1, 16, k)).astype(np.float32)
    b = rng.integers(0, 256, (n, k // block, block // 2), dtype=np.uint8)
    scales = (rng.random(n * (k // block)) * 0.1).astype(np.float32)
    inits = [onnx.numpy_helper.from_array(b, "b"), onnx.numpy_helper.from_array(scales, "s")]
    nodes = [helper.make_node("MatMulNBits", ["x", "b", "s"], ["y"], domain="com.microsoft", K=k, N=n, bits=4,
                              block_size=block)]
    prims = _run(nodes, {"x": x}, inits, capfd, 1e-5, 1e-5)
    assert prims.get("PackedMatmul") == 1 and "Matmul" not in prims, prims


@pytest.mark.parametrize("k", [512, 224, 96])
@pytest.mark.parametrize("avx512", ["1", "0"])
def test_int4_decode_rows_with_vnni(k, avx512, capfd):
    """A decode row's MatMulNBits in ORT's int8 form (accuracy_level 4, blocks of 32): with
    AVX-512 VNNI (cpu_avx512=1 on a CPU that has it) the panel kernel (Int4PanelGemv: the weight
    laid out once as panels of 16 outputs, the prompt kernel's copy; N = 40: a masked panel); with
    cpu_int4_gemm=0 the row kernel on ORT's bytes, four blocks a step through vpdpbusd, the blocks
    after the last whole group of four (K = 224: one group and three, K = 96: none) through the
    AVX2 kernel; with cpu_avx512=0 the AVX2 kernel alone. Outputs equal ORT's CPU EP within 1e-5
    relative to their scale. Broken by a code laid out against the wrong nibble, block or scale
    (each moved outputs by far more)."""
    from onnxruntime_mlx.doctor import cpu_flags
    if avx512 == "1" and not {"avx512f", "avx512bw", "avx512_vnni"} <= cpu_flags():
        pytest.skip("no AVX-512 VNNI here")
    rng = np.random.default_rng(k)
    n, block = 40, 32
    x = rng.standard_normal((1, k)).astype(np.float32)
    b = rng.integers(0, 256, (n, k // block, block // 2), dtype=np.uint8)
    scales = (rng.random(n * (k // block)) * 0.1).astype(np.float32)
    zp = rng.integers(0, 256, (n * ((k // block + 1) // 2),), dtype=np.uint8)
    inits = [onnx.numpy_helper.from_array(b, "b"), onnx.numpy_helper.from_array(scales, "s"),
             onnx.numpy_helper.from_array(zp, "z")]
    nodes = [helper.make_node("MatMulNBits", ["x", "b", "s", "z"], ["y"], domain="com.microsoft", K=k, N=n, bits=4,
                              block_size=block, accuracy_level=4)]
    scale = 30.0  # the outputs' magnitude for these inputs (|y| up to ~27 at K = 512)
    prims = _run(nodes, {"x": x}, inits, capfd, 0, 1e-5 * scale, cpu_avx512=avx512)
    assert prims.get("Int4PanelGemv" if avx512 == "1" else "Int4RowGemv") == 1, prims
    if avx512 == "1":
        prims = _run(nodes, {"x": x}, inits, capfd, 0, 1e-5 * scale, cpu_int4_gemm=0)
        assert prims.get("Int4RowGemv") == 1 and "Int4PanelGemv" not in prims, prims


def _attention_graph(case, rng):
    """An encoder's attention as exporters write it: Q [B, N, S, H], K^T through a Transpose of
    [B, N, T, H], scores scaled (Div or Mul by a constant), an additive mask [B, 1, 1, T],
    Softmax over the last axis, times V."""
    B, N, S, T, H, Hv = {"bert": (2, 3, 17, 17, 32, 32), "cross": (1, 2, 5, 37, 20, 72),
                         "rank3": (6, 1, 9, 9, 16, 16), "nan": (1, 2, 6, 6, 16, 16),
                         "nan_row": (1, 2, 12, 40, 48, 24), "wide_value": (1, 2, 9, 20, 16, 56)}[case]
    rank3 = case == "rank3"
    lead = (B * N,) if rank3 else (B, N)
    q = rng.standard_normal(lead + (S, H)).astype(np.float32)
    k = rng.standard_normal(lead + (T, H)).astype(np.float32)
    v = rng.standard_normal(lead + (T, Hv)).astype(np.float32)
    mask = np.where(rng.random((B, 1, 1, T)) < 0.3, -10000.0, 0.0).astype(np.float32)
    if case in ("nan", "nan_row"):
        q[0, 1, 2, 3] = np.nan  # one query row's scores all NaN
    if case == "nan":
        mask[0, 0, 0, :] = -np.inf  # and every key masked: NaN rows, as a softmax gives
    feeds = {"q": q, "k": k, "v": v}
    perm = [0, 2, 1] if rank3 else [0, 1, 3, 2]
    nodes = [helper.make_node("Transpose", ["k"], ["kt"], perm=perm), helper.make_node("MatMul", ["q", "kt"], ["s"])]
    if case == "cross":
        nodes.append(helper.make_node("Mul", ["c", "s"], ["sc"]))
        inits = [_init("c", 1 / np.sqrt(H))]
    else:
        nodes.append(helper.make_node("Div", ["s", "c"], ["sc"]))
        inits = [_init("c", np.sqrt(H))]
    if rank3:
        nodes.append(helper.make_node("Softmax", ["sc"], ["p"], axis=-1))
    else:
        feeds["mask"] = mask
        nodes += [helper.make_node("Add", ["sc", "mask"], ["sm"]), helper.make_node("Softmax", ["sm"], ["p"], axis=3)]
    nodes.append(helper.make_node("MatMul", ["p", "v"], ["y"]))
    return nodes, feeds, inits


@pytest.mark.skipif(not _avx512_core(), reason="the attention kernel is AVX-512's")
@pytest.mark.parametrize("case", ["bert", "cross", "rank3", "nan", "nan_row", "wide_value"])
def test_attention_is_one_kernel(case, capfd):
    """MatMul(Q, K^T) -> Div or Mul by a constant -> Add of a mask -> Softmax -> MatMul(., V) runs
    as one primitive (graph/fuse_attention, kernels/cpu/attention.cc): no Matmul, Softmax or
    elementwise primitive around it. Query rows not a multiple of the kernel's eight, keys and
    value widths not multiples of 16 (masked tails), K^T read through its strides (transposed
    in 16 x 16 blocks and edges), cross attention (S != T), rank 3, a NaN query row alone and
    among seven finite ones, a fully masked batch (NaN rows, as ORT's CPU EP gives), a value
    width whose last columns take four blocks of 16 (56: once left unwritten). With
    cpu_attention=0 the nodes run as before. Outputs equal ORT's CPU EP."""
    nodes, feeds, inits = _attention_graph(case, np.random.default_rng(41))
    prims = _run(nodes, feeds, inits, capfd, 2e-5, 2e-5)
    assert prims.get("FusedAttention") == 1 and "Matmul" not in prims and "RowSoftmax" not in prims, prims
    prims = _run(nodes, feeds, inits, capfd, 2e-5, 2e-5, cpu_attention=0)
    assert "FusedAttention" not in prims and prims.get("Matmul") == 2, prims


@pytest.mark.skipif(not _avx512_core(), reason="the attention kernel is AVX-512's")
def test_attention_writes_the_heads_side_by_side(capfd):
    """An encoder's attention followed by Transpose [0, 2, 1, 3] and the Reshape to [B, S, N Hv]
    before its output projection: the Transpose is fused into the attention node
    (graph/fuse_attention), whose kernel writes each head's rows where the heads lie side by
    side, so the Reshape is a view of its buffer: no Transpose primitive, and no copy before the
    projection. Outputs (the Reshape's and the projection's) equal ORT's CPU EP. Broken by rows
    written at the wrong place, or by the Transpose left in the graph."""
    rng = np.random.default_rng(47)
    nodes, feeds, inits = _attention_graph("bert", rng)
    B, N, S, Hv = 2, 3, 17, 32
    nodes[-1].output[0] = "o"
    nodes += [helper.make_node("Transpose", ["o"], ["t"], perm=[0, 2, 1, 3]),
              helper.make_node("Reshape", ["t", "shape"], ["y"]),
              helper.make_node("MatMul", ["y", "w"], ["z"])]
    inits += [onnx.numpy_helper.from_array(np.array([B, S, N * Hv], np.int64), "shape"),
              _init("w", rng.standard_normal((N * Hv, 24)) / 10)]
    prims = _run(nodes, feeds, inits, capfd, 2e-5, 2e-5, outputs=("y", "z"))
    # (the one Transpose left is K^T's view of K)
    assert prims.get("FusedAttention") == 1 and prims.get("Transpose") == 1, prims


def test_attention_read_elsewhere_is_not_fused(capfd):
    """Probabilities another node also reads (a ReduceMax added to the output) keep the nodes
    apart: the fused node would drop a value someone reads."""
    nodes, feeds, inits = _attention_graph("bert", np.random.default_rng(43))
    nodes[-1].output[0] = "o"
    nodes += [helper.make_node("ReduceMax", ["p"], ["pm"], axes=[-1], keepdims=1),
              helper.make_node("Add", ["o", "pm"], ["y"])]
    prims = _run(nodes, feeds, inits, capfd, 2e-5, 2e-5)
    assert "FusedAttention" not in prims and prims.get("Matmul") == 2, prims


@pytest.mark.parametrize("form", ["div_then_half", "half_first", "mul_inverse"])
def test_gelu_written_out_is_one_kernel(form, capfd):
    """0.5 x (1 + erf(x / sqrt 2)) as exporters write it (Div by sqrt 2 or Mul by its inverse;
    the 0.5 applied last or to x first) becomes one com.microsoft Gelu node (graph/fuse_gelu):
    one ErfGelu primitive, no Erf or elementwise primitive. With cpu_gelu=0 the nodes run as
    before. Outputs equal ORT's CPU EP."""
    rng = np.random.default_rng(47)
    x = (rng.standard_normal((4, 160)) * 3).astype(np.float32)
    nodes = [helper.make_node("Mul" if form == "mul_inverse" else "Div", ["x", "c"], ["d"]),
             helper.make_node("Erf", ["d"], ["e"]), helper.make_node("Add", ["one", "e"], ["a"])]
    if form == "half_first":
        nodes += [helper.make_node("Mul", ["half", "x"], ["h"]), helper.make_node("Mul", ["h", "a"], ["y"])]
    else:
        nodes += [helper.make_node("Mul", ["a", "x"], ["m"]), helper.make_node("Mul", ["m", "half"], ["y"])]
    inits = [_init("c", 1 / np.sqrt(2) if form == "mul_inverse" else np.sqrt(2)), _init("one", 1.0),
             _init("half", 0.5)]
    prims = _run(nodes, {"x": x}, inits, capfd, 1e-5, 1e-6)
    assert prims.get("ErfGelu") == 1 and not [k for k in prims if k.startswith(("Erf", "Comp", "Mul", "Div", "Add"))
                                              and k != "ErfGelu"], prims
    prims = _run(nodes, {"x": x}, inits, capfd, 1e-5, 1e-6, cpu_gelu=0)
    assert "ErfGelu" not in prims, prims


@pytest.mark.parametrize("avx512", [1, 0])
@pytest.mark.parametrize("rows,k,n,bias", [((2, 5), 40, 100, True), ((16,), 600, 64, True), ((1,), 64, 300, False),
                                           ((200,), 32, 96, True), ((3,), 16, 40, True)])
def test_product_gelu_is_applied_by_the_kernel(rows, k, n, bias, avx512, capfd):
    """A GELU after a product by a constant (its bias Add fused first: an encoder's feed-forward
    layer) joins the product (graph/fuse_matmul_bias, fuse_matmul_gelu): the packed kernel
    applies it to each tile as it stores it, one PackedMatmulGelu primitive and no ErfGelu.
    Rows of a batch taken flat with a ragged last panel, a depth over 512 (K blocks of 512
    here: the tiles' sums finished on the last block only), one row (the stream walk), 200 rows (the threads
    taking rows); under 256 outputs (3 x 40) the GELU stays MLX's ops after the product, as the
    unfused Gelu would run. The same bits as with cpu_product_gelu=0 (PackedMatmul, then
    ErfGelu), and ORT's CPU EP within 1e-5. Broken by the GELU applied before a tile's last K
    block, to a tile's columns past the product's, or not at all."""
    if avx512 and not _avx512():
        pytest.skip("no AVX-512 on this CPU")
    rng = np.random.default_rng(k * n)
    x = rng.standard_normal(rows + (k,)).astype(np.float32)
    inits = [_init("w", rng.standard_normal((k, n)) / np.sqrt(k)), _init("c", np.sqrt(2)), _init("one", 1.0),
             _init("half", 0.5)]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["p"])]
    if bias:
        inits.append(_init("b", rng.standard_normal(n)))
        nodes.append(helper.make_node("Add", ["p", "b"], ["q"]))
    v = "q" if bias else "p"
    nodes += [helper.make_node("Div", [v, "c"], ["d"]), helper.make_node("Erf", ["d"], ["e"]),
              helper.make_node("Add", ["e", "one"], ["a"]), helper.make_node("Mul", [v, "a"], ["m"]),
              helper.make_node("Mul", ["m", "half"], ["y"])]
    outs = []
    opts = dict(cpu_avx512=avx512, cpu_program_parallel_min_flops=0, cpu_dnnl_parallel_min_flops=0,
                cpu_packed_depth=512)
    fused = _run(nodes, {"x": x}, inits, capfd, 1e-5, 1e-5, keep=outs, **opts)
    apart = _run(nodes, {"x": x}, inits, capfd, 1e-5, 1e-5, keep=outs, cpu_product_gelu=0, **opts)
    if np.prod(rows) * n >= 256:
        assert apart.get("PackedMatmul") == 1 and apart.get("ErfGelu") == 1, apart
        assert fused.get("PackedMatmulGelu") == 1 and "PackedMatmul" not in fused, fused
        assert not [p for p in fused if p.startswith(("Erf", "Add", "Mul", "Div", "Comp"))], fused
    else:
        assert fused.get("PackedMatmul") == 1 and "PackedMatmulGelu" not in fused and "ErfGelu" not in fused, fused
    assert np.array_equal(outs[0][0], outs[1][0])


@pytest.mark.parametrize("form", ["plain", "alpha_c", "trans_b"])
def test_gemm_gelu_joins_the_product(form, capfd):
    """A Gemm followed by a GELU joins it as a MatMul does (fuse_matmul_gelu): with nothing after
    the kernel's sums (no C, alpha 1; or a transposed weight read through its strides) the kernel
    applies it (PackedMatmulGelu); with alpha and a C applied after the sums, the GELU comes after
    them (a PackedMatmul, its scaling and C, then ErfGelu's arithmetic). Outputs equal ORT's CPU EP
    and, to the bit, cpu_product_gelu=0's."""
    rng = np.random.default_rng(53)
    x = rng.standard_normal((24, 64)).astype(np.float32)
    w = (rng.standard_normal((64, 80)) / 8).astype(np.float32)
    inits = [_init("w", w.T if form == "trans_b" else w), _init("c", np.sqrt(2)), _init("one", 1.0),
             _init("half", 0.5)]
    attrs, ins = {}, ["x", "w"]
    if form == "alpha_c":
        inits.append(_init("bias", rng.standard_normal(80)))
        attrs, ins = {"alpha": 0.5}, ["x", "w", "bias"]
    if form == "trans_b":
        attrs = {"transB": 1}
    nodes = [helper.make_node("Gemm", ins, ["p"], **attrs), helper.make_node("Div", ["p", "c"], ["d"]),
             helper.make_node("Erf", ["d"], ["e"]), helper.make_node("Add", ["e", "one"], ["a"]),
             helper.make_node("Mul", ["p", "a"], ["m"]), helper.make_node("Mul", ["m", "half"], ["y"])]
    outs = []
    fused = _run(nodes, {"x": x}, inits, capfd, 1e-5, 1e-5, keep=outs, unoptimized=True)
    _run(nodes, {"x": x}, inits, capfd, 1e-5, 1e-5, keep=outs, unoptimized=True, cpu_product_gelu=0)
    if form == "alpha_c":
        assert fused.get("PackedMatmul") == 1 and fused.get("ErfGelu") == 1, fused
    else:
        assert fused.get("PackedMatmulGelu") == 1 and "ErfGelu" not in fused, fused
    assert np.array_equal(outs[0][0], outs[1][0])


@pytest.mark.parametrize("rows,k,block,zp", [(8, 512, 32, True), (37, 224, 32, False), (13, 320, 64, True),
                                             (16, 256, 128, True), (21, 200, 32, True), (3, 256, 32, True)])
def test_int4_prompt_rows_with_vnni(rows, k, block, zp, capfd):
    """Two or more rows (a prompt; 3: a batch of decode rows) of a MatMulNBits in ORT's int8 form
    (accuracy_level 4) on a CPU with AVX-512 VNNI: one Int4GemmVnni primitive (the rows quantized per block as MLAS does, integer sums per
    block by vpdpbusd, scaled per block), no dequantized weight or float product. Rows not a
    multiple of the tile's four, N = 40 (a masked panel), blocks of 32 to 128, K not a multiple
    of the block (200: the last block padded), zero points packed or absent. Outputs equal ORT's
    CPU EP within 1e-5 relative to their scale. With cpu_int4_gemm=0 the float form runs."""
    from onnxruntime_mlx.doctor import cpu_flags
    if not {"avx512f", "avx512bw", "avx512_vnni"} <= cpu_flags():
        pytest.skip("no AVX-512 VNNI here")
    rng = np.random.default_rng(rows * k + block)
    n, nb = 40, (k + block - 1) // block
    x = rng.standard_normal((rows, k)).astype(np.float32)
    b = rng.integers(0, 256, (n, nb, block // 2), dtype=np.uint8)
    scales = (rng.random(n * nb) * 0.1).astype(np.float32)
    inits = [onnx.numpy_helper.from_array(b, "b"), onnx.numpy_helper.from_array(scales, "s")]
    inputs = ["x", "b", "s"]
    if zp:
        inits.append(onnx.numpy_helper.from_array(rng.integers(0, 256, (n * ((nb + 1) // 2),), dtype=np.uint8), "z"))
        inputs.append("z")
    nodes = [helper.make_node("MatMulNBits", inputs, ["y"], domain="com.microsoft", K=k, N=n, bits=4,
                              block_size=block, accuracy_level=4)]
    scale = 30.0
    prims = _run(nodes, {"x": x}, inits, capfd, 0, 1e-5 * scale)
    assert prims.get("Int4GemmVnni") == 1 and "PackedMatmul" not in prims, prims
    prims = _run(nodes, {"x": x}, inits, capfd, 0, 1e-5 * scale, cpu_int4_gemm=0)
    assert "Int4GemmVnni" not in prims, prims


_PROMPT_THEN_STEPS = r"""
import json, sys, numpy as np, onnxruntime as ort, onnxruntime_mlx as om
from onnx import TensorProto as TP, helper, numpy_helper
report = sys.argv[1]
rng = np.random.default_rng(9)
k, n, block = 256, 72, 32
b = rng.integers(0, 256, (n, k // block, block // 2), dtype=np.uint8)
s = (rng.random(n * (k // block)) * 0.1).astype(np.float32)
node = helper.make_node("MatMulNBits", ["x", "b", "s"], ["y"], domain="com.microsoft", K=k, N=n, bits=4,
                        block_size=block, accuracy_level=4)
g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TP.FLOAT, ["rows", k])],
                      [helper.make_tensor_value_info("y", TP.FLOAT, None)],
                      [numpy_helper.from_array(b, "b"), numpy_helper.from_array(s, "s")])
m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
m.ir_version = 9
sess = ort.InferenceSession(m.SerializeToString(), sess_options=om.session_options(
    "cpu", fallback=False, report_path=report, log_level=3))
cpu = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
for rows in (9, 1, 1, 9, 1, 1, 1, 9):  # a prompt, decode steps, the next prompt
    x = rng.standard_normal((rows, k)).astype(np.float32)
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], cpu.run(None, {"x": x})[0], rtol=0, atol=3e-4)
del sess
line = next(json.loads(ln) for ln in open(report) if '"fused_node"' in ln)
print(json.dumps({"layouts": line["process_int4_panel_layouts"]}))
"""


def test_int4_prompts_and_steps_share_one_panel_copy(tmp_path):
    """A MatMulNBits (int8 blocks, AVX-512 VNNI) run as prompts of 9 rows and decode steps of one
    row, in one session: both signatures read the one panel layout of the weight the node
    prepared (Int4GemmVnni and Int4PanelGemv; after a prompt the steps' weights are the prompt's,
    still in the caches), made once for the node. Outputs equal ORT's CPU EP. Broken by a layout
    per signature or per kernel (two or more made)."""
    from onnxruntime_mlx.doctor import cpu_flags
    if not {"avx512f", "avx512bw", "avx512_vnni"} <= cpu_flags():
        pytest.skip("no AVX-512 VNNI here")
    out = subprocess.run([sys.executable, "-c", _PROMPT_THEN_STEPS, str(tmp_path / "r.jsonl")], capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "Int4GemmVnni=" in out.stderr and "Int4PanelGemv=" in out.stderr, out.stderr[-3000:]
    assert json.loads(out.stdout.strip().splitlines()[-1])["layouts"] == 1, out.stdout


@pytest.mark.parametrize("case", ["add_relu", "sum", "add_only", "broadcast"])
def test_residual_add_in_the_pointwise_tiles(case, capfd):
    """A grouped 1x1 convolution's residual Add (or two-input Sum), and the Relu after it, run in
    the pointwise kernel's tiles (graph/fuse_conv_activation's AddInput step): one PointwiseConv
    primitive, no Add or Maximum. A residual that broadcasts (a per-image channel mean) is added
    after the kernel. Outputs equal ORT's CPU EP."""
    rng = np.random.default_rng(53)
    C, G, HW = 64, 4, 12
    x = rng.standard_normal((2, C, HW, HW)).astype(np.float32)
    inits = [_init("w", rng.standard_normal((C, C // G, 1, 1)) * 0.2), _init("b", rng.standard_normal(C))]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], group=G)]
    r = "x"
    if case == "broadcast":
        nodes.insert(0, helper.make_node("ReduceMean", ["x"], ["r"], axes=[2, 3], keepdims=1))
        r = "r"
    nodes.append(helper.make_node("Sum" if case == "sum" else "Add", ["c", r], ["a" if case != "add_only" else "y"]))
    if case != "add_only":
        nodes.append(helper.make_node("Relu", ["a"], ["y"]))
    prims = _run(nodes, {"x": x}, inits, capfd, 1e-5, 1e-5)
    assert prims.get("PointwiseConv") == 1, prims
    fused = not [k for k in prims if k.startswith(("Add", "Maximum", "Compiled"))]
    assert fused == (case != "broadcast"), prims


@pytest.mark.parametrize("rows,acc4", [(3, False), (7, False), (3, True)])
def test_int4_few_rows_take_the_cpu_kernels(rows, acc4, capfd):
    """A few rows of a 4-bit MatMulNBits on the CPU (a batch of decode rows) never take MLX's
    quantized matmul (a scalar loop on the CPU): with int8 blocks on a VNNI CPU the integer
    kernel, otherwise the row kernel once a row. Outputs equal ORT's CPU EP."""
    from onnxruntime_mlx.doctor import cpu_flags
    vnni = {"avx512f", "avx512bw", "avx512_vnni"} <= cpu_flags()
    rng = np.random.default_rng(rows)
    k, n, block = 256, 40, 32
    x = rng.standard_normal((rows, k)).astype(np.float32)
    b = rng.integers(0, 256, (n, k // block, block // 2), dtype=np.uint8)
    scales = (rng.random(n * (k // block)) * 0.1).astype(np.float32)
    inits = [onnx.numpy_helper.from_array(b, "b"), onnx.numpy_helper.from_array(scales, "s")]
    nodes = [helper.make_node("MatMulNBits", ["x", "b", "s"], ["y"], domain="com.microsoft", K=k, N=n, bits=4,
                              block_size=block, accuracy_level=4 if acc4 else 0)]
    prims = _run(nodes, {"x": x}, inits, capfd, 0, 30 * 1e-5)
    assert "QuantizedMatmul" not in prims, prims
    if acc4 and vnni:
        assert prims.get("Int4GemmVnni") == 1, prims
    else:
        assert prims.get("Int4RowGemv") == rows, prims


@pytest.mark.parametrize("hw", [(64, 64), (45, 77)])
@pytest.mark.parametrize("avx512", [1, 0])
def test_nchw_channel_chains_are_one_kernel(hw, avx512, capfd):
    """A large NCHW activation (64K elements and more) through a per-channel Add (a DB head's
    ConvTranspose bias, exported as its own node), BatchNormalization and Relu runs as one
    BlockedSteps kernel over its channels' planes (kernels.h, cpu_channel_steps: a row a channel,
    its parameters broadcast; planes not a multiple of the 16-float step), split over the
    threads, instead of MLX's generated kernel on one thread; a NaN stays NaN through the Relu.
    A [C] operand broadcasts over W, not the channels, and is left to MLX. Outputs equal ORT's
    CPU EP. Broken by a plane given another channel's parameters or a tail left out."""
    rng = np.random.default_rng(hw[1])
    C, (H, W) = 24, hw
    x = rng.standard_normal((1, 48, H // 2, W // 2)).astype(np.float32)
    x[0, 5, 3, 4] = np.nan
    inits = [_init("w", rng.standard_normal((48, C, 2, 2)) * 0.2), _init("b", rng.standard_normal((C, 1, 1))),
             _init("s", rng.uniform(0.5, 2, C)), _init("bb", rng.standard_normal(C)),
             _init("mu", rng.standard_normal(C)), _init("var", rng.uniform(0.5, 2, C))]
    nodes = [helper.make_node("ConvTranspose", ["x", "w"], ["t"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Add", ["t", "b"], ["a"]),
             helper.make_node("BatchNormalization", ["a", "s", "bb", "mu", "var"], ["n"], epsilon=1e-5),
             helper.make_node("Relu", ["n"], ["y"])]
    x2 = x[:, :, : H // 2, : W // 2]
    prims = _run(nodes, {"x": x2}, inits, capfd, 1e-5, 1e-5, unoptimized=True, cpu_avx512=avx512, cpu_fuse=1)
    if not (avx512 and _avx512()):
        assert "BlockedSteps" not in prims, prims
        return
    assert prims.get("BlockedSteps") == 1, prims
    assert not [k for k in prims if k.startswith(("Add", "Multiply", "Maximum", "Compiled"))], prims
    w_row = [_init("r", rng.standard_normal(W // 2 * 2))]  # [W]: broadcast over the last axis
    nodes = [helper.make_node("ConvTranspose", ["x", "w"], ["t"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Add", ["t", "r"], ["y"])]
    prims = _run(nodes, {"x": x2}, inits[:1] + w_row, capfd, 1e-5, 1e-5, unoptimized=True, cpu_avx512=avx512)
    assert "BlockedSteps" not in prims, prims


_NEXT_PANELS = r"""
import json, sys, numpy as np, onnxruntime as ort, onnxruntime_mlx as om
from onnx import TensorProto as TP, helper, numpy_helper
rng = np.random.default_rng(5)
x = rng.standard_normal((200, 640)).astype(np.float32)
w = numpy_helper.from_array(rng.standard_normal((640, 48 * 6)).astype(np.float32) / 25, "w")
g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                      [helper.make_tensor_value_info("x", TP.FLOAT, [200, 640])],
                      [helper.make_tensor_value_info("y", TP.FLOAT, None)], [w])
m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
m.ir_version = 9
cpu = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
want = cpu.run(None, {"x": x})[0]
got = {}
for blocks, report in zip((0, 1), sys.argv[2:]):
    # one thread (no product splits): the walk is the whole product's
    s = ort.InferenceSession(m.SerializeToString(), sess_options=om.session_options(
        "cpu", fallback=False, report_path=report, cpu_packed_blocks=blocks, cpu_dnnl_parallel_min_flops=10**12,
        cpu_avx512=int(sys.argv[1]), cpu_packed_depth=512))
    for _ in range(3):
        np.testing.assert_allclose(s.run(None, {"x": x})[0], want, rtol=1e-4, atol=1e-4)
    del s
    line = next(json.loads(ln) for ln in open(report) if '"fused_node"' in ln)
    got[blocks] = line["process_packed_prefetch_bytes"]
print(json.dumps(got))
"""


@pytest.mark.parametrize("avx512", [1, 0])
def test_packed_tiles_ask_for_the_next_panel(avx512, tmp_path):
    """The packed kernel's blocked walk (cpu_packed_blocks=1, kernels/cpu/packed_gemm.cc): rows
    in blocks of 128 (200 rows: 16 and 9 tiles of 8 with AVX-512, 21 and 13 of 6 with AVX2),
    K in blocks of 512 (cpu_packed_depth; 640: 512 and 128), and every tile asks for its part of the next panel's
    K block into L2, so that a panel's first tile does not wait on memory. On one thread, per K
    block the first row block asks for all its panels (6 of 48 columns, or 18 of 16; the last
    one for the first panel again, read next by the second row block) and the second for one
    fewer; 3 runs. Outputs equal ORT's CPU EP with the walk and without it
    (cpu_packed_blocks=0: nothing asked for). Broken by a tile's part left out or asked twice,
    or by the walk dropped."""
    out = subprocess.run([sys.executable, "-c", _NEXT_PANELS, str(avx512), str(tmp_path / "a.jsonl"),
                          str(tmp_path / "b.jsonl")], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    r = json.loads(out.stdout.strip().splitlines()[-1])
    cols, panels = (48, 6) if avx512 and _avx512() else (16, 18)
    assert r == {"0": 0, "1": 3 * (2 * panels - 1) * 640 * cols * 4}, r


_HUGE_PANELS = r"""
import json, sys, numpy as np, onnxruntime as ort, onnxruntime_mlx as om
from onnx import TensorProto as TP, helper, numpy_helper
report = sys.argv[1]
rng = np.random.default_rng(4)
x = rng.standard_normal((4, 1024)).astype(np.float32)
nodes, inits = [], []
for name, n in (("big", 1536), ("small", 64)):
    inits.append(numpy_helper.from_array(rng.standard_normal((1024, n)).astype(np.float32) / 32, "w_" + name))
    nodes.append(helper.make_node("MatMul", ["x", "w_" + name], ["y_" + name]))
g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TP.FLOAT, [4, 1024])],
                      [helper.make_tensor_value_info("y_" + n, TP.FLOAT, None) for n in ("big", "small")], inits)
m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
m.ir_version = 9
s = ort.InferenceSession(m.SerializeToString(), sess_options=om.session_options("cpu", fallback=False, report_path=report))
cpu = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
for _ in range(3):
    for a, b in zip(s.run(None, {"x": x}), cpu.run(None, {"x": x})):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)
del s
line = next(json.loads(ln) for ln in open(report) if '"fused_node"' in ln)
print(json.dumps({k: line[k] for k in ("process_packed_matmuls", "process_packed_huge_page_bytes")}))
"""


@pytest.mark.skipif(not os.path.exists("/sys/kernel/mm/transparent_hugepage/enabled"),
                    reason="no transparent huge pages in this kernel")
def test_large_packed_weights_ask_for_huge_pages(tmp_path):
    """A constant weight's panels of 4 MiB and more (a 1024 x 1536 product's: 6 MiB) are
    allocated 2 MiB-aligned and advised into transparent huge pages before they are written
    (kernels/cpu/packed_gemm.cc: a one-row product streams the whole weight each call, and in
    4 KiB pages each page of it was a TLB miss). Outputs equal ORT's CPU EP (a small sibling
    product shares the kernel). Broken by the panels allocated as before (no bytes counted)."""
    out = subprocess.run([sys.executable, "-c", _HUGE_PANELS, str(tmp_path / "r.jsonl")], capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r["process_packed_matmuls"] >= 3, r
    # the whole 2 MiB pages inside the 6 MiB of panels (MLX's buffer starts anywhere in a page)
    assert r["process_packed_huge_page_bytes"] >= 2 * (2 << 20), r


_PANELS_ONCE = r"""
import json, sys, numpy as np, onnxruntime as ort, onnxruntime_mlx as om
from onnx import TensorProto as TP, helper, numpy_helper
report, prepared = sys.argv[1], int(sys.argv[2])
rng = np.random.default_rng(5)
inits = [numpy_helper.from_array(rng.standard_normal((256, 256)).astype(np.float32) / 16, "w%d" % i)
         for i in range(3)]
nodes = [helper.make_node("MatMul", ["x", "w0"], ["h0"]), helper.make_node("Relu", ["h0"], ["r0"]),
         helper.make_node("MatMul", ["r0", "w1"], ["h1"]), helper.make_node("Tanh", ["h1"], ["r1"]),
         helper.make_node("Gemm", ["r1", "w2"], ["y"], transB=1)]
g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TP.FLOAT, ["rows", 256])],
                      [helper.make_tensor_value_info("y", TP.FLOAT, None)], inits)
m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
m.ir_version = 9
s = ort.InferenceSession(m.SerializeToString(), sess_options=om.session_options(
    "cpu", fallback=False, report_path=report, cpu_packed_prepared=prepared))
cpu = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
for rows in (1, 2, 3, 1, 4, 2, 5, 6, 7, 8, 9, 1, 1, 1):  # new signatures (eager runs), then cached ones
    x = rng.standard_normal((rows, 256)).astype(np.float32)
    np.testing.assert_allclose(s.run(None, {"x": x})[0], cpu.run(None, {"x": x})[0], rtol=1e-4, atol=1e-5)
del s
line = next(json.loads(ln) for ln in open(report) if '"fused_node"' in ln)
print(json.dumps({k: line[k] for k in ("process_packed_matmuls", "process_packed_panel_layouts")}))
"""


@pytest.mark.skipif(oracle.DEVICE != "cpu", reason="the CPU device's packed kernel")
@pytest.mark.parametrize("prepared", [1, 0])
def test_constant_weights_are_laid_out_once_a_session(tmp_path, prepared):
    """Each constant weight of the packed products (two MatMuls, a Gemm's transposed B) is laid
    out as panels once for the session's program (ops/onnx/matmul.cc: prepared_panels), however
    many runs and new signatures follow: an eager run's primitives go with the run, and each
    laid every weight out again (a decode session's first prompt and first steps, ~50 ms each
    for a 60M model). Outputs equal ORT's CPU EP. Broken by the panels left to each primitive
    (a layout per weight and eager run: what cpu_packed_prepared=0 does)."""
    out = subprocess.run([sys.executable, "-c", _PANELS_ONCE, str(tmp_path / "r.jsonl"), str(prepared)],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r["process_packed_matmuls"] >= 2 * 14, r  # (a one-row Gemm without a bias goes to gemv)
    if prepared:
        assert r["process_packed_panel_layouts"] == 3, r
    else:
        assert r["process_packed_panel_layouts"] > 3, r


@pytest.mark.skipif(oracle.DEVICE != "cpu", reason="the CPU device's gate kernel")
@pytest.mark.parametrize("gate_first", [True, False])
def test_mlp_gate_is_one_kernel(gate_first, capfd):
    """A Llama MLP's gate, Sigmoid(g) -> Mul(g, .) -> Mul(., up), either operand order, is one
    SwiGlu primitive (graph/fuse_swiglu, kernels/cpu/unary.cc): 40 x 1536 values split over the
    threads, the sigmoid the EP's and the two products MLX's, so the output has the bits of the
    three ops apart (cpu_swiglu=0: the sigmoid kernel and two Multiply primitives) and equals
    ORT's CPU EP. A chain whose sigmoid is also read elsewhere (a graph output) stays apart."""
    import onnxruntime_mlx as om
    rng = np.random.default_rng(5)
    inits = [_init("wg", rng.standard_normal((64, 1536)) * 0.2), _init("wu", rng.standard_normal((64, 1536)) * 0.2)]
    silu = ["g", "s"] if gate_first else ["s", "g"]
    nodes = [helper.make_node("MatMul", ["x", "wg"], ["g"]), helper.make_node("MatMul", ["x", "wu"], ["u"]),
             helper.make_node("Sigmoid", ["g"], ["s"]), helper.make_node("Mul", silu, ["a"]),
             helper.make_node("Mul", ["a", "u"] if gate_first else ["u", "a"], ["y"])]
    feeds = {"x": rng.standard_normal((40, 64)).astype(np.float32)}
    prims = _run(nodes, feeds, inits, capfd, 1e-5, 1e-6)
    assert prims.get("SwiGlu") == 1 and "SigmoidMap" not in prims and "Multiply" not in prims, prims
    apart = _run(nodes, feeds, inits, capfd, 1e-5, 1e-6, cpu_swiglu=0)
    assert "SwiGlu" not in apart and apart.get("SigmoidMap") == 1 and apart.get("Multiply") == 2, apart
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [40, 64])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    outs = [ort.InferenceSession(model, sess_options=om.session_options("cpu", fallback=False, cpu_swiglu=o))
            .run(None, feeds)[0] for o in (1, 0)]
    assert np.array_equal(outs[0], outs[1])
    kept = _run(nodes, feeds, inits, capfd, 1e-5, 1e-6, outputs=("y", "s"))
    assert "SwiGlu" not in kept and kept.get("SigmoidMap") == 1, kept


_ROW_SPLITS = r"""
import json, sys, numpy as np, onnxruntime as ort, onnxruntime_mlx as om
from onnx import TensorProto as TP, helper, numpy_helper
rows, report = int(sys.argv[1]), sys.argv[2]
rng = np.random.default_rng(6)
nodes, inits = [], []
for name, m in (("tall", 300), ("short", 40)):
    inits.append(numpy_helper.from_array(rng.standard_normal((96, 200)).astype(np.float32) / 8, "w_" + name))
    nodes.append(helper.make_node("MatMul", ["x_" + name, "w_" + name], ["y_" + name]))
g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x_tall", TP.FLOAT, [300, 96]),
                                   helper.make_tensor_value_info("x_short", TP.FLOAT, [40, 96])],
                      [helper.make_tensor_value_info("y_" + n, TP.FLOAT, None) for n in ("tall", "short")], inits)
m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
m.ir_version = 9
feeds = {"x_tall": rng.standard_normal((300, 96)).astype(np.float32),
         "x_short": rng.standard_normal((40, 96)).astype(np.float32)}
s = ort.InferenceSession(m.SerializeToString(), sess_options=om.session_options(
    "cpu", fallback=False, report_path=report, cpu_packed_rows=rows, cpu_program_parallel_min_flops=0,
    cpu_dnnl_parallel_min_flops=0))
cpu = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
for _ in range(3):
    for a, b in zip(s.run(None, feeds), cpu.run(None, feeds)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)
del s
line = next(json.loads(ln) for ln in open(report) if '"fused_node"' in ln)
print(json.dumps({k: line[k] for k in ("process_packed_matmuls", "process_packed_row_splits")}))
"""


@pytest.mark.skipif(oracle.DEVICE != "cpu" or (os.cpu_count() or 1) < 2, reason="the CPU kernel's threads")
def test_packed_products_split_rows_where_each_thread_gets_a_row_block(tmp_path):
    """The packed kernel (cpu_packed_rows=64, its default; kernels/cpu/packed_gemm.cc): a product
    of 300 rows (64 and more for each of two threads) splits its rows over the threads, each
    thread all the panels; one of 40 rows keeps the threads on panels. 3 runs: 3 row splits among
    6 products; with cpu_packed_rows=0 none. Outputs equal ORT's CPU EP either way. Broken by the
    split dropped, or rows a thread computes twice or not at all."""
    got = {}
    for rows in (64, 0):
        out = subprocess.run([sys.executable, "-c", _ROW_SPLITS, str(rows), str(tmp_path / f"r{rows}.jsonl")],
                             capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-3000:]
        got[rows] = json.loads(out.stdout.strip().splitlines()[-1])
    assert got[64] == {"process_packed_matmuls": 6, "process_packed_row_splits": 3}, got
    assert got[0] == {"process_packed_matmuls": 6, "process_packed_row_splits": 0}, got


# Products through the packed kernel in a subprocess: argv = option (cpu_packed_stream,
# cpu_packed_ahead or cpu_packed_depth, else 512), its value, report path, cpu_avx512, shapes {name: [rows or "tile"/"tile+1"
# (the tile's rows: 8 with AVX-512, 6 with AVX2), K, N]} as JSON. Checks each output against
# float64, saves the outputs and prints the report's packed-kernel counters.
_PACKED_WALKS = r"""
import json, sys, numpy as np, onnxruntime as ort, onnxruntime_mlx as om
from onnx import TensorProto as TP, helper, numpy_helper
option, value, report, avx512 = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
rng = np.random.default_rng(7)
tile_rows = 8 if avx512 else 6
rows = lambda r: tile_rows if r == "tile" else tile_rows + 1 if r == "tile+1" else r  # noqa: E731
shapes = {name: (rows(r), k, n) for name, (r, k, n) in json.loads(sys.argv[5]).items()}
nodes, inits, inputs, feeds = [], [], [], {}
for name, (m, k, n) in shapes.items():
    inits.append(numpy_helper.from_array(rng.standard_normal((k, n)).astype(np.float32) / 8, "w_" + name))
    nodes.append(helper.make_node("MatMul", ["x_" + name, "w_" + name], ["p_" + name]))
    inits.append(numpy_helper.from_array(rng.standard_normal(n).astype(np.float32), "b_" + name))
    nodes.append(helper.make_node("Add", ["p_" + name, "b_" + name], ["y_" + name]))  # the fused bias
    inputs.append(helper.make_tensor_value_info("x_" + name, TP.FLOAT, [m, k]))
    feeds["x_" + name] = rng.standard_normal((m, k)).astype(np.float32)
g = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info("y_" + n, TP.FLOAT, None) for n in shapes],
                      inits)
m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
m.ir_version = 9
# (K in blocks of 512 unless the option is the depth: the 700-deep products take two)
s = ort.InferenceSession(m.SerializeToString(), sess_options=om.session_options(
    "cpu", fallback=False, report_path=report, **{"cpu_packed_depth": 512, option: value},
    cpu_program_parallel_min_flops=0, cpu_dnnl_parallel_min_flops=0, cpu_avx512=avx512))
w = {i.name: numpy_helper.to_array(i).astype(np.float64) for i in inits}
for _ in range(3):
    for name, got in zip(shapes, s.run(None, feeds)):
        want = feeds["x_" + name].astype(np.float64) @ w["w_" + name] + w["b_" + name]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=name)
outs = s.run(None, feeds)
del s
line = next(json.loads(ln) for ln in open(report) if '"fused_node"' in ln)
np.savez(report + ".npz", *outs)
print(json.dumps({k: line[k] for k in ("process_packed_matmuls", "process_packed_stream_walks",
                                         "process_packed_ahead_walks", "packed_default_depth")}))
"""


def _packed_walks(option, value, avx512, shapes, report):
    out = subprocess.run([sys.executable, "-c", _PACKED_WALKS, option, str(value), str(report), str(avx512),
                          json.dumps(shapes)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1]), np.load(str(report) + ".npz")


@pytest.mark.skipif(oracle.DEVICE != "cpu" or (os.cpu_count() or 1) < 2, reason="the CPU kernel's threads")
@pytest.mark.parametrize("avx512", [1, 0])
def test_one_row_tile_products_split_columns_in_sixteens(avx512, tmp_path):
    """The packed kernel's stream walk (cpu_packed_stream, kernels/cpu/packed_gemm.cc): products of
    one row tile (1, 3 and 8 rows; 6 with AVX2's tiles) split their columns over two threads in
    16-column vectors, AVX-512 panels at a boundary shared, each range over the whole depth; a
    row more keeps the blocked walk.
    4 runs of 5 products: 16 stream walks; with cpu_packed_stream=0 none. Outputs within 1e-5 of
    float64 either way, and the same bits where K fits one block. Broken by a window's columns
    computed twice or not at all, a window's masks or bias misplaced, or the walk not taken."""
    if avx512 and not _avx512():
        pytest.skip("no AVX-512 on this CPU")
    # (rows, K, N): columns split between two threads inside an AVX-512 panel of 48 (80: 3 + 2
    # vectors of 16; 200: 7 + 6, a panel's first vector on one thread, its other two on the other,
    # a last vector of 8 columns), a depth over the blocked walk's 512, rows up to the tile's, and
    # one row more (two row tiles: the blocked walk).
    shapes = {"a": [1, 64, 80], "b": [1, 700, 200], "c": [3, 96, 1000], "d": ["tile", 40, 16],
              "e": ["tile+1", 64, 200]}
    got, outs = {}, {}
    for ahead in (6144, 0):
        got[ahead], outs[ahead] = _packed_walks("cpu_packed_stream", ahead, avx512, shapes, tmp_path / f"s{ahead}.jsonl")
    assert {k: got[6144][k] for k in ("process_packed_matmuls", "process_packed_stream_walks")} == {
        "process_packed_matmuls": 20, "process_packed_stream_walks": 16}, got
    assert {k: got[0][k] for k in ("process_packed_matmuls", "process_packed_stream_walks")} == {
        "process_packed_matmuls": 20, "process_packed_stream_walks": 0}, got
    for i in (0, 2, 3, 4):  # K <= 512: one block either way
        assert np.array_equal(outs[6144][f"arr_{i}"], outs[0][f"arr_{i}"]), i


@pytest.mark.skipif(oracle.DEVICE != "cpu" or (os.cpu_count() or 1) < 2, reason="the CPU kernel's threads")
@pytest.mark.parametrize("avx512", [1, 0])
def test_tiles_of_several_row_tiles_ask_ahead(avx512, tmp_path):
    """cpu_packed_ahead (kernels/cpu/packed_gemm.cc): the tiles of a product of several row tiles
    ask for their panel's lines that many bytes ahead. Products of two row tiles with a ragged
    last panel, of a depth over 512 (the tiles accumulating over K blocks), of 200 rows (the
    threads taking rows), and one of one row tile (the stream walk, not counted): 4 runs of the 3
    counted products, 12 walks asking ahead; with cpu_packed_ahead=0 none. Asking must change no
    bit: the outputs equal those without it, and float64 within 1e-5. Broken by the option not
    reaching the kernel, or a tile whose lines ahead are read instead of asked for past its panel
    (the sanitizer runs of this file catch a read past the buffer)."""
    if avx512 and not _avx512():
        pytest.skip("no AVX-512 on this CPU")
    shapes = {"a": ["tile+1", 384, 200], "b": [16, 700, 100], "c": [200, 96, 1000], "d": ["tile", 64, 80]}
    got, outs = {}, {}
    for ahead in (6144, 0):
        got[ahead], outs[ahead] = _packed_walks("cpu_packed_ahead", ahead, avx512, shapes, tmp_path / f"a{ahead}.jsonl")
    assert got[6144]["process_packed_ahead_walks"] == 12 and got[0]["process_packed_ahead_walks"] == 0, got
    assert got[6144]["process_packed_matmuls"] == got[0]["process_packed_matmuls"] == 16, got
    for i in range(len(shapes)):
        assert np.array_equal(outs[6144][f"arr_{i}"], outs[0][f"arr_{i}"]), i


@pytest.mark.skipif(oracle.DEVICE != "cpu" or (os.cpu_count() or 1) < 2, reason="the CPU kernel's threads")
def test_packed_depth_follows_the_l2(tmp_path):
    """The packed kernel's K blocks are as deep as half the L2 holds for a row block of A (128
    rows) and a panel's block together, in multiples of 256 (cpu_packed_depth=0; 1536 with a
    2 MiB L2, 768 with 1 MiB): the report says which. Products of 1100 to 1700 deep and 200, 40
    or 16 rows (one block or two with 2 MiB; five to eight in blocks of 256) give float64's sums
    within 1e-5 at either depth. Broken by a depth not from the L2, or by blocks that leave part
    of K out or sum it twice."""
    # (glibc's sysconf, as the kernel asks it: Python's os.sysconf does not name the caches)
    got_l2 = subprocess.run(["getconf", "LEVEL2_CACHE_SIZE"], capture_output=True, text=True).stdout.strip()
    l2 = int(got_l2) if got_l2.isdigit() and int(got_l2) > 0 else 1 << 20
    want = min(max(l2 * 9 // 16 // (4 * (128 + 48)) // 256 * 256, 256), 4096)
    shapes = {"a": [200, 1100, 96], "b": [16, 1600, 100], "c": [40, 1700, 48]}
    got = {d: _packed_walks("cpu_packed_depth", d, 1 if _avx512() else 0, shapes, tmp_path / f"d{d}.jsonl")[0]
           for d in (0, 256)}
    assert got[0]["packed_default_depth"] == want and got[0]["process_packed_matmuls"] == 12, got
