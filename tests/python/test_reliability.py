"""Reliability gates, fast forms (the long forms are tools/reliability.py; docs/performance.md "Reliability gates").

Bad models and inputs must give an error status (or run correctly on the fallback), never a
crash, and the next good run in the same session must still be correct. Runs must be correct
from many threads at once, on one shared session and on separate ones."""
import gc
import os
import threading

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

import onnxruntime_mlx as om

rng = np.random.default_rng(7)


def model(nodes, inputs, outputs, inits=(), opset=17):
    g = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 9
    return m.SerializeToString()


def vi(name, dtype, shape):
    return helper.make_tensor_value_info(name, dtype, shape)


CHAIN = model([helper.make_node("Add", ["x", "y"], ["t"]), helper.make_node("Mul", ["t", "x"], ["u"]),
               helper.make_node("Exp", ["u"], ["z"])],
              [vi("x", TP.FLOAT, ["n", 3]), vi("y", TP.FLOAT, [3])], [vi("z", TP.FLOAT, ["n", 3])])


def chain_ref(x, y):
    return np.exp((x + y) * x)


def mlx_session(m, **opts):
    return ort.InferenceSession(m, sess_options=om.session_options("cpu", fallback=False, **opts))


def test_threads_share_one_session():
    s = mlx_session(CHAIN)
    errors = []

    def work(tid):
        r = np.random.default_rng(tid)
        for it in range(40):
            x = r.random((1 + (it + tid) % 4, 3), dtype=np.float32)
            y = r.random(3, dtype=np.float32)
            z, = s.run(None, {"x": x, "y": y})
            if not np.allclose(z, chain_ref(x, y), rtol=1e-5):
                errors.append((tid, it))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_threads_on_separate_sessions():
    sessions = [mlx_session(CHAIN) for _ in range(8)]
    errors = []

    def work(tid):
        r = np.random.default_rng(100 + tid)
        for it in range(30):
            x = r.random((2, 3), dtype=np.float32)
            y = r.random(3, dtype=np.float32)
            z, = sessions[tid].run(None, {"x": x, "y": y})
            if not np.allclose(z, chain_ref(x, y), rtol=1e-5):
                errors.append((tid, it))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_runtime_shape_mismatch_is_an_error_then_recovers():
    s = mlx_session(CHAIN)
    with pytest.raises(Exception) as e:
        s.run(None, {"x": np.ones((2, 4), np.float32), "y": np.ones(3, np.float32)})
    assert "dimensions" in str(e.value)  # ORT validates declared input shapes itself
    x = rng.random((2, 3), dtype=np.float32)
    y = rng.random(3, dtype=np.float32)
    np.testing.assert_allclose(s.run(None, {"x": x, "y": y})[0], chain_ref(x, y), rtol=1e-5)


def test_broadcast_mismatch_inside_the_ep_names_the_node():
    m = model([helper.make_node("Add", ["x", "y"], ["z"], name="the_add")],
              [vi("x", TP.FLOAT, ["a", "b"]), vi("y", TP.FLOAT, ["c"])], [vi("z", TP.FLOAT, None)])
    s = mlx_session(m)
    with pytest.raises(Exception) as e:
        s.run(None, {"x": np.ones((2, 3), np.float32), "y": np.ones(4, np.float32)})
    msg = str(e.value)
    assert "the_add" in msg and "Add" in msg, msg
    ok = s.run(None, {"x": np.ones((2, 3), np.float32), "y": np.ones(3, np.float32)})[0]
    np.testing.assert_array_equal(ok, np.full((2, 3), 2, np.float32))


def test_zero_dims_nan_and_inf():
    s = mlx_session(CHAIN)
    z, = s.run(None, {"x": np.zeros((0, 3), np.float32), "y": np.ones(3, np.float32)})
    assert z.shape == (0, 3)
    x = np.array([[np.nan, np.inf, -np.inf]], np.float32)
    y = np.zeros(3, np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        np.testing.assert_array_equal(s.run(None, {"x": x, "y": y})[0], chain_ref(x, y))


def test_wrong_input_dtype_is_rejected():
    s = mlx_session(CHAIN)
    with pytest.raises(Exception):
        s.run(None, {"x": np.ones((2, 3), np.float64), "y": np.ones(3, np.float32)})
    assert s.run(None, {"x": np.ones((1, 3), np.float32), "y": np.ones(3, np.float32)})[0].shape == (1, 3)


def test_unsupported_op_runs_on_the_fallback():
    m = model([helper.make_node("Add", ["x", "x"], ["t"]),
               helper.make_node("Det", ["t"], ["d"]),  # not claimed on purpose? checked below
               helper.make_node("Neg", ["d"], ["z"])],
              [vi("x", TP.FLOAT, [3, 3])], [vi("z", TP.FLOAT, [])])
    so = om.record_assignment(om.session_options("cpu", fallback=True))
    s = ort.InferenceSession(m, sess_options=so)
    x = rng.random((3, 3), dtype=np.float32) + np.eye(3, dtype=np.float32)
    np.testing.assert_allclose(s.run(None, {"x": x})[0], -np.linalg.det(2 * x), rtol=1e-4)
    placed = om.placement(s)
    assert om.EP_NAME in placed


def test_truncated_and_self_referencing_models_are_rejected_cleanly():
    with pytest.raises(Exception):
        mlx_session(CHAIN[: len(CHAIN) // 2])
    cyclic = model([helper.make_node("Add", ["x", "b"], ["a"]), helper.make_node("Neg", ["a"], ["b"])],
                   [vi("x", TP.FLOAT, [3])], [vi("a", TP.FLOAT, [3])])
    with pytest.raises(Exception):
        mlx_session(cyclic)
    mlx_session(CHAIN)  # the EP still works after the failures


def test_opset_out_of_range_is_rejected():
    with pytest.raises(Exception):
        mlx_session(model([helper.make_node("Add", ["x", "x"], ["z"])], [vi("x", TP.FLOAT, [3])],
                          [vi("z", TP.FLOAT, [3])], opset=99))


def test_unknown_provider_option_fails_session_creation():
    # A typo in an option must not be silently ignored. ORT reports EP creation failures by
    # falling back (no MLX EP) -> with fallback disabled the session is refused.
    with pytest.raises(Exception):
        mlx_session(CHAIN, no_such_option=1)


@pytest.mark.skipif("libasan" in os.environ.get("LD_PRELOAD", ""),
                    reason="under ASan (scripts/sanitize) freed memory sits in its quarantine")
def test_many_sessions_do_not_grow_memory():
    import resource
    x = np.ones((2, 3), np.float32)
    y = np.ones(3, np.float32)
    for _ in range(20):  # warm-up: MLX's JIT cache, allocator pools
        mlx_session(CHAIN).run(None, {"x": x, "y": y})
    gc.collect()
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    for _ in range(100):
        s = mlx_session(CHAIN)
        s.run(None, {"x": x, "y": y})
        del s
    gc.collect()
    grown_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base
    assert grown_kb < 5 * 1024, f"peak RSS grew by {grown_kb} KiB over 100 sessions"


# ---- bad models and inputs (issue 8): each gives a clear error or a correct fallback run, and
# ---- the next good run of the same session is still correct.

def good_chain_run(s):
    x = rng.random((2, 3), dtype=np.float32)
    y = rng.random(3, dtype=np.float32)
    np.testing.assert_allclose(s.run(None, {"x": x, "y": y})[0], chain_ref(x, y), rtol=1e-5)


def test_wrong_rank_at_run_time_is_an_error_then_recovers():
    s = mlx_session(CHAIN)
    with pytest.raises(Exception) as e:  # declared rank 2, given rank 3: ORT checks the rank
        s.run(None, {"x": np.ones((1, 2, 3), np.float32), "y": np.ones(3, np.float32)})
    assert "rank" in str(e.value).lower(), e.value
    good_chain_run(s)


def test_rank_the_ep_cannot_handle_is_a_clear_error_inside_the_ep():
    # No declared shape, so ORT passes any rank through to the EP: Softmax(axis=1) on a rank-1
    # input is invalid and must come back as an error status naming the node.
    m = model([helper.make_node("Softmax", ["x"], ["z"], axis=1, name="sm")],
              [vi("x", TP.FLOAT, None)], [vi("z", TP.FLOAT, None)], opset=13)
    s = mlx_session(m)
    with pytest.raises(Exception) as e:
        s.run(None, {"x": np.ones(4, np.float32)})
    assert "MLX EP" in str(e.value) and "sm" in str(e.value), e.value
    x = rng.random((2, 5), dtype=np.float32)
    z = s.run(None, {"x": x})[0]
    ex = np.exp(x - x.max(1, keepdims=True))
    np.testing.assert_allclose(z, ex / ex.sum(1, keepdims=True), rtol=1e-5)


@pytest.mark.parametrize("op,shapes", [("MatMul", [(0, 3), (3, 4)]), ("MatMul", [(2, 0), (0, 4)]),
                                       ("ReduceSum", [(0, 3)]), ("Softmax", [(2, 0)])])
def test_zero_sized_dims_match_the_cpu_ep(op, shapes):
    names = [f"i{k}" for k in range(len(shapes))]
    m = model([helper.make_node(op, names, ["z"])],
              [vi(n, TP.FLOAT, list(sh)) for n, sh in zip(names, shapes)], [vi("z", TP.FLOAT, None)])
    feeds = {n: np.ones(sh, np.float32) for n, sh in zip(names, shapes)}
    ref = ort.InferenceSession(m, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    got = mlx_session(m).run(None, feeds)[0]
    assert got.shape == ref.shape
    np.testing.assert_array_equal(got, ref)


BIG = 3_000_000_000  # > INT32_MAX: MLX dims are int32


def test_dim_beyond_int32_at_run_time_is_a_clear_error_then_recovers():
    # A zero-element tensor can have a dim > INT32_MAX without any memory: the EP must refuse it
    # with an error (not wrap it around into a negative MLX dim).
    m = model([helper.make_node("Add", ["x", "x"], ["t"]), helper.make_node("Neg", ["t"], ["z"])],
              [vi("x", TP.FLOAT, ["a", "b"])], [vi("z", TP.FLOAT, ["a", "b"])])
    s = mlx_session(m)
    with pytest.raises(Exception) as e:
        s.run(None, {"x": np.zeros((0, BIG), np.float32)})
    assert "MLX EP" in str(e.value) and "int32" in str(e.value).lower(), e.value
    x = rng.random((2, 3), dtype=np.float32)
    np.testing.assert_array_equal(s.run(None, {"x": x})[0], -(x + x))


def test_shape_parameter_beyond_int32_is_declined_or_a_clear_error():
    # Reshape to a constant shape with a dim > INT32_MAX (zero elements): either the EP declines
    # the node (and the CPU EP runs it) or the run fails with an error; never a wrapped dim.
    shape = numpy_helper.from_array(np.array([0, BIG], np.int64), "shape")
    m = model([helper.make_node("Reshape", ["x", "shape"], ["t"]),
               helper.make_node("Identity", ["t"], ["z"])],
              [vi("x", TP.FLOAT, [0])], [vi("z", TP.FLOAT, None)], inits=[shape])
    so = om.record_assignment(om.session_options("cpu", fallback=True))
    s = ort.InferenceSession(m, sess_options=so)
    try:
        z = s.run(None, {"x": np.zeros(0, np.float32)})[0]
    except Exception as e:  # an error status from the EP is acceptable; it must say why
        assert "int32" in str(e).lower() or "MLX EP" in str(e), e
    else:
        assert z.shape == (0, BIG)


def test_unknown_attribute_value_is_rejected_cleanly():
    for node in (helper.make_node("Pad", ["x", "p"], ["z"], mode="no_such_mode"),
                 helper.make_node("Resize", ["x", "", "sc"], ["z"], mode="no_such_mode")):
        inits = [numpy_helper.from_array(np.array([0, 1, 0, 1], np.int64), "p"),
                 numpy_helper.from_array(np.array([1, 2], np.float32), "sc")]
        m = model([node], [vi("x", TP.FLOAT, [2, 2])], [vi("z", TP.FLOAT, None)], inits=inits,
                  opset=19)
        with pytest.raises(Exception) as e:
            s = ort.InferenceSession(m, sess_options=om.session_options("cpu", fallback=True))
            s.run(None, {"x": np.ones((2, 2), np.float32)})
        assert "mode" in str(e.value).lower(), e.value
    # An out-of-range attribute value the schema cannot catch: Softmax axis 7 on rank 2.
    m = model([helper.make_node("Softmax", ["x"], ["z"], axis=7)], [vi("x", TP.FLOAT, ["a", "b"])],
              [vi("z", TP.FLOAT, None)], opset=13)
    with pytest.raises(Exception) as e:
        s = ort.InferenceSession(m, sess_options=om.session_options("cpu", fallback=True))
        s.run(None, {"x": np.ones((2, 2), np.float32)})
    assert "axis" in str(e.value).lower(), e.value
    good_chain_run(mlx_session(CHAIN))


@pytest.mark.parametrize("case", ["clip_min_only", "clip_max_only", "pad_no_value", "slice_no_axes"])
def test_missing_optional_inputs_match_the_cpu_ep(case):
    x = rng.standard_normal((3, 4)).astype(np.float32)
    lo = numpy_helper.from_array(np.array(-0.2, np.float32), "lo")
    hi = numpy_helper.from_array(np.array(0.3, np.float32), "hi")
    if case == "clip_min_only":
        node, inits = helper.make_node("Clip", ["x", "lo", ""], ["z"]), [lo]
    elif case == "clip_max_only":
        node, inits = helper.make_node("Clip", ["x", "", "hi"], ["z"]), [hi]
    elif case == "pad_no_value":
        node = helper.make_node("Pad", ["x", "p", ""], ["z"])
        inits = [numpy_helper.from_array(np.array([1, 0, 0, 2], np.int64), "p")]
    else:
        node = helper.make_node("Slice", ["x", "st", "en"], ["z"])
        inits = [numpy_helper.from_array(np.array([1, 1], np.int64), "st"),
                 numpy_helper.from_array(np.array([3, 3], np.int64), "en")]
    m = model([node], [vi("x", TP.FLOAT, [3, 4])], [vi("z", TP.FLOAT, None)], inits=inits)
    ref = ort.InferenceSession(m, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    s = mlx_session(m)
    for _ in range(2):  # eager probe, then compiled
        np.testing.assert_array_equal(s.run(None, {"x": x})[0], ref)


def test_initializer_of_the_wrong_size_is_rejected_cleanly():
    w = TP()  # built by hand: onnx.helper refuses a size mismatch
    w.name, w.data_type = "w", TP.FLOAT
    w.dims.extend([3])
    w.raw_data = np.ones(2, np.float32).tobytes()  # 2 elements, 3 declared
    m = model([helper.make_node("Add", ["x", "w"], ["z"])], [vi("x", TP.FLOAT, [3])],
              [vi("z", TP.FLOAT, [3])], inits=[w])
    for fallback in (False, True):
        with pytest.raises(Exception):
            s = ort.InferenceSession(m, sess_options=om.session_options("cpu", fallback=fallback))
            s.run(None, {"x": np.ones(3, np.float32)})
    good_chain_run(mlx_session(CHAIN))


@pytest.mark.parametrize("opsets", [[("", 99)], [("", 0)], [("", 17), ("ai.onnx.ml", 99)],
                                    [("", 17), ("com.example.nothing", 1)]])
def test_opset_numbers_out_of_range_are_rejected_or_fall_back(opsets):
    g = helper.make_graph([helper.make_node("Add", ["x", "x"], ["z"])], "g",
                          [vi("x", TP.FLOAT, [3])], [vi("z", TP.FLOAT, [3])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets])
    m.ir_version = 9
    x = np.arange(3, dtype=np.float32)
    try:
        s = ort.InferenceSession(m.SerializeToString(),
                                 sess_options=om.session_options("cpu", fallback=True))
    except Exception as e:  # ORT refuses the model itself: a clear message, no crash
        assert "opset" in str(e).lower() or "domain" in str(e).lower() or "version" in str(e).lower(), e
    else:  # an unused unknown domain is legal: the model must run, and correctly
        np.testing.assert_array_equal(s.run(None, {"x": x})[0], 2 * x)
    good_chain_run(mlx_session(CHAIN))


# ---- memory limits: MLX's CPU allocator records its limit but does not enforce it, so the EP
# ---- checks before it copies or evaluates (src/engine/memory_guard.h).

def test_model_larger_than_the_memory_limit_fails_cleanly():
    import mlx.core as mx  # the same libmlx as the EP's: its limits are process-wide
    default = mx.get_memory_limit()
    w = numpy_helper.from_array(np.ones((4096, 4096), np.float32), "w")  # 64 MiB initializer
    m = model([helper.make_node("Add", ["x", "w"], ["z"])], [vi("x", TP.FLOAT, [4096, 4096])],
              [vi("z", TP.FLOAT, None)], inits=[w])
    with pytest.raises(Exception) as e:
        s = mlx_session(m, memory_limit_mb=16)
        s.run(None, {"x": np.ones((4096, 4096), np.float32)})
    msg = str(e.value)
    assert "memory limit" in msg and "memory_limit_mb" in msg, msg
    del e  # its traceback holds the half-made session (and so the EP) alive
    gc.collect()
    assert mx.get_memory_limit() == default  # the session's limit went with it
    good_chain_run(mlx_session(CHAIN))


def test_run_over_the_memory_limit_is_an_error_then_recovers():
    import mlx.core as mx
    default = mx.get_memory_limit()
    s = mlx_session(CHAIN, memory_limit_mb=16)
    assert mx.get_memory_limit() == 16 << 20
    with pytest.raises(Exception) as e:  # a 24 MiB input
        s.run(None, {"x": np.ones((1 << 21, 3), np.float32), "y": np.ones(3, np.float32)})
    assert "memory limit" in str(e.value), e.value
    assert "Falling back" not in str(e.value)
    good_chain_run(s)  # small inputs still run in the same session
    del s, e  # the traceback in e holds the session too
    gc.collect()
    assert mx.get_memory_limit() == default


def test_result_beyond_memory_is_refused_before_allocation():
    # Expand to 2^48 float32 elements (1 PiB), each dim within int32: above MLX's default limit
    # (a share of RAM) anywhere. Without the check, MLX took the memory and crashed in its copy
    # kernel (2^34 elements: SIGSEGV in copy_general_general; 2^32: OOM-killed).
    shape = numpy_helper.from_array(np.array([65536, 65536, 65536], np.int64), "shape")
    m = model([helper.make_node("Expand", ["x", "shape"], ["z"])],
              [vi("x", TP.FLOAT, [1])], [vi("z", TP.FLOAT, None)], inits=[shape])
    s = mlx_session(m)
    with pytest.raises(Exception) as e:
        s.run(None, {"x": np.ones(1, np.float32)})
    assert "memory limit" in str(e.value), e.value
