"""Structure-aware fuzzing of the MLX EP with atheris (claim -> compile -> run, in-process).

Each input picks a seed model from ONNX's node tests (ops the EP claims), applies mutations chosen
by the fuzz bytes (attribute values, input dims incl. 0, dtypes, initializer contents, dropped
optional inputs), then runs it on ORT's CPU EP and on the MLX EP. Findings:
  - a crash (signal/abort) of the process: atheris saves the input as crash-<hash>;
  - a claimed node whose result differs from the CPU EP (AssertionError, input saved).
An error status from the EP is not a finding (bad models must give errors, not crashes).

    python tools/fuzz_ep.py [-runs=N] [-max_total_time=S] [corpus_dir]   # libFuzzer flags
Coverage feedback is from the Python mutation code only (the EP is not built with
-fsanitize=fuzzer), so this is guided random testing of the native code; run it under the ASan
build (scripts/sanitize) to catch memory errors that do not crash."""
from __future__ import annotations

import copy
import os
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))
os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")

import atheris  # noqa: E402
import numpy as np  # noqa: E402
import onnx  # noqa: E402
import onnxruntime as ort  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import onnxruntime_mlx as om  # noqa: E402

NODE_DIR = ROOT / ".deps/libonnx-testdata/usr/share/libonnx-testdata/data/node"
SEED_PREFIXES = ("test_add", "test_mul", "test_sub", "test_div", "test_matmul", "test_gemm",
                 "test_reshape", "test_transpose", "test_concat", "test_slice", "test_gather",
                 "test_softmax", "test_reduce_", "test_conv", "test_maxpool", "test_averagepool",
                 "test_layer_norm", "test_batchnorm", "test_unsqueeze", "test_squeeze", "test_expand",
                 "test_where", "test_clip", "test_cast", "test_split", "test_pad", "test_tile",
                 "test_relu", "test_sigmoid", "test_argmax", "test_topk", "test_cumsum", "test_range",
                 "test_resize", "test_flatten", "test_einsum", "test_lrn", "test_pow")
DTYPES = [TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.INT32, TensorProto.INT64,
          TensorProto.BOOL, TensorProto.DOUBLE, TensorProto.UINT8]

ort.set_default_logger_severity(4)
om.register()
SEEDS = []
for d in sorted(NODE_DIR.iterdir()):
    if d.name.startswith(SEED_PREFIXES) and "expanded" not in d.name and (d / "model.onnx").exists():
        m = onnx.load(d / "model.onnx")
        if all(i.type.HasField("tensor_type") for i in m.graph.input):
            SEEDS.append(m)
STATS = {"inputs": 0, "valid": 0, "mlx_ran": 0, "mlx_errors": 0}


def random_feed(vi, fdp, dims_override):
    tt = vi.type.tensor_type
    shape = [dims_override.get((vi.name, k), d.dim_value if d.HasField("dim_value") else 2)
             for k, d in enumerate(tt.shape.dim)]
    np_type = helper.tensor_dtype_to_np_dtype(tt.elem_type)
    rng = np.random.default_rng(fdp.ConsumeIntInRange(0, 1 << 16))
    if np_type == np.bool_:
        return rng.random(shape) > 0.5
    if np.issubdtype(np_type, np.integer):
        return rng.integers(-3 if np.issubdtype(np_type, np.signedinteger) else 0, 4, size=shape).astype(np_type)
    return rng.standard_normal(shape).astype(np_type)


def mutate(m, fdp):
    m = copy.deepcopy(m)
    dims = {}
    node = m.graph.node[fdp.ConsumeIntInRange(0, len(m.graph.node) - 1)]
    for _ in range(fdp.ConsumeIntInRange(1, 4)):
        kind = fdp.ConsumeIntInRange(0, 5)
        if kind == 0 and node.attribute:
            a = node.attribute[fdp.ConsumeIntInRange(0, len(node.attribute) - 1)]
            if a.type == onnx.AttributeProto.INT:
                a.i = fdp.ConsumeIntInRange(-3, 6)
            elif a.type == onnx.AttributeProto.INTS and a.ints:
                a.ints[fdp.ConsumeIntInRange(0, len(a.ints) - 1)] = fdp.ConsumeIntInRange(-3, 6)
            elif a.type == onnx.AttributeProto.FLOAT:
                a.f = fdp.ConsumeFloatInRange(-4.0, 4.0)
        elif kind == 1 and m.graph.input:
            vi = m.graph.input[fdp.ConsumeIntInRange(0, len(m.graph.input) - 1)]
            rank = len(vi.type.tensor_type.shape.dim)
            if rank:
                k = fdp.ConsumeIntInRange(0, rank - 1)
                dims[(vi.name, k)] = fdp.ConsumeIntInRange(0, 5)
                vi.type.tensor_type.shape.dim[k].dim_param = f"d{k}"
        elif kind == 2 and m.graph.input:
            vi = m.graph.input[fdp.ConsumeIntInRange(0, len(m.graph.input) - 1)]
            vi.type.tensor_type.elem_type = DTYPES[fdp.ConsumeIntInRange(0, len(DTYPES) - 1)]
        elif kind == 3 and m.graph.initializer:
            init = m.graph.initializer[fdp.ConsumeIntInRange(0, len(m.graph.initializer) - 1)]
            arr = numpy_helper.to_array(init).copy()
            if arr.size:
                arr.flat[fdp.ConsumeIntInRange(0, arr.size - 1)] = fdp.ConsumeIntInRange(-5, 5)
            init.CopyFrom(numpy_helper.from_array(arr, init.name))
        elif kind == 4 and len(node.input) > 1:
            node.input[fdp.ConsumeIntInRange(1, len(node.input) - 1)] = ""
        elif kind == 5:
            for o in m.graph.output:  # let ORT re-infer: mutated outputs may change type/shape
                o.type.tensor_type.ClearField("shape")
    return m, dims


def TestOneInput(data: bytes):
    STATS["inputs"] += 1
    fdp = atheris.FuzzedDataProvider(data)
    seed = SEEDS[fdp.ConsumeIntInRange(0, len(SEEDS) - 1)]
    m, dims = mutate(seed, fdp)
    blob = m.SerializeToString()
    try:
        feeds = {vi.name: random_feed(vi, fdp, dims) for vi in m.graph.input
                 if vi.name not in {i.name for i in m.graph.initializer}}
        ref = ort.InferenceSession(blob, providers=["CPUExecutionProvider"]).run(None, feeds)
    except Exception:
        return  # not a valid model/input for ORT itself
    STATS["valid"] += 1
    try:
        sess = ort.InferenceSession(blob, sess_options=om.session_options("cpu"))
        outs = sess.run(None, feeds)
    except Exception:
        STATS["mlx_errors"] += 1  # an error status, not a crash: acceptable
        return
    STATS["mlx_ran"] += 1
    for a, b in zip(outs, ref):
        a, b = np.asarray(a), np.asarray(b)
        assert a.shape == b.shape and a.dtype == b.dtype, (a.shape, b.shape, a.dtype, b.dtype)
        if a.dtype.kind == "f":
            tol = 5e-2 if a.dtype == np.float16 else 1e-3
            assert np.allclose(a.astype(np.float64), b.astype(np.float64), rtol=tol, atol=tol,
                               equal_nan=True), "MLX EP result differs from the CPU EP"
        else:
            assert np.array_equal(a, b), "MLX EP result differs from the CPU EP"


def main():
    import atexit
    atexit.register(lambda: print(f"[fuzz] {STATS}", file=sys.stderr))
    atheris.Setup(sys.argv, TestOneInput)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
