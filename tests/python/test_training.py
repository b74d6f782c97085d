"""The optimizer ops of ai.onnx.preview.training (Adagrad, Adam, Momentum standard/Nesterov) on
the MLX EP. ORT's CPU EP has no kernel for them, so the oracle is ONNX's reference
implementation (onnx.reference); placement is proven as everywhere (CPU fallback disabled)."""
import numpy as np
import pytest
from onnx.reference import ReferenceEvaluator

from oracle import check_node, make_node_model

DOMAIN = "ai.onnx.preview.training"
rng = np.random.default_rng(28)


def check_optimizer(op, inputs, attrs, n_out, dtype=np.float32):
    # The reference runs one single-tensor node per group: its multi-tensor Adam rounds every
    # result to float32, whatever the dtype.
    names = list(inputs)
    per = {"Adagrad": 3, "Adam": 4, "Momentum": 3}[op]
    n = (len(names) - 2) // per
    outs_per = n_out // n
    expected = [None] * n_out
    for i in range(n):
        one = {k: inputs[k] for k in names[:2]}
        one.update({names[2 + j * n + i]: inputs[names[2 + j * n + i]] for j in range(per)})
        m = make_node_model(op, one, outs_per, attrs, domain=DOMAIN, opset=21)
        for j, e in enumerate(ReferenceEvaluator(m).run(None, one)):
            expected[j * n + i] = np.asarray(e).astype(dtype)
    check_node(op, inputs, attrs, outputs=n_out, domain=DOMAIN, expected=expected)


def tensors(prefix, shapes, dtype, positive=False):
    out = {}
    for i, sh in enumerate(shapes):
        a = np.asarray(rng.standard_normal(sh), dtype)
        out[f"{prefix}{i}"] = np.asarray(np.abs(a) + 0.1 if positive else a, dtype)
    return out


SHAPES = [[(5,)], [(3, 4), (2,), ()]]


@pytest.mark.parametrize("shapes", SHAPES)
@pytest.mark.parametrize("t", [0, 3])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_adagrad(shapes, t, dtype):
    inputs = {"R": np.array(0.1, dtype), "T": np.array(t, np.int64),
              **tensors("X", shapes, dtype), **tensors("G", shapes, dtype),
              **tensors("H", shapes, dtype, positive=True)}
    check_optimizer("Adagrad", inputs, {"decay_factor": 0.1, "epsilon": 1e-5,
                                        "norm_coefficient": 0.001}, 2 * len(shapes), dtype)


def test_adagrad_default_attributes():
    shapes = [(4, 2)]
    inputs = {"R": np.array(0.5, np.float32), "T": np.array(7, np.int64),
              **tensors("X", shapes, np.float32), **tensors("G", shapes, np.float32),
              **tensors("H", shapes, np.float32, positive=True)}
    check_optimizer("Adagrad", inputs, {}, 2)


@pytest.mark.parametrize("shapes", SHAPES)
@pytest.mark.parametrize("t", [0, 1, 5])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_adam(shapes, t, dtype):
    inputs = {"R": np.array(0.1, dtype), "T": np.array(t, np.int64),
              **tensors("X", shapes, dtype), **tensors("G", shapes, dtype),
              **tensors("V", shapes, dtype), **tensors("H", shapes, dtype, positive=True)}
    check_optimizer("Adam", inputs, {"alpha": 0.9, "beta": 0.85, "epsilon": 1e-7,
                                     "norm_coefficient": 0.001, "norm_coefficient_post": 0.01},
                    3 * len(shapes), dtype)


@pytest.mark.parametrize("mode", ["standard", "nesterov"])
@pytest.mark.parametrize("shapes", SHAPES)
@pytest.mark.parametrize("t", [0, 2])
def test_momentum(mode, shapes, t):
    dtype = np.float32
    inputs = {"R": np.array(0.1, dtype), "T": np.array(t, np.int64),
              **tensors("X", shapes, dtype), **tensors("G", shapes, dtype),
              **tensors("V", shapes, dtype)}
    check_optimizer("Momentum", inputs, {"alpha": 0.95, "beta": 0.1, "mode": mode,
                                         "norm_coefficient": 0.01}, 2 * len(shapes))
