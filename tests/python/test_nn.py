"""Conv, ConvTranspose, pooling, Resize and Upsample against ORT's CPU EP."""
import json

import numpy as np
import pytest

import onnxruntime_mlx as om
from onnx import TensorProto as TP, helper, numpy_helper
from oracle import DEVICE, check_node, make_node_model, placement_of, run_cpu, run_mlx

rng = np.random.default_rng(0)


def rand(shape, dtype=np.float32, lo=-1.0, hi=1.0):
    if np.issubdtype(dtype, np.integer):
        return rng.integers(int(lo), int(hi) + 1, size=shape).astype(dtype)
    return rng.uniform(lo, hi, size=shape).astype(dtype)


def check_half(op, inputs, attrs, initializers=None, opset=21, dtype=np.float16):
    """fp16 cases: ORT's CPU EP lacks most fp16 kernels, so the expected values come from the
    float32 model, rounded to fp16."""
    f32 = {k: v.astype(np.float32) for k, v in inputs.items()}
    i32 = {k: v.astype(np.float32) for k, v in (initializers or {}).items()}
    model = make_node_model(op, f32, 1, attrs, i32, opset)
    expected = [r.astype(dtype) for r in run_cpu(model, f32)]
    check_node(op, {k: v.astype(dtype) for k, v in inputs.items()}, attrs,
               initializers={k: v.astype(dtype) for k, v in (initializers or {}).items()},
               opset=opset, expected=expected)


def check_reference(op, inputs, attrs, initializers=None, opset=21, input_order=None):
    """Cases ORT's CPU EP has no kernel for (float64 Conv, ...): compare with ONNX's reference
    implementation instead."""
    from onnx.reference import ReferenceEvaluator
    model = make_node_model(op, inputs, 1, attrs, initializers, opset, input_order=input_order)
    expected = ReferenceEvaluator(model).run(None, inputs)
    check_node(op, inputs, attrs, initializers=initializers, opset=opset, expected=expected,
               input_order=input_order)


# --- Conv ---------------------------------------------------------------------------------

CONV_CASES = [
    # (x shape, w shape, attrs)
    ((1, 3, 10), (4, 3, 3), {}),
    ((2, 4, 11), (6, 2, 3), {"group": 2, "strides": [2], "pads": [1, 2]}),
    ((1, 4, 9), (4, 1, 3), {"group": 4, "dilations": [2], "pads": [2, 1]}),
    ((1, 4, 9), (4, 1, 3), {"group": 4, "auto_pad": "SAME_UPPER", "strides": [2]}),
    ((2, 3, 8, 9), (5, 3, 3, 3), {}),
    ((1, 3, 8, 9), (5, 3, 3, 2), {"pads": [1, 0, 2, 1], "strides": [2, 1]}),
    ((2, 4, 9, 9), (8, 2, 3, 3), {"group": 2, "dilations": [2, 1], "pads": [2, 1, 2, 1]}),
    ((1, 6, 7, 7), (6, 1, 3, 3), {"group": 6, "strides": [2, 2], "auto_pad": "SAME_LOWER"}),
    ((1, 3, 7, 8), (4, 3, 4, 3), {"auto_pad": "SAME_UPPER", "strides": [2, 3]}),
    ((1, 3, 7, 8), (4, 3, 3, 3), {"auto_pad": "VALID", "strides": [2, 2]}),
    ((1, 3, 8, 8), (4, 3, 1, 1), {"strides": [3, 3], "auto_pad": "SAME_UPPER"}),
    ((1, 2, 5, 6, 7), (3, 2, 3, 3, 3), {"pads": [1, 0, 1, 1, 2, 0]}),
    ((2, 4, 5, 6, 5), (4, 2, 2, 3, 2), {"group": 2, "strides": [1, 2, 1], "dilations": [2, 1, 1]}),
    ((1, 3, 6, 6, 6), (3, 1, 3, 3, 3), {"group": 3, "auto_pad": "SAME_LOWER"}),
]


@pytest.mark.parametrize("xs,ws,attrs", CONV_CASES)
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("cpu_dnnl", [1, 0])
def test_conv(xs, ws, attrs, bias, cpu_dnnl):
    """cpu_dnnl=1 (the default): on the CPU device oneDNN runs the float32 convolutions (these
    small ones too: cpu_dnnl_min_flops=0)."""
    inits = {"w": rand(ws)}
    if bias:
        inits["b"] = rand((ws[0],))
    check_node("Conv", {"x": rand(xs)}, attrs, initializers=inits, cpu_dnnl=cpu_dnnl, cpu_dnnl_min_flops=0)


def test_conv_chain_runs_through_onednn_on_the_cpu(tmp_path):
    """A Conv-Relu-Conv chain (strided, grouped, dilated, 1x1) gives ORT's CPU EP's outputs with
    cpu_dnnl on (with and without fuse_conv_activation) and off. On MLX's CPU device the report counts
    a oneDNN convolution per Conv and run only when cpu_dnnl is on (none fail), and the fused Relu
    is one array fewer a run; on the GPU neither option changes anything. Each convolution is
    above cpu_dnnl_min_flops (set to 1e5 here; 0, every size, by default); a small one after them
    stays the EP's own kernel."""
    rng = np.random.default_rng(3)
    w1, b1 = rng.standard_normal((16, 8, 3, 3)).astype(np.float32), rng.standard_normal(16).astype(np.float32)
    w2 = rng.standard_normal((32, 8, 3, 3)).astype(np.float32)  # groups of 8: oneDNN's direct kernel
    w3 = rng.standard_normal((32, 32, 1, 1)).astype(np.float32)
    w4 = rng.standard_normal((2, 32, 1, 1)).astype(np.float32)  # 2 x 64 x 2 x 256 flops: below
    g = helper.make_graph(
        [helper.make_node("Conv", ["x", "w1", "b1"], ["a"], strides=[2, 2], pads=[1, 1, 1, 1]),
         helper.make_node("Relu", ["a"], ["r"]),
         helper.make_node("Conv", ["r", "w2"], ["c"], group=2, dilations=[2, 2], pads=[2, 2, 2, 2]),
         helper.make_node("Conv", ["c", "w3"], ["d"]),
         helper.make_node("Conv", ["d", "w4"], ["y"])],
        "chain", [helper.make_tensor_value_info("x", TP.FLOAT, [2, 8, 32, 32])],
        [helper.make_tensor_value_info("y", TP.FLOAT, None)],
        [numpy_helper.from_array(v, n) for n, v in (("w1", w1), ("b1", b1), ("w2", w2), ("w3", w3), ("w4", w4))])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 9
    x = rng.standard_normal((2, 8, 32, 32)).astype(np.float32)
    ref = run_cpu(m, {"x": x})[0]
    counts, arrays = {}, {}
    for key, opts in (("fused", {"cpu_dnnl": 1}), ("unfused", {"cpu_dnnl": 1, "fuse_conv_activation": 0}),
                      ("off", {"cpu_dnnl": 0})):
        report = tmp_path / f"{key}.jsonl"
        s = om.InferenceSession(m.SerializeToString(), DEVICE, fallback=False, report_path=str(report),
                                cpu_dnnl_min_flops=100000, **opts)
        for _ in range(4):
            y = s.run(None, {"x": x})[0]
        del s
        line = next(json.loads(ln) for ln in report.read_text().splitlines() if '"fused_node"' in ln)
        counts[key], arrays[key] = line["process_dnnl_convs"], line["eval_arrays"]
        assert line["process_dnnl_failures"] == 0
        np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-3, err_msg=key)
    if DEVICE == "cpu":
        assert counts["fused"] >= 3 * 4, counts
        # 3 convolutions x 4 runs (the first run's probe too), never the small fourth
        assert counts["unfused"] == counts["fused"] + 3 * 4, counts
        assert counts["off"] == counts["unfused"], counts  # cpu_dnnl=0 ran none
        assert arrays["fused"] < arrays["unfused"], arrays
    else:
        assert counts["fused"] == counts["unfused"] == counts["off"] == 0, counts
        assert arrays["fused"] == arrays["unfused"], arrays


@pytest.mark.parametrize("pool", ["AveragePool", "MaxPool", "GlobalAveragePool", "GlobalMaxPool"])
@pytest.mark.parametrize("batch", [1, 2])
def test_convolutions_pooled_to_one_position(tmp_path, pool, batch):
    """A CNN's head: convolutions, then a pooling over the whole map to [N, C, 1, 1] and a
    classifier Gemm. On MLX's CPU device the pooling reads the convolution's blocked output, and
    its [N, C, 1, 1] lies in that layout as in ONNX's, so no reorder exists between them: its
    unblocking copies the bytes (it once asked oneDNN for the missing reorder and gave NaN, an
    inception's head). ORT's CPU EP's outputs, no oneDNN failure counted."""
    rng = np.random.default_rng(batch)
    w1 = (rng.standard_normal((32, 8, 3, 3)) * 0.3).astype(np.float32)
    w2 = (rng.standard_normal((64, 32, 1, 1)) * 0.3).astype(np.float32)
    fc = (rng.standard_normal((10, 64)) * 0.3).astype(np.float32)
    attrs = {"kernel_shape": [8, 8]} if pool in ("AveragePool", "MaxPool") else {}
    g = helper.make_graph(
        [helper.make_node("Conv", ["x", "w1"], ["a"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["a"], ["r"]),
         helper.make_node("Conv", ["r", "w2"], ["c"]), helper.make_node(pool, ["c"], ["p"], **attrs),
         helper.make_node("Flatten", ["p"], ["f"]), helper.make_node("Gemm", ["f", "fc"], ["y"], transB=1)],
        "head", [helper.make_tensor_value_info("x", TP.FLOAT, [batch, 8, 8, 8])],
        [helper.make_tensor_value_info("y", TP.FLOAT, None)],
        [numpy_helper.from_array(v, n) for n, v in (("w1", w1), ("w2", w2), ("fc", fc))])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 9
    x = rng.standard_normal((batch, 8, 8, 8)).astype(np.float32)
    ref = run_cpu(m, {"x": x})[0]
    report = tmp_path / "r.jsonl"
    s = om.InferenceSession(m.SerializeToString(), DEVICE, fallback=False, report_path=str(report))
    for _ in range(3):
        y = s.run(None, {"x": x})[0]
    del s
    line = next(json.loads(ln) for ln in report.read_text().splitlines() if '"fused_node"' in ln)
    assert line["process_dnnl_failures"] == 0
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-4)


def _activation_chain(steps):
    """Conv (8 -> 16 channels, 3x3 on 2 x 16 x 16) followed by `steps`, each an op of
    test_conv_activations_run_inside_the_convolution's list."""
    rng = np.random.default_rng(11)
    consts = {"k09": np.array([0.9], np.float32), "k05": np.array([0.5], np.float32),
              "k3": np.array(3, np.float32), "k0": np.array(0, np.float32), "k6": np.array(6, np.float32),
              "w": rng.standard_normal((16, 8, 3, 3)).astype(np.float32) * 0.3,
              "b": rng.standard_normal(16).astype(np.float32)}
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["v"], pads=[1, 1, 1, 1])]
    v = "v"
    for i, k in enumerate(steps.split("+")):
        o = f"s{i}"
        nodes += {
            "relu": lambda: [helper.make_node("Relu", [v], [o])],
            "lrelu": lambda: [helper.make_node("LeakyRelu", [v], [o], alpha=0.3)],
            "clip6": lambda: [helper.make_node("Clip", [v, "k0", "k6"], [o])],
            "clip3": lambda: [helper.make_node("Clip", [v, "k05", "k3"], [o])],
            "mul": lambda: [helper.make_node("Mul", ["k09", v], [o])],
            "add": lambda: [helper.make_node("Add", [v, "k05"], [o])],
            "hsig": lambda: [helper.make_node("HardSigmoid", [v], [o], alpha=0.2, beta=0.5)],
            "hswish": lambda: [helper.make_node("HardSwish", [v], [o])],
            "sigmoid": lambda: [helper.make_node("Sigmoid", [v], [o])],
            "tanh": lambda: [helper.make_node("Tanh", [v], [o])],
            "swish": lambda: [helper.make_node("Sigmoid", [v], [o + "s"]), helper.make_node("Mul", [v, o + "s"], [o])],
            # hard-swish as exporters write it
            "hsp": lambda: [helper.make_node("Add", [v, "k3"], [o + "t"]),
                            helper.make_node("Clip", [o + "t", "k0", "k6"], [o + "c"]),
                            helper.make_node("Mul", [v, o + "c"], [o + "m"]), helper.make_node("Div", [o + "m", "k6"], [o])],
        }[k]()
        v = o
    g = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TP.FLOAT, [2, 8, 16, 16])],
                          [helper.make_tensor_value_info(v, TP.FLOAT, None)],
                          [numpy_helper.from_array(a, n) for n, a in consts.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 9
    return m


@pytest.mark.parametrize("steps", ["relu", "mul+add+hsp", "hsig", "hswish", "swish", "sigmoid+tanh",
                                   "lrelu+relu", "clip6+clip3", "hsig+mul", "add+mul+clip6"])
def test_conv_activations_run_inside_the_convolution(tmp_path, steps):
    """The activation after a Conv (Relu, LeakyRelu, Clip, scalar Mul/Add, HardSigmoid, HardSwish
    as an op and as exporters write it, Sigmoid, Tanh, Swish, and chains of them) runs inside the
    oneDNN convolution on MLX's CPU device: ORT's CPU EP's outputs, and fewer arrays a run than
    with fuse_conv_activation=0 (fallback=False: every node on MLX). Chains that oneDNN 2.6 would compute wrongly as post-ops (a
    second clip or leaky relu with other parameters) keep those steps as MLX ops."""
    m = _activation_chain(steps)
    x = np.random.default_rng(12).standard_normal((2, 8, 16, 16)).astype(np.float32)
    ref = run_cpu(m, {"x": x})[0]
    arrays = {}
    for fuse in (1, 0):
        report = tmp_path / f"{fuse}.jsonl"
        s = om.InferenceSession(m.SerializeToString(), DEVICE, fallback=False, report_path=str(report),
                                fuse_conv_activation=fuse)
        for _ in range(3):
            y = s.run(None, {"x": x})[0]
        del s
        line = next(json.loads(ln) for ln in report.read_text().splitlines() if '"fused_node"' in ln)
        arrays[fuse] = line["eval_arrays"]
        assert line["process_dnnl_failures"] == 0
        np.testing.assert_allclose(y, ref, rtol=1e-5, atol=2e-5, err_msg=f"fuse_conv_activation={fuse}")
    if DEVICE == "cpu":
        assert arrays[1] < arrays[0], arrays
    else:
        assert arrays[1] == arrays[0], arrays


def test_small_convolutions_run_on_one_thread(tmp_path):
    """Below cpu_dnnl_parallel_min_flops (5e4 by default) a oneDNN convolution runs on MLX's
    stream thread alone (even an awake OpenMP worker costs more than it takes); above it, or
    with the threshold at 0, on all of them. Counted by the report's process-wide
    process_dnnl_one_thread_convs, which moves only for the two small convolutions here."""
    import os
    rng = np.random.default_rng(13)
    w1 = rng.standard_normal((4, 8, 3, 3)).astype(np.float32) * 0.2    # 2 x 288 x 25 = 14 kFLOP
    w2 = rng.standard_normal((16, 4, 3, 3)).astype(np.float32) * 0.2   # 2 x 576 x 25 = 29 kFLOP
    w3 = rng.standard_normal((64, 16, 3, 3)).astype(np.float32) * 0.1  # 2 x 9216 x 25 = 0.46 MFLOP
    g = helper.make_graph(
        [helper.make_node("Conv", ["x", "w1"], ["a"], pads=[1, 1, 1, 1]),
         helper.make_node("Conv", ["a", "w2"], ["b"], pads=[1, 1, 1, 1]),
         helper.make_node("Conv", ["b", "w3"], ["y"], pads=[1, 1, 1, 1])],
        "c", [helper.make_tensor_value_info("x", TP.FLOAT, [1, 8, 5, 5])],
        [helper.make_tensor_value_info("y", TP.FLOAT, None)],
        [numpy_helper.from_array(v, n) for n, v in (("w1", w1), ("w2", w2), ("w3", w3))])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 9
    x = rng.standard_normal((1, 8, 5, 5)).astype(np.float32)
    ref = run_cpu(m, {"x": x})[0]
    counts = []
    for key, opts in (("all", {"cpu_dnnl_parallel_min_flops": 0}), ("default", {}), ("all2", {"cpu_dnnl_parallel_min_flops": 0})):
        report = tmp_path / f"{key}.jsonl"
        opts["cpu_program_parallel_min_flops"] = 0  # (a program this small runs on one thread: below)
        s = om.InferenceSession(m.SerializeToString(), DEVICE, fallback=False, report_path=str(report), **opts)
        for _ in range(4):
            np.testing.assert_allclose(s.run(None, {"x": x})[0], ref, rtol=1e-4, atol=1e-4)
        del s
        line = next(json.loads(ln) for ln in report.read_text().splitlines() if '"fused_node"' in ln)
        counts.append((line["process_dnnl_one_thread_convs"], line["process_dnnl_convs"]))
    one = [c[0] for c in counts]
    if DEVICE != "cpu":
        assert one[0] == one[1] == one[2], counts
        return
    assert counts[1][1] - counts[0][1] == 3 * 4, counts  # every convolution through oneDNN, 4 runs
    assert one[2] == one[1], counts  # the threshold at 0: none on one thread
    threads = int(os.environ.get("OMP_NUM_THREADS") or len(os.sched_getaffinity(0)))
    assert one[1] - one[0] == (2 * 4 if threads > 1 else 0), counts  # the two small ones


def test_small_programs_run_on_one_thread(tmp_path):
    """A compiled signature whose kernels total under cpu_program_parallel_min_flops (4e6 by
    default) runs every one of them on one thread, even those above cpu_dnnl_parallel_min_flops:
    three convolutions of 0.5 MFLOP in all, each set to split (threshold 0), all on one thread
    (the report's process-wide process_dnnl_one_thread_convs, which moves by 3 a run); with the
    program threshold at 0 they split again."""
    rng = np.random.default_rng(14)
    ws = [rng.standard_normal(s).astype(np.float32) * 0.2 for s in ((4, 8, 3, 3), (16, 4, 3, 3), (64, 16, 3, 3))]
    g = helper.make_graph(
        [helper.make_node("Conv", ["x", "w0"], ["a"], pads=[1, 1, 1, 1]),
         helper.make_node("Conv", ["a", "w1"], ["b"], pads=[1, 1, 1, 1]),
         helper.make_node("Conv", ["b", "w2"], ["y"], pads=[1, 1, 1, 1])],
        "c", [helper.make_tensor_value_info("x", TP.FLOAT, [1, 8, 5, 5])],
        [helper.make_tensor_value_info("y", TP.FLOAT, None)],
        [numpy_helper.from_array(w, f"w{i}") for i, w in enumerate(ws)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 9
    x = rng.standard_normal((1, 8, 5, 5)).astype(np.float32)
    ref = run_cpu(m, {"x": x})[0]
    seen = {}
    for key, program in (("before", 0), ("small", None), ("split", 0)):
        opts = {"cpu_dnnl_parallel_min_flops": 0}
        if program is not None:
            opts["cpu_program_parallel_min_flops"] = program
        report = tmp_path / f"{key}.jsonl"
        s = om.InferenceSession(m.SerializeToString(), DEVICE, fallback=False, report_path=str(report), **opts)
        for _ in range(6):
            np.testing.assert_allclose(s.run(None, {"x": x})[0], ref, rtol=1e-4, atol=1e-4)
        del s
        line = next(json.loads(ln) for ln in report.read_text().splitlines() if '"fused_node"' in ln)
        seen[key] = (line["process_dnnl_one_thread_convs"], line["process_dnnl_convs"])
    if DEVICE != "cpu":
        return
    import os
    threads = int(os.environ.get("OMP_NUM_THREADS") or len(os.sched_getaffinity(0)))
    if threads == 1:
        return
    small = [a - b for a, b in zip(seen["small"], seen["before"])]
    split = [a - b for a, b in zip(seen["split"], seen["small"])]
    assert small == [3 * 6, 3 * 6], seen  # every run's convolutions, each on one thread
    assert split == [0, 3 * 6], seen  # ... and none when the program may split


@pytest.mark.parametrize("min_flops,through_dnnl", [(None, True), ("1000000", False)])
def test_conv_between_1e5_and_1e6_flops_goes_to_onednn_by_default(capfd, min_flops, through_dnnl):
    """A 3x3 convolution of 2 x 576 x 256 = 295K FLOPs (the size of a small OCR classifier's
    layers) runs through oneDNN (the DnnlConv primitive) under the default cpu_dnnl_min_flops
    (0: every size), and through MLX's convolution with the threshold at 1e6; ORT's CPU EP's
    outputs either way. On the GPU device oneDNN never runs."""
    import onnxruntime as ort
    rng = np.random.default_rng(5)
    w = rng.standard_normal((8, 8, 3, 3)).astype(np.float32)
    g = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])], "c",
                          [helper.make_tensor_value_info("x", TP.FLOAT, [1, 8, 16, 16])],
                          [helper.make_tensor_value_info("y", TP.FLOAT, None)], [numpy_helper.from_array(w, "w")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 9
    x = rng.standard_normal((1, 8, 16, 16)).astype(np.float32)
    opts = {} if min_flops is None else {"cpu_dnnl_min_flops": min_flops}
    s = ort.InferenceSession(m.SerializeToString(),
                             sess_options=om.session_options(DEVICE, fallback=False, log_level=3, **opts))
    capfd.readouterr()
    np.testing.assert_allclose(s.run(None, {"x": x})[0], run_cpu(m, {"x": x})[0], rtol=1e-4, atol=1e-4)
    evaluated = [ln for ln in capfd.readouterr().err.splitlines() if "evaluates:" in ln]
    assert evaluated
    ran = any("DnnlConv" in ln for ln in evaluated)
    assert ran == (through_dnnl and DEVICE == "cpu"), evaluated


@pytest.mark.parametrize("xs,ws,group,bias,relu", [
    ((2, 136, 7, 9), (136, 34, 1, 1), 4, True, True),   # shufflenet's grouped pointwise layer
    ((1, 24, 5, 6), (40, 24, 1, 1), 1, False, False),
    ((1, 12, 10), (18, 4, 1), 3, True, False),          # 1-D
    ((1, 8, 3, 4, 5), (8, 4, 1, 1, 1), 2, False, True),  # 3-D
])
def test_pointwise_conv_runs_as_one_product(capfd, xs, ws, group, bias, relu):
    """A 1x1 convolution (stride 1, no padding) that oneDNN does not take runs on MLX's CPU device
    as one batched product over NCHW as it lies: no transposes to NHWC and back, no convolution
    primitive; ORT's CPU EP's outputs, with its bias and a fused Relu."""
    import re
    import onnxruntime as ort
    rng = np.random.default_rng(7)
    inits = [numpy_helper.from_array(rng.standard_normal(ws).astype(np.float32), "w")]
    ins = ["x", "w"]
    if bias:
        inits.append(numpy_helper.from_array(rng.standard_normal(ws[0]).astype(np.float32), "b"))
        ins.append("b")
    nodes = [helper.make_node("Conv", ins, ["c" if relu else "y"], group=group)]
    if relu:
        nodes.append(helper.make_node("Relu", ["c"], ["y"]))
    g = helper.make_graph(nodes, "pw", [helper.make_tensor_value_info("x", TP.FLOAT, list(xs))],
                          [helper.make_tensor_value_info("y", TP.FLOAT, None)], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 9
    x = rng.standard_normal(xs).astype(np.float32)
    s = ort.InferenceSession(m.SerializeToString(),
                             sess_options=om.session_options(DEVICE, fallback=False, log_level=3, cpu_dnnl=0))
    capfd.readouterr()
    np.testing.assert_allclose(s.run(None, {"x": x})[0], run_cpu(m, {"x": x})[0], rtol=1e-4, atol=1e-4)
    evaluated = [ln for ln in capfd.readouterr().err.splitlines() if "evaluates:" in ln]
    assert evaluated
    if DEVICE == "cpu":
        assert not any(re.search(r"\b(Transpose|Convolution)\b", ln) for ln in evaluated), evaluated


def test_conv_weight_as_input_and_f64():
    check_node("Conv", {"x": rand((2, 3, 6, 6)), "w": rand((4, 3, 3, 3))}, {"pads": [1, 1, 1, 1]})
    check_reference("Conv", {"x": rand((1, 2, 6, 6), np.float64)}, {"pads": [1, 0, 1, 2]},
                    initializers={"w": rand((3, 2, 3, 3), np.float64), "b": rand((3,), np.float64)})


@pytest.mark.parametrize("xs,ws,attrs", [CONV_CASES[1], CONV_CASES[5], CONV_CASES[7], CONV_CASES[12]])
def test_conv_f64(xs, ws, attrs):
    """MLX's CPU conv accumulates float64 in float32; the EP takes an exact path instead."""
    check_reference("Conv", {"x": rand(xs, np.float64)}, attrs,
                    initializers={"w": rand(ws, np.float64), "b": rand((ws[0],), np.float64)})


def test_conv_kernel_shape_attribute_opset1():
    check_node("Conv", {"x": rand((1, 2, 6, 6))}, {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]},
               initializers={"w": rand((3, 2, 3, 3))}, opset=1)


@pytest.mark.parametrize("dtype", [np.float16])
def test_conv_half(dtype):
    check_half("Conv", {"x": rand((2, 4, 7, 7), lo=-0.5, hi=0.5)}, {"group": 2, "pads": [1, 1, 1, 1]},
               initializers={"w": rand((4, 2, 3, 3), lo=-0.5, hi=0.5), "b": rand((4,))},
               dtype=dtype)


def test_conv_dynamic_shapes():
    """One session, several batch/spatial sizes (the weight is a constant)."""
    w = rand((4, 3, 3, 3))
    for shape in [(1, 3, 8, 8), (3, 3, 5, 9)]:
        check_node("Conv", {"x": rand(shape)}, {"strides": [2, 2], "auto_pad": "SAME_UPPER"},
                   initializers={"w": w})


# --- ConvTranspose ------------------------------------------------------------------------

CONVT_CASES = [
    ((1, 3, 5), (3, 2, 3), {}),
    ((2, 4, 6), (4, 3, 3), {"strides": [2], "pads": [1, 0], "output_padding": [1], "group": 2}),
    ((1, 2, 4, 5), (2, 3, 3, 3), {}),
    ((2, 2, 4, 5), (2, 3, 3, 2), {"strides": [2, 3], "pads": [1, 0, 0, 1]}),
    ((1, 2, 4, 4), (2, 2, 3, 3), {"strides": [2, 2], "output_padding": [1, 0]}),
    ((1, 2, 4, 4), (2, 2, 3, 3), {"dilations": [2, 2], "pads": [2, 1, 1, 3]}),
    ((1, 4, 4, 4), (4, 1, 3, 3), {"group": 4, "strides": [2, 2]}),
    ((1, 4, 3, 3), (4, 2, 3, 3), {"group": 2, "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    ((1, 2, 3, 3), (2, 2, 3, 3), {"strides": [2, 2], "auto_pad": "SAME_UPPER"}),
    ((1, 2, 3, 3), (2, 2, 3, 3), {"strides": [2, 2], "auto_pad": "SAME_LOWER"}),
    ((1, 2, 3, 3), (2, 2, 3, 3), {"strides": [2, 2], "auto_pad": "VALID"}),
    ((1, 2, 3, 3), (2, 2, 3, 3), {"strides": [3, 2], "output_shape": [10, 8]}),
    ((1, 2, 3, 4), (2, 2, 3, 3), {"strides": [2, 2], "output_shape": [5, 8]}),
    ((1, 2, 3, 3), (2, 2, 2, 2), {"pads": [2, 2, 2, 2], "strides": [3, 3]}),
    ((1, 2, 3, 4, 3), (2, 2, 2, 3, 2), {"strides": [2, 1, 2], "pads": [0, 1, 0, 1, 0, 0]}),
    ((1, 4, 3, 3, 3), (4, 1, 2, 2, 2), {"group": 2, "strides": [2, 2, 2]}),
]


@pytest.mark.parametrize("xs,ws,attrs", CONVT_CASES)
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("cpu_dnnl", [1, 0])
def test_conv_transpose(xs, ws, attrs, bias, cpu_dnnl):
    """cpu_dnnl=1: on the CPU device through oneDNN's deconvolution where it takes the padding
    (these small ones too: cpu_dnnl_min_flops=0); MLX's path otherwise."""
    inits = {"w": rand(ws)}
    if bias:
        inits["b"] = rand((ws[1] * attrs.get("group", 1),))
    check_node("ConvTranspose", {"x": rand(xs)}, attrs, initializers=inits, cpu_dnnl=cpu_dnnl, cpu_dnnl_min_flops=0)


@pytest.mark.parametrize("group", [1, 2])
def test_conv_transpose_runs_through_onednn_on_the_cpu(tmp_path, group):
    """A stride-2 ConvTranspose with output_padding (an upsampling layer, as in OCR detectors)
    equals ORT's CPU EP; on MLX's CPU device the report counts it as a oneDNN run, on the GPU not."""
    rng = np.random.default_rng(5)
    w = rng.standard_normal((16, 8 // group, 4, 4)).astype(np.float32)
    b = rng.standard_normal(8).astype(np.float32)
    x = rng.standard_normal((1, 16, 16, 16)).astype(np.float32)
    m = make_node_model("ConvTranspose", {"x": x}, 1,
                        {"strides": [2, 2], "pads": [1, 1, 2, 2], "output_padding": [1, 1], "group": group},
                        {"w": w, "b": b}, opset=17)
    ref = run_cpu(m, {"x": x})[0]
    counts = []
    for on in (1, 0):
        report = tmp_path / f"r{on}.jsonl"
        s = om.InferenceSession(m.SerializeToString(), DEVICE, fallback=False, report_path=str(report), cpu_dnnl=on)
        for _ in range(3):
            y = s.run(None, {"x": x})[0]
        del s
        counts.append(next(json.loads(ln) for ln in report.read_text().splitlines() if '"fused_node"' in ln)["process_dnnl_convs"])
        np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-3)
    assert counts[1] - counts[0] == 0, counts  # cpu_dnnl=0 ran none
    if DEVICE == "cpu":
        assert counts[0] >= 3, counts
    else:
        assert counts[0] == 0, counts


def test_conv_transpose_half():
    check_half("ConvTranspose", {"x": rand((1, 2, 4, 4), lo=-0.5, hi=0.5)}, {"strides": [2, 2]},
               initializers={"w": rand((2, 3, 3, 3), lo=-0.5, hi=0.5)})


@pytest.mark.parametrize("xs,ws,attrs", [CONVT_CASES[3], CONVT_CASES[5], CONVT_CASES[14]])
def test_conv_transpose_f64(xs, ws, attrs):
    """group 1 only: ONNX's reference ConvTranspose mishandles groups."""
    check_reference("ConvTranspose", {"x": rand(xs, np.float64)}, attrs,
                    initializers={"w": rand(ws, np.float64)})


# --- Pooling ------------------------------------------------------------------------------

POOL_CASES = [
    ((1, 2, 9), {"kernel_shape": [3]}),
    ((2, 3, 10), {"kernel_shape": [3], "strides": [2], "pads": [1, 1]}),
    ((1, 2, 8, 9), {"kernel_shape": [3, 3]}),
    ((2, 2, 8, 9), {"kernel_shape": [3, 2], "strides": [2, 2], "pads": [1, 0, 1, 1]}),
    ((1, 2, 7, 7), {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1}),
    ((1, 2, 8, 8), {"kernel_shape": [2, 2], "strides": [2, 2], "ceil_mode": 1, "pads": [1, 1, 1, 1]}),
    ((1, 2, 9, 9), {"kernel_shape": [3, 3], "dilations": [2, 2]}),
    ((1, 2, 9, 10), {"kernel_shape": [2, 3], "dilations": [2, 1], "strides": [2, 3], "ceil_mode": 1}),
    ((1, 2, 7, 8), {"kernel_shape": [3, 3], "strides": [2, 2], "auto_pad": "SAME_UPPER"}),
    ((1, 2, 7, 8), {"kernel_shape": [2, 3], "strides": [2, 2], "auto_pad": "SAME_LOWER"}),
    ((1, 2, 7, 8), {"kernel_shape": [3, 3], "auto_pad": "VALID", "strides": [2, 1]}),
    ((1, 2, 5, 6, 7), {"kernel_shape": [2, 3, 2], "strides": [2, 1, 2], "pads": [0, 1, 0, 1, 1, 0]}),
    ((1, 1, 6, 6, 6), {"kernel_shape": [2, 2, 2], "dilations": [2, 2, 2], "ceil_mode": 1, "strides": [2, 2, 2]}),
]


@pytest.mark.parametrize("xs,attrs", POOL_CASES)
def test_max_pool(xs, attrs):
    check_node("MaxPool", {"x": rand(xs)}, attrs)


@pytest.mark.parametrize("xs,attrs", POOL_CASES)
@pytest.mark.parametrize("include_pad", [0, 1])
def test_average_pool(xs, attrs, include_pad):
    check_node("AveragePool", {"x": rand(xs)}, {**attrs, "count_include_pad": include_pad})


# Rows wide enough for the CPU pooling kernel's 8-lane blocks (kernels/cpu/pool.cc), odd widths
# for its scalar tails, stride 1 and 2 (the vector loads) and 3 (scalar).
WIDE_POOL_CASES = [
    ((1, 3, 40, 37), {"kernel_shape": [3, 3], "strides": [2, 2]}),
    ((2, 5, 29, 45), {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}),
    ((1, 4, 33, 50), {"kernel_shape": [2, 2], "strides": [2, 2], "ceil_mode": 1}),
    ((1, 2, 30, 41), {"kernel_shape": [3, 5], "strides": [1, 2], "dilations": [2, 2], "pads": [2, 0, 1, 3]}),
    ((1, 2, 27, 52), {"kernel_shape": [3, 3], "strides": [3, 3], "ceil_mode": 1, "pads": [1, 1, 1, 1]}),
    ((1, 3, 21, 34), {"kernel_shape": [3, 3], "strides": [2, 2], "auto_pad": "SAME_UPPER"}),
]


@pytest.mark.parametrize("xs,attrs", WIDE_POOL_CASES)
@pytest.mark.parametrize("op", ["MaxPool", "AveragePool"])
def test_wide_pools_run_the_cpu_kernel(xs, attrs, op, capfd):
    """float32 2-D MaxPool (no Indices) and AveragePool run as one pooling primitive on the CPU
    device (kernels/cpu/pool.cc), equal to ORT's CPU EP."""
    import re
    import onnxruntime as ort
    x = rand(xs)
    for include_pad in ([0] if op == "MaxPool" else [0, 1]):
        extra = {} if op == "MaxPool" else {"count_include_pad": include_pad}
        check_node(op, {"x": x}, {**attrs, **extra})
    model = make_node_model(op, {"x": x}, 1, attrs)
    sess = ort.InferenceSession(model.SerializeToString(), sess_options=om.session_options(DEVICE, fallback=False, log_level=3))
    capfd.readouterr()
    sess.run(None, {"x": x})
    evaluated = [line for line in capfd.readouterr().err.splitlines() if "evaluates:" in line]
    assert evaluated
    kernel = "MaxPool2d" if op == "MaxPool" else "AvgPool2d"
    if DEVICE == "cpu":
        assert any(re.search(rf"\b{kernel}\b", line) for line in evaluated), evaluated
    else:
        assert not any(kernel in line for line in evaluated), evaluated


# Planes whose output rows fit one AVX-512 register (kernels/cpu/pool.cc: out_w <= 16, stride_w
# 1 or 2): shufflenet's 3 x 3 stride-2 pools, a global 7 x 7 one, stride 1 with padding at 16
# outputs, dilation, ceil mode's partial window, a kernel wider than its stride.
NARROW_POOL_CASES = [
    ((1, 6, 28, 28), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    ((2, 4, 14, 14), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    ((1, 5, 7, 7), {"kernel_shape": [7, 7]}),
    ((1, 3, 9, 16), {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}),
    ((1, 2, 12, 13), {"kernel_shape": [3, 2], "strides": [1, 2], "dilations": [2, 3], "pads": [2, 1, 0, 1]}),
    ((1, 3, 11, 11), {"kernel_shape": [5, 5], "strides": [2, 2], "ceil_mode": 1, "pads": [0, 2, 1, 1]}),
]


@pytest.mark.parametrize("xs,attrs", NARROW_POOL_CASES)
@pytest.mark.parametrize("op", ["MaxPool", "AveragePool"])
def test_narrow_pools_in_avx512_registers(xs, attrs, op):
    """The narrow planes' pooling in AVX-512 registers gives the separable form's bits exactly
    (cpu_avx512=1 against 0, on a machine with AVX-512; padding counted in the average or not),
    and both equal ORT's CPU EP. Broken by a tap's lane mask off by one or a pad lane that is
    not the identity (0 for the sum, -inf for the max)."""
    x = rand(xs)
    for include_pad in ([0] if op == "MaxPool" else [0, 1]):
        a = {**attrs} if op == "MaxPool" else {**attrs, "count_include_pad": include_pad}
        model = make_node_model(op, {"x": x}, 1, a)
        want = run_cpu(model, {"x": x})[0]
        got = {}
        for avx512 in (1, 0):
            got[avx512] = run_mlx(model, {"x": x}, cpu_avx512=avx512)[0][0]
            np.testing.assert_allclose(got[avx512], want, rtol=1e-6, atol=1e-6)
        np.testing.assert_array_equal(got[1], got[0])


@pytest.mark.parametrize("xs,attrs", POOL_CASES[:6] + POOL_CASES[8:])
@pytest.mark.parametrize("p", [1, 2, 3])
def test_lp_pool(xs, attrs, p):
    check_node("LpPool", {"x": rand(xs)}, {**attrs, "p": p})


@pytest.mark.parametrize("xs,attrs", [POOL_CASES[i] for i in (1, 3, 4, 6, 7, 9, 11)])
@pytest.mark.parametrize("order", [0, 1])
def test_max_pool_indices(xs, attrs, order):
    x = rand(xs)
    check_node("MaxPool", {"x": x}, {**attrs, "storage_order": order}, outputs=2)


@pytest.mark.parametrize("dtype", [np.int8, np.uint8])
def test_max_pool_int(dtype):
    check_node("MaxPool", {"x": rand((1, 2, 7, 7), dtype, 0, 100)},
               {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "strides": [2, 2]})


def test_pool_half_and_f64():
    attrs = {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "strides": [2, 2]}
    check_half("MaxPool", {"x": rand((1, 2, 7, 7))}, attrs)
    check_half("AveragePool", {"x": rand((1, 2, 7, 7))}, attrs)
    check_reference("AveragePool", {"x": rand((1, 2, 7, 7), np.float64)}, attrs)
    check_node("MaxPool", {"x": rand((1, 2, 7, 7), np.float64)}, attrs)


def test_pool_old_opsets():
    x = rand((2, 3, 7, 7))
    check_node("MaxPool", {"x": x}, {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}, opset=1)
    check_node("AveragePool", {"x": x}, {"kernel_shape": [2, 2], "strides": [2, 2]}, opset=7)
    check_node("LpPool", {"x": x}, {"kernel_shape": [2, 2], "p": 3}, opset=11)


@pytest.mark.parametrize("op", ["GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool"])
@pytest.mark.parametrize("shape", [(2, 3, 7), (2, 3, 5, 6), (1, 2, 3, 4, 5)])
def test_global_pool(op, shape):
    check_node(op, {"x": rand(shape)})


def test_global_lp_pool_p():
    check_node("GlobalLpPool", {"x": rand((2, 3, 4, 5))}, {"p": 3})
    check_half("GlobalAveragePool", {"x": rand((2, 3, 4, 5))}, {})


# --- Resize / Upsample --------------------------------------------------------------------

COORD_MODES = ["half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners",
               "asymmetric", "tf_half_pixel_for_nn"]
NEAREST_MODES = ["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"]
EMPTY = np.array([], np.float32)


def resize(x, attrs, scales=None, sizes=None, roi=None, opset=19, runtime=False, reference=False):
    """Resize with scales or sizes as initializers (or, with runtime=True, as graph inputs).
    Absent roi/scales are omitted inputs from opset 13 on, empty tensors before."""
    empty = None if opset >= 13 else EMPTY
    params = {"roi": roi if roi is not None else empty,
              "scales": scales if scales is not None else empty}
    if sizes is not None:
        params["sizes"] = sizes
    order = ["x", "roi", "scales"] + (["sizes"] if sizes is not None else [])
    if reference:
        check_reference("Resize", {"x": x}, attrs, initializers=params, opset=opset, input_order=order)
    elif runtime:
        check_node("Resize", {"x": x, **params}, attrs, opset=opset, input_order=order)
    else:
        check_node("Resize", {"x": x}, attrs, initializers=params, opset=opset, input_order=order)


@pytest.mark.parametrize("coord", COORD_MODES)
@pytest.mark.parametrize("nearest", NEAREST_MODES)
@pytest.mark.parametrize("scales", [[1, 1, 2.0, 1.5], [1, 1, 0.6, 0.8], [1, 1, 1.7, 0.5]])
def test_resize_nearest(coord, nearest, scales):
    opset = 13 if coord == "tf_half_pixel_for_nn" else 19
    resize(rand((1, 2, 5, 6)), {"mode": "nearest", "coordinate_transformation_mode": coord,
                                "nearest_mode": nearest}, scales=np.array(scales, np.float32), opset=opset)


# (coordinate mode, nearest mode): pairs whose integer-factor taps are regular (half_pixel with
# floor is not: its first output row reads row 0 three times at 2x).
@pytest.mark.parametrize("coord,nearest", [("asymmetric", "floor"), ("half_pixel", "round_prefer_floor")])
@pytest.mark.parametrize("scales", [[1, 1, 2.0, 3.0], [1, 1, 0.5, 0.25], [1, 1, 2.0, 0.5]])
def test_resize_nearest_integer_factors_copy_without_a_gather(coord, nearest, scales, capfd):
    """Nearest resizing by integer factors (an FPN's 2x upsampling) reads the input in a regular
    pattern: a broadcast and a reshape (upsampling) or a strided slice (downsampling), not MLX's
    gather (several times slower on the CPU device). The outputs equal ORT's CPU EP and the
    evaluation runs no Gather primitive (log_level=3)."""
    import re
    import onnxruntime as ort
    params = {"roi": np.array([], np.float32), "scales": np.array(scales, np.float32)}
    attrs = {"mode": "nearest", "coordinate_transformation_mode": coord, "nearest_mode": nearest}
    x = rand((1, 3, 8, 12))
    check_node("Resize", {"x": x}, attrs, initializers=params, opset=19, input_order=["x", "roi", "scales"])
    model = make_node_model("Resize", {"x": x}, 1, attrs, initializers=params, opset=19,
                            input_order=["x", "roi", "scales"])
    sess = ort.InferenceSession(model.SerializeToString(), sess_options=om.session_options(DEVICE, fallback=False, log_level=3))
    capfd.readouterr()
    sess.run(None, {"x": x})
    err = capfd.readouterr().err
    evaluated = [line for line in err.splitlines() if "evaluates:" in line]
    assert evaluated, err[-2000:]
    assert not any(re.search(r"\bGather\b", line) for line in evaluated), evaluated


@pytest.mark.parametrize("coord", COORD_MODES[:5])
@pytest.mark.parametrize("mode", ["linear", "cubic"])
@pytest.mark.parametrize("sizes", [[1, 2, 9, 8], [1, 2, 3, 4], [1, 2, 8, 3]])
def test_resize_interpolate_sizes(coord, mode, sizes):
    resize(rand((1, 2, 5, 6)), {"mode": mode, "coordinate_transformation_mode": coord},
           sizes=np.array(sizes, np.int64))


@pytest.mark.parametrize("mode", ["linear", "cubic"])
@pytest.mark.parametrize("scales", [[1, 1, 2.0, 3.0], [1, 1, 0.5, 0.75]])
def test_resize_interpolate_scales(mode, scales):
    resize(rand((2, 3, 6, 8)), {"mode": mode}, scales=np.array(scales, np.float32))


@pytest.mark.parametrize("a,exclude", [(-0.5, 1), (-0.75, 1), (-0.6, 0)])
def test_resize_cubic_coeffs(a, exclude):
    resize(rand((1, 1, 6, 7)), {"mode": "cubic", "cubic_coeff_a": a, "exclude_outside": exclude},
           scales=np.array([1, 1, 0.7, 1.8], np.float32))


def test_resize_linear_ranks():
    resize(rand((5, 6)), {"mode": "linear"}, scales=np.array([1.5, 0.6], np.float32))
    resize(rand((4, 5, 6)), {"mode": "linear"}, sizes=np.array([6, 3, 9], np.int64))
    resize(rand((1, 2, 3, 4, 5)), {"mode": "linear"}, scales=np.array([1, 1, 2, 1.5, 0.8], np.float32))
    resize(rand((2, 5, 6, 3)), {"mode": "linear"}, scales=np.array([1, 2, 0.5, 1], np.float32))  # NHWC


@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
def test_resize_tf_crop_and_resize(mode):
    roi = np.array([0, 0, 0.2, -0.3, 1, 1, 0.9, 1.2], np.float32)
    resize(rand((1, 2, 6, 7)), {"mode": mode, "coordinate_transformation_mode": "tf_crop_and_resize",
                                "extrapolation_value": 9.0},
           sizes=np.array([1, 2, 5, 8], np.int64), roi=roi)


def test_resize_axes_and_policy():
    x = rand((1, 2, 5, 7))
    resize(x, {"mode": "nearest", "axes": [3, 2]}, scales=np.array([2.0, 0.6], np.float32))
    resize(x, {"mode": "linear", "axes": [-1]}, sizes=np.array([11], np.int64))
    for policy in ["not_larger", "not_smaller"]:
        resize(x, {"mode": "nearest", "axes": [2, 3], "keep_aspect_ratio_policy": policy},
               sizes=np.array([8, 9], np.int64))
        resize(x, {"mode": "linear", "axes": [2, 3], "keep_aspect_ratio_policy": policy},
               sizes=np.array([3, 3], np.int64))
    roi = np.array([0.1, 0.2, 0.8, 0.9], np.float32)
    resize(x, {"mode": "linear", "axes": [2, 3], "coordinate_transformation_mode": "tf_crop_and_resize"},
           sizes=np.array([4, 6], np.int64), roi=roi)


@pytest.mark.parametrize("mode", ["linear", "cubic"])
@pytest.mark.parametrize("exclude", [0, 1])
@pytest.mark.parametrize("scales", [[1, 1, 0.5, 0.4], [1, 1, 1.5, 0.7]])
def test_resize_antialias(mode, exclude, scales):
    resize(rand((1, 2, 9, 10)), {"mode": mode, "antialias": 1, "exclude_outside": exclude},
           scales=np.array(scales, np.float32))


@pytest.mark.parametrize("dtype", [np.int32, np.int8, np.uint8, np.int64, np.float64, np.uint16])
def test_resize_nearest_dtypes(dtype):
    x = rand((1, 2, 4, 5), np.int32, 0, 100).astype(dtype)
    ort_has_kernel = dtype in (np.int32, np.int8, np.uint8)
    resize(x, {"mode": "nearest"}, scales=np.array([1, 1, 1.5, 2], np.float32),
           reference=not ort_has_kernel)


def test_resize_half():
    x = rand((1, 2, 4, 5))
    for mode in ["nearest", "linear", "cubic"]:
        model_inits = {"roi": EMPTY, "scales": np.array([1, 1, 1.5, 2], np.float32)}
        m = make_node_model("Resize", {"x": x}, 1, {"mode": mode}, model_inits, 19)
        expected = [r.astype(np.float16) for r in run_cpu(m, {"x": x})]
        check_node("Resize", {"x": x.astype(np.float16)}, {"mode": mode}, initializers=model_inits,
                   opset=19, expected=expected, input_order=["x", "roi", "scales"])


def test_resize_runtime_scales_and_sizes():
    x = rand((1, 2, 4, 5))
    resize(x, {"mode": "linear"}, scales=np.array([1, 1, 2, 0.6], np.float32), runtime=True)
    resize(x, {"mode": "nearest"}, sizes=np.array([1, 2, 7, 3], np.int64), runtime=True)


def test_resize_opset10_and_11():
    x = rand((1, 2, 4, 5))
    check_node("Resize", {"x": x}, {"mode": "nearest"},
               initializers={"scales": np.array([1, 1, 2, 1.5], np.float32)}, opset=10)
    check_node("Resize", {"x": x}, {"mode": "linear"},
               initializers={"scales": np.array([1, 1, 0.5, 1.5], np.float32)}, opset=10)
    resize(x, {"mode": "cubic", "coordinate_transformation_mode": "align_corners"},
           scales=np.array([1, 1, 2, 2], np.float32), opset=11)


def test_resize_identity_and_empty():
    resize(rand((1, 2, 4, 5)), {"mode": "linear"}, scales=np.array([1, 1, 1, 1], np.float32))
    resize(rand((0, 2, 4, 5)), {"mode": "nearest"}, scales=np.array([1, 1, 2, 2], np.float32))


@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_upsample(mode):
    x = rand((1, 2, 3, 4))
    check_node("Upsample", {"x": x}, {"mode": mode, "scales": [1.0, 1.0, 2.0, 1.5]}, opset=7)
    check_node("Upsample", {"x": x}, {"mode": mode},
               initializers={"scales": np.array([1, 1, 3, 2], np.float32)}, opset=9)


def test_resize_linear_int_is_declined():
    model = make_node_model("Resize", {"x": rand((1, 1, 4, 4), np.int32, 0, 9)}, 1, {"mode": "linear"},
                            {"roi": EMPTY, "scales": np.array([1, 1, 2, 2], np.float32)}, 19)
    placed = placement_of(model, {"x": rand((1, 1, 4, 4), np.int32, 0, 9)})
    assert om.EP_NAME not in placed


# --- GridSample ---------------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
@pytest.mark.parametrize("padding", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align", [0, 1])
def test_grid_sample_2d(mode, padding, align):
    x = rand((2, 3, 5, 6))
    grid = rand((2, 4, 7, 2), lo=-1.6, hi=1.6)  # some samples fall outside the input
    check_node("GridSample", {"x": x, "grid": grid},
               {"mode": mode, "padding_mode": padding, "align_corners": align}, opset=20)


@pytest.mark.parametrize("mode", ["nearest", "linear"])
@pytest.mark.parametrize("padding", ["zeros", "border", "reflection"])
def test_grid_sample_3d(mode, padding):
    x = rand((1, 2, 4, 5, 3))
    grid = rand((1, 3, 2, 4, 3), lo=-1.4, hi=1.4)
    check_node("GridSample", {"x": x, "grid": grid}, {"mode": mode, "padding_mode": padding}, opset=20)


def test_grid_sample_opset16_names():
    x, grid = rand((1, 2, 4, 4)), rand((1, 3, 3, 2), lo=-1.2, hi=1.2)
    for mode in ["bilinear", "bicubic", "nearest"]:
        check_node("GridSample", {"x": x, "grid": grid}, {"mode": mode}, opset=16)


def test_empty_batch():
    x = np.zeros((0, 2, 5, 5), np.float32)
    check_node("Conv", {"x": x}, {"pads": [1, 1, 1, 1]}, initializers={"w": rand((4, 2, 3, 3))})
    check_node("ConvTranspose", {"x": x}, {"strides": [2, 2]}, initializers={"w": rand((2, 3, 3, 3))})
    check_node("MaxPool", {"x": x}, {"kernel_shape": [2, 2]})
    check_node("AveragePool", {"x": x}, {"kernel_shape": [2, 2], "pads": [1, 1, 1, 1]})
    check_node("GlobalAveragePool", {"x": x})
    check_node("GlobalMaxPool", {"x": x})
