"""Structure-aware fuzzing of the MLX EP with atheris (claim -> compile -> run, in-process).

Each input picks a seed model from ONNX's node tests (ops the EP claims), applies mutations chosen
by the fuzz bytes (attribute values, input dims incl. 0, dtypes, initializer contents, dropped
optional inputs), then runs it on ORT's CPU EP and on the MLX EP. Findings:
  - a crash (signal/abort) of the process: atheris saves the input as crash-<hash>;
  - a claimed node whose result differs from the CPU EP (AssertionError, input saved);
  - a run the CPU EP fails (an out-of-range index) where the EP returns a value, unless
    onnx.reference computes the EP's value (the CPU EP's error is then ORT's).
An error status from the EP is not a finding (bad models must give errors, not crashes).

    python tools/fuzz_ep.py [-runs=N] [-max_total_time=S] [corpus_dir]   # libFuzzer flags
    FUZZ_FINDINGS=dir python tools/fuzz_ep.py ...   # save mismatches there and keep going
    python tools/fuzz_ep.py --replay crash-<hash>   # print the mutated model, re-run it
Coverage feedback is from the Python mutation code only (instrument_func: which seed, which
mutation; the EP is not built with -fsanitize=fuzzer), so this is guided random testing of the
native code; run it under the ASan build (scripts/sanitize fuzz) to catch memory errors that do
not crash."""
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
                 "test_resize", "test_flatten", "test_einsum", "test_lrn", "test_pow",
                 # index ops: the feeds' small integers run past short axes (out-of-range indices)
                 "test_scatter", "test_onehot", "test_reversesequence", "test_tensorscatter")
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
STATS = {"inputs": 0, "valid": 0, "mlx_ran": 0, "mlx_errors": 0, "mismatches": 0,
         "known_mismatches": 0, "skipped_ort_crashers": 0, "mlx_only": 0}
# FUZZ_FINDINGS=dir: a result that differs from the CPU EP is saved there and the run goes on
# (crashes still stop it); unset, a mismatch stops the run like a crash.
FINDINGS = os.environ.get("FUZZ_FINDINGS")
SAVED: dict[str, int] = {}


@atheris.instrument_func
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


@atheris.instrument_func  # coverage of the mutation paths guides the corpus
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


@atheris.instrument_func
def crashes_ort(m, feeds=None) -> str | None:
    """Mutations that crash ORT itself, seen here with ORT 1.31.1 (SIGSEGV in
    onnxruntime_pybind11_state, also with no MLX EP in the session): a segfault there would end
    the run. "graph": ORT crashes while loading the model, so it is skipped; "cpu kernel": only
    ORT's CPU kernel crashes, so the model runs on the MLX EP alone, with no reference."""
    for n in m.graph.node:
        attrs = {a.name: a for a in n.attribute}
        if n.op_type == "GatherND" and "batch_dims" in attrs and attrs["batch_dims"].i < 0:
            return "graph"
        # Split with num_outputs other than its output count: a failed libstdc++ assertion
        # (SIGABRT) in ORT's shape inference.
        if n.op_type == "Split" and "num_outputs" in attrs and \
                0 < attrs["num_outputs"].i != len(n.output):
            return "graph"
    for n in m.graph.node:
        # Split with num_outputs <= 0: SIGFPE (a division by it) in the CPU kernel.
        if n.op_type == "Split" and any(a.name == "num_outputs" and a.i <= 0 for a in n.attribute):
            return "cpu kernel"
        # ConvTranspose of an input with a 0 dim: SIGSEGV in the CPU kernel.
        if n.op_type == "ConvTranspose" and feeds and n.input[0] in feeds and \
                0 in np.shape(feeds[n.input[0]]):
            return "cpu kernel"
        # LayerNormalization without its optional bias B.
        if n.op_type == "LayerNormalization" and len(n.input) > 2 and n.input[2] == "":
            return "cpu kernel"
        # A required (or variadic) input dropped to "": ORT's CPU kernels do not check, e.g.
        # Einsum("i,i", x, "") (the MLX EP reports "input 1 is missing").
        if "" in n.input and not dropped_inputs_are_optional(m, n):
            return "cpu kernel"
    return None


def dropped_inputs_are_optional(m, n) -> bool:
    version = next((o.version for o in m.opset_import if o.domain == n.domain), 1)
    try:
        formal = onnx.defs.get_schema(n.op_type, version, n.domain).inputs
    except Exception:
        return False
    for i, name in enumerate(n.input):
        if name:
            continue
        p = formal[min(i, len(formal) - 1)] if formal else None
        if p is None or p.option != onnx.defs.OpSchema.FormalParameterOption.Optional:
            return False
    return True


FLAGS = {"keepdims", "ceil_mode", "noop_with_empty_axes", "training_mode", "select_last_index",
         "count_include_pad", "transA", "transB", "exclusive", "reverse", "largest", "sorted",
         "detect_negative", "detect_positive", "storage_order", "upper", "fmod",
         "linear_before_reset", "input_forget", "new_axis", "layout", "interleaved", "is_causal",
         "saturate", "allowzero"}  # int attributes ONNX defines as 0/1


def known_mismatch(m, feeds=None) -> str | None:
    """Differences from the CPU EP already triaged (docs/performance.md "Reliability gates"): counted, not raised,
    so a bounded run stops only at new findings. Remove an entry once its cause is fixed (the
    matching regression test in tests/python/test_fuzz_regressions.py then says so)."""
    for n in m.graph.node:
        attrs = {a.name: a for a in n.attribute}
        # Ours: 0/1 flags read as `!= 0`, where ORT's kernels mostly test `== 1`; values other
        # than 0/1 should be declined at claim time (seen: keepdims in src/ops/onnx/reduce.cc,
        # ceil_mode in src/ops/nn/pool.cc, training_mode of BatchNormalization).
        for flag in FLAGS & attrs.keys():
            if attrs[flag].type == onnx.AttributeProto.INT and attrs[flag].i not in (0, 1):
                return f"{flag} not 0/1"
        # Ours: Pow of an integer base with a float exponent rounds where ORT truncates toward
        # zero (3 ** -0.13 = 0.87: ORT and onnx.reference give 0, the MLX EP 1): src/ops/onnx/elementwise.cc.
        if n.op_type == "Pow" and feeds and is_int_pow_float(m, n, feeds):
            return "Pow int ** float rounding"
        # Conv with auto_pad SAME_* and a stride larger than the kernel (negative total padding):
        # ORT's CPU EP, onnx.reference and the MLX EP all differ; the EP should decline it.
        if n.op_type == "Conv" and attrs.get("auto_pad") is not None and \
                attrs["auto_pad"].s.startswith(b"SAME") and feeds and kernel_below_stride(m, n, attrs, feeds):
            return "Conv SAME with kernel < stride"
        # ORT's: ConvTranspose with auto_pad SAME_* and a kernel smaller than the stride (negative
        # total padding): the CPU EP's output is one short (onnx.reference agrees with MLX).
        if n.op_type == "ConvTranspose" and attrs.get("auto_pad") is not None and \
                attrs["auto_pad"].s.startswith(b"SAME") and feeds and kernel_below_stride(m, n, attrs, feeds):
            return "ConvTranspose SAME with kernel < stride (ORT CPU)"
        # Ours: a pooling window larger than the padded input. The ONNX shape formula gives 0
        # outputs (the MLX EP), ORT's CPU kernel truncates toward zero and gives 1. Such nodes
        # should be declined when the shapes are known (src/ops/nn/pool.cc).
        if n.op_type in ("MaxPool", "AveragePool", "LpPool") and window_exceeds_input(m, n, attrs, feeds):
            return "pool window larger than input"
        # ORT's: a reduction of an empty tensor over negative axes keeps the input's shape on
        # the CPU EP (axes=[-3] of a [2,0,4] tensor gives [2,0,4]; onnx.reference gives [1,0,4]).
        if (n.op_type.startswith("Reduce") or n.op_type in ("ArgMax", "ArgMin")) and feeds and \
                empty_with_negative_axes(m, n, attrs, feeds):
            return "empty Reduce over negative axes (ORT CPU)"
        # ORT's: Resize with negative `axes` and a keep_aspect_ratio_policy gives the wrong shape
        # on the CPU EP (the MLX EP follows the ONNX spec).
        if n.op_type == "Resize" and "axes" in attrs and any(a < 0 for a in attrs["axes"].ints):
            return "Resize negative axes (ORT CPU)"
    return None


def values_of(m, feeds) -> dict:
    values = dict(feeds)
    values.update({i.name: numpy_helper.to_array(i) for i in m.graph.initializer})
    return values


def is_int_pow_float(m, n, feeds) -> bool:
    v = values_of(m, feeds)
    if n.input[0] not in v or n.input[1] not in v:
        return False
    return np.asarray(v[n.input[0]]).dtype.kind in "iu" and np.asarray(v[n.input[1]]).dtype.kind == "f"


def kernel_below_stride(m, n, attrs, feeds) -> bool:
    w = values_of(m, feeds).get(n.input[1])
    strides = list(attrs["strides"].ints) if "strides" in attrs else []
    if w is None or not strides:
        return False
    return any(k < s for k, s in zip(np.shape(w)[2:], strides))


def empty_with_negative_axes(m, n, attrs, feeds) -> bool:
    values = values_of(m, feeds)
    data = values.get(n.input[0])
    if data is None or np.asarray(data).size != 0:
        return False
    axes = list(attrs["axes"].ints) if "axes" in attrs else []
    if "axis" in attrs:  # ArgMax/ArgMin
        axes = [attrs["axis"].i]
    if len(n.input) > 1 and n.input[1] in values:
        axes = list(np.asarray(values[n.input[1]]).ravel())
    return any(a < 0 for a in axes)


def window_exceeds_input(m, n, attrs, feeds=None) -> bool:
    """A pooling node whose (dilated) window is larger than its padded input, by the fed shape
    or else the static input shape of the graph."""
    shapes = {vi.name: [d.dim_value if d.HasField("dim_value") else None
                        for d in vi.type.tensor_type.shape.dim] for vi in m.graph.input}
    shapes.update({k: list(np.shape(v)) for k, v in (feeds or {}).items()})
    spatial = shapes.get(n.input[0], [])[2:]
    kernel = list(attrs["kernel_shape"].ints) if "kernel_shape" in attrs else []
    r = len(kernel)
    dil = list(attrs["dilations"].ints) if "dilations" in attrs else []
    dil = dil if len(dil) == r else [1] * r
    pads = list(attrs["pads"].ints) if "pads" in attrs else []
    pads = pads if len(pads) == 2 * r else [0] * (2 * r)
    return any(d is not None and (k - 1) * dil[i] + 1 > d + pads[i] + pads[i + r]
               for i, (d, k) in enumerate(zip(spatial, kernel)))


@atheris.instrument_func
def TestOneInput(data: bytes):
    STATS["inputs"] += 1
    if STATS["inputs"] % 50 == 0:  # libFuzzer exits without running Python's atexit handlers
        print(f"[fuzz] {STATS}", file=sys.stderr, flush=True)
    fdp = atheris.FuzzedDataProvider(data)
    seed = SEEDS[fdp.ConsumeIntInRange(0, len(SEEDS) - 1)]
    m, dims = mutate(seed, fdp)
    blob = m.SerializeToString()
    try:
        feeds = {vi.name: random_feed(vi, fdp, dims) for vi in m.graph.input
                 if vi.name not in {i.name for i in m.graph.initializer}}
    except Exception:
        return  # an element type the feeds cannot be made for
    crash = crashes_ort(m, feeds)
    if crash == "graph":
        STATS["skipped_ort_crashers"] += 1
        return
    if crash == "cpu kernel":  # the MLX EP alone: an error or a result, never a crash
        STATS["mlx_only"] += 1
        try:
            sess = ort.InferenceSession(blob, sess_options=om.session_options("cpu", fallback=False))
            sess.run(None, feeds)
        except Exception:
            pass
        return
    try:
        cpu = ort.InferenceSession(blob, providers=["CPUExecutionProvider"])
    except Exception:
        return  # not a valid model for ORT itself
    try:
        ref, cpu_error = cpu.run(None, feeds), None
    except Exception as e:  # e.g. an out-of-range index: the EP must fail as well
        ref, cpu_error = None, str(e).splitlines()[0][:300]
    STATS["valid"] += 1
    try:
        sess = ort.InferenceSession(blob, sess_options=om.session_options("cpu"))
        sess.disable_fallback()  # an EP failure must not be retried on the CPU EP unnoticed
        outs = sess.run(None, feeds)
    except Exception:
        STATS["mlx_errors"] += 1  # an error status, not a crash: acceptable
        return
    STATS["mlx_ran"] += 1
    try:
        if cpu_error is not None:
            if reference_agrees(m, feeds, outs):
                STATS["known_mismatches"] += 1  # the CPU EP's error is ORT's own
                return
            raise AssertionError(f"the CPU EP fails ({cpu_error}), the MLX EP returns a value")
        compare(outs, ref)
    except AssertionError as e:
        if known_mismatch(m, feeds):
            STATS["known_mismatches"] += 1
            return
        if not FINDINGS:
            raise
        # Keep going: save the model and its feeds (a few per seed model) and count it.
        STATS["mismatches"] += 1
        seen = SAVED.setdefault(m.graph.name, 0)
        if seen < 3:
            SAVED[m.graph.name] = seen + 1
            d = pathlib.Path(FINDINGS) / f"{m.graph.name}-{seen}"
            d.mkdir(parents=True, exist_ok=True)
            (d / "model.onnx").write_bytes(blob)
            np.savez(d / "feeds.npz", **feeds)
            (d / "finding.txt").write_text(f"{e}\n{onnx.printer.to_text(m.graph)}\n")


def reference_agrees(m, feeds, outs) -> bool:
    """Whether onnx.reference runs the model and gives the EP's outputs."""
    try:
        from onnx.reference import ReferenceEvaluator
        compare(outs, ReferenceEvaluator(m).run(None, feeds))
        return True
    except Exception:  # noqa: BLE001 - it fails too, or differs
        return False


def compare(outs, ref):
    assert len(outs) == len(ref), (len(outs), len(ref))
    for a, b in zip(outs, ref):
        if isinstance(a, list) or isinstance(b, list):  # sequence outputs: item by item
            assert isinstance(a, list) and isinstance(b, list), (type(a), type(b))
            compare(a, b)
            continue
        a, b = np.asarray(a), np.asarray(b)
        assert a.shape == b.shape and a.dtype == b.dtype, (a.shape, b.shape, a.dtype, b.dtype)
        if a.dtype.kind == "f":
            tol = 5e-2 if a.dtype == np.float16 else 1e-3
            assert np.allclose(a.astype(np.float64), b.astype(np.float64), rtol=tol, atol=tol,
                               equal_nan=True), "MLX EP result differs from the CPU EP"
        else:
            assert np.array_equal(a, b), "MLX EP result differs from the CPU EP"


def replay(path: str) -> None:
    """Re-runs one saved input and prints the mutated model (for turning findings into tests)."""
    data = pathlib.Path(path).read_bytes()
    fdp = atheris.FuzzedDataProvider(data)
    seed = SEEDS[fdp.ConsumeIntInRange(0, len(SEEDS) - 1)]
    m, dims = mutate(seed, fdp)
    print(onnx.helper.printable_graph(m.graph), "\nopset",
          [(o.domain, o.version) for o in m.opset_import], "\ndims override", dims)
    TestOneInput(data)
    print("no finding")


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--replay":
        replay(sys.argv[2])
        return
    import atexit
    atexit.register(lambda: print(f"[fuzz] {STATS}", file=sys.stderr))
    atheris.Setup(sys.argv, TestOneInput)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
