"""Normalization ops against ORT's CPU EP (or ONNX's reference where ORT lacks a kernel)."""
import numpy as np
import pytest

from onnx import TensorProto

import onnxruntime_mlx as om
from oracle import check_model, check_node, make_node_model, placement_of, run_cpu

rng = np.random.default_rng(0)


def rand(shape, dtype=np.float32, lo=-2.0, hi=2.0):
    return rng.uniform(lo, hi, size=shape).astype(dtype)


def check_half(op, inputs, attrs, initializers=None, opset=21, outputs=1, dtype=np.float16):
    """fp16: ORT's CPU EP lacks most fp16 kernels, so the expected values come from the
    float32 model, rounded to fp16."""
    f32 = {k: v.astype(np.float32) for k, v in inputs.items()}
    i32 = {k: v.astype(np.float32) for k, v in (initializers or {}).items()}
    model = make_node_model(op, f32, outputs, attrs, i32, opset)
    expected = [r.astype(dtype) for r in run_cpu(model, f32)]
    check_node(op, {k: v.astype(dtype) for k, v in inputs.items()}, attrs, outputs=outputs,
               initializers={k: v.astype(dtype) for k, v in (initializers or {}).items()},
               opset=opset, expected=expected)


def check_reference(op, inputs, attrs, initializers=None, opset=21, outputs=1):
    from onnx.reference import ReferenceEvaluator
    model = make_node_model(op, inputs, outputs, attrs, initializers, opset)
    expected = ReferenceEvaluator(model).run(None, inputs)
    check_node(op, inputs, attrs, outputs=outputs, initializers=initializers, opset=opset,
               expected=expected)


# --- BatchNormalization -------------------------------------------------------------------

def bn_params(c, dtype=np.float32):
    return {"scale": rand((c,), dtype), "b": rand((c,), dtype), "mean": rand((c,), dtype),
            "var": rand((c,), dtype, 0.1, 2.0)}


@pytest.mark.parametrize("shape", [(4, 3), (2, 3, 7), (2, 3, 4, 5), (1, 3, 2, 3, 4)])
@pytest.mark.parametrize("opset", [9, 14, 15])
def test_batch_norm(shape, opset):
    check_node("BatchNormalization", {"x": rand(shape)}, {"epsilon": 1e-3},
               initializers=bn_params(shape[1]), opset=opset)


def test_batch_norm_params_as_inputs_and_old_opsets():
    x = rand((2, 3, 4, 5))
    check_node("BatchNormalization", {"x": x, **bn_params(3)})
    check_node("BatchNormalization", {"x": x}, initializers=bn_params(3), opset=7)


def test_batch_norm_half_and_f64():
    check_half("BatchNormalization", {"x": rand((2, 3, 4, 5))}, {}, initializers=bn_params(3))
    check_node("BatchNormalization", {"x": rand((2, 3, 4, 5), np.float64)},
               initializers=bn_params(3, np.float64))


def test_batch_norm_constant_statistics_fold_once(capfd):
    """Constant statistics (an inference graph's initializers): the per-channel scale and shift
    are computed once per program and a run is x * scale + shift, so its evaluation has no Rsqrt
    (log_level=3); statistics fed at run time keep the rsqrt in every run. Both equal ORT's CPU EP."""
    import re
    import onnxruntime as ort
    from oracle import DEVICE
    x, params = rand((2, 3, 4, 5)), bn_params(3)
    counts = {}
    for const in (True, False):
        inputs, inits = ({"x": x}, params) if const else ({"x": x, **params}, None)
        check_node("BatchNormalization", inputs, {"epsilon": 1e-3}, initializers=inits)
        model = make_node_model("BatchNormalization", inputs, 1, {"epsilon": 1e-3}, inits)
        sess = ort.InferenceSession(model.SerializeToString(),
                                    sess_options=om.session_options(DEVICE, fallback=False, log_level=3))
        capfd.readouterr()
        sess.run(None, inputs)
        lines = [ln for ln in capfd.readouterr().err.splitlines() if "evaluates:" in ln]
        assert lines
        counts[const] = sum(int(n) for ln in lines for n in re.findall(r"\bRsqrt=(\d+)", ln))
    assert counts == {True: 0, False: 1}, counts


def test_batch_norm_training_runs_on_mlx():
    # Batch statistics + running mean/var (more cases in test_nn_extra.py).
    m = make_node_model("BatchNormalization", {"x": rand((2, 3, 4))}, 3, {"training_mode": 1},
                        bn_params(3), 15, output_types=[TensorProto.FLOAT] * 3)
    check_model(m, {"x": rand((2, 3, 4))})


# --- LayerNormalization / RMSNormalization ------------------------------------------------

LN_CASES = [((2, 3, 8), -1), ((2, 3, 8), -2), ((2, 3, 8), 0), ((4, 6), 1), ((2, 3, 4, 5), 2),
            ((3, 5), 0)]


@pytest.mark.parametrize("shape,axis", LN_CASES)
@pytest.mark.parametrize("bias", [False, True])
def test_layer_norm(shape, axis, bias):
    norm = shape[axis:]
    inits = {"scale": rand(norm)}
    if bias:
        inits["b"] = rand(norm)
    check_node("LayerNormalization", {"x": rand(shape)}, {"axis": axis, "epsilon": 1e-4},
               initializers=inits, opset=17)


@pytest.mark.parametrize("shape,axis", LN_CASES[:3])
def test_layer_norm_stats_outputs(shape, axis):
    norm = shape[axis:]
    check_node("LayerNormalization", {"x": rand(shape)}, {"axis": axis}, outputs=3,
               initializers={"scale": rand(norm), "b": rand(norm)}, opset=17)


def test_layer_norm_broadcast_scale_and_dtypes():
    x = rand((2, 3, 8))
    check_node("LayerNormalization", {"x": x}, {"axis": -2},
               initializers={"scale": rand((1, 8)), "b": rand((3, 1))}, opset=17)
    check_half("LayerNormalization", {"x": x}, {}, initializers={"scale": rand((8,)), "b": rand((8,))},
               opset=17)
    check_half("LayerNormalization", {"x": x}, {"axis": 1}, initializers={"scale": rand((3, 8))},
               opset=17)
    check_node("LayerNormalization", {"x": x.astype(np.float64)}, {"axis": -1},
               initializers={"scale": rand((8,), np.float64), "b": rand((8,), np.float64)}, opset=17)


@pytest.mark.parametrize("shape,axis", LN_CASES)
def test_rms_norm(shape, axis):
    check_node("RMSNormalization", {"x": rand(shape)}, {"axis": axis, "epsilon": 1e-4},
               initializers={"scale": rand(shape[axis:])}, opset=23)


def test_rms_norm_half_and_f64():
    x = rand((2, 3, 8))
    check_half("RMSNormalization", {"x": x}, {}, initializers={"scale": rand((8,))}, opset=23)
    check_half("RMSNormalization", {"x": x}, {"axis": 1}, initializers={"scale": rand((3, 8))}, opset=23)
    check_reference("RMSNormalization", {"x": x.astype(np.float64)}, {"axis": 1},
                    initializers={"scale": rand((3, 8), np.float64)}, opset=23)


# --- Instance / Group normalization -------------------------------------------------------

@pytest.mark.parametrize("shape", [(2, 3, 7), (2, 3, 4, 5), (1, 2, 3, 4, 5)])
def test_instance_norm(shape):
    c = shape[1]
    check_node("InstanceNormalization", {"x": rand(shape)}, {"epsilon": 1e-3},
               initializers={"scale": rand((c,)), "b": rand((c,))})


def test_instance_norm_half_and_old_opset():
    check_half("InstanceNormalization", {"x": rand((2, 3, 4, 5))}, {},
               initializers={"scale": rand((3,)), "b": rand((3,))})
    check_node("InstanceNormalization", {"x": rand((2, 3, 4, 5))},
               initializers={"scale": rand((3,)), "b": rand((3,))}, opset=6)


def check_group_norm(x, attrs, inits, opset, expected=None):
    # ONNX's shape inference leaves the output type of this function op unset: give it.
    m = make_node_model("GroupNormalization", {"x": x}, 1, attrs, inits, opset,
                        output_types=[TensorProto.FLOAT if x.dtype == np.float32 else TensorProto.FLOAT16])
    check_model(m, {"x": x}, expected=expected)


@pytest.mark.parametrize("shape,groups", [((2, 6, 5), 3), ((2, 4, 3, 5), 2), ((1, 6, 2, 3, 4), 6),
                                          ((2, 4, 3, 3), 1)])
@pytest.mark.parametrize("opset", [18, 21])
def test_group_norm(shape, groups, opset):
    n = groups if opset == 18 else shape[1]
    check_group_norm(rand(shape), {"num_groups": groups, "epsilon": 1e-3},
                     {"scale": rand((n,)), "b": rand((n,))}, opset)


def test_group_norm_half():
    x = rand((2, 4, 3, 5))
    inits = {"scale": rand((4,)), "b": rand((4,))}
    m = make_node_model("GroupNormalization", {"x": x}, 1, {"num_groups": 2}, inits, 21,
                        output_types=[TensorProto.FLOAT])
    expected = [r.astype(np.float16) for r in run_cpu(m, {"x": x})]
    check_group_norm(x.astype(np.float16), {"num_groups": 2},
                     {k: v.astype(np.float16) for k, v in inits.items()}, 21, expected)


# --- LpNormalization, MeanVarianceNormalization, LRN --------------------------------------

@pytest.mark.parametrize("p", [1, 2])
@pytest.mark.parametrize("axis", [-1, 0, 1])
def test_lp_norm(p, axis):
    x = rand((3, 4, 5))
    x[1, 2, :] = 0  # an all-zero slice along the last axis
    check_node("LpNormalization", {"x": x}, {"p": p, "axis": axis})


@pytest.mark.parametrize("axes", [None, [0, 1, 2, 3], [2, 3], [1]])
def test_mvn(axes):
    attrs = {} if axes is None else {"axes": axes}
    check_node("MeanVarianceNormalization", {"x": rand((2, 3, 4, 5))}, attrs)


def test_mvn_opset9():
    check_node("MeanVarianceNormalization", {"x": rand((2, 3, 4, 5))}, opset=9)


def lrn_reference(x, size, alpha, beta, bias):
    """The spec's formula (ONNX's reference LRN loops over the batch instead of the channels)."""
    sq = x.astype(np.float64) ** 2
    lo, hi = (size - 1) // 2, -(-(size - 1) // 2)
    s = np.zeros_like(sq)
    for c in range(x.shape[1]):
        s[:, c] = sq[:, max(0, c - lo):min(x.shape[1], c + hi + 1)].sum(axis=1)
    return (x / (bias + alpha / size * s) ** beta).astype(x.dtype)


@pytest.mark.parametrize("size", [1, 2, 3, 5])
@pytest.mark.parametrize("shape", [(2, 7, 5), (2, 6, 4, 5), (1, 4, 2, 3, 4)])
def test_lrn(size, shape):
    x = rand(shape)
    attrs = {"size": size, "alpha": 1e-2, "beta": 0.6, "bias": 2.0}
    if len(shape) == 4 and size % 2:
        check_node("LRN", {"x": x}, attrs)
    else:  # ORT's kernel takes only 4-D inputs and odd sizes
        check_node("LRN", {"x": x}, attrs, expected=[lrn_reference(x, size, 1e-2, 0.6, 2.0)])


def test_lrn_defaults_and_half():
    check_node("LRN", {"x": rand((2, 6, 4, 5))}, {"size": 3})
    check_half("LRN", {"x": rand((2, 6, 4, 5))}, {"size": 3})


def test_empty_batch():
    x = np.zeros((0, 3, 4), np.float32)
    check_node("BatchNormalization", {"x": x}, initializers=bn_params(3))
    check_node("LayerNormalization", {"x": x}, initializers={"scale": rand((4,))}, opset=17)
    check_node("InstanceNormalization", {"x": x}, initializers={"scale": rand((3,)), "b": rand((3,))})
    check_node("LRN", {"x": np.zeros((0, 3, 4, 4), np.float32)}, {"size": 3})
