"""Reliability gates, fast forms (the long forms are tools/reliability.py; README "Reliability").

Bad models and inputs must give an error status (or run correctly on the fallback), never a
crash, and the next good run in the same session must still be correct. Runs must be correct
from many threads at once, on one shared session and on separate ones."""
import gc
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
