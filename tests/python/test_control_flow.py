"""If / Loop / Scan: claimed whole with their bodies, translated by the engine into one MLX graph.
Every test compares with ORT's CPU EP; sessions run with CPU fallback disabled, so the control-flow
node provably ran on MLX (bodies included)."""
import json

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

import onnxruntime_mlx as om
from oracle import DEVICE, assert_close, check_model, run_cpu

rng = np.random.default_rng(3)


def vi(name, dtype, shape=None):
    return helper.make_tensor_value_info(name, dtype, shape)


def make_model(nodes, inputs, outputs, inits=(), opset=21):
    g = helper.make_graph(nodes, "cf", inputs, outputs, list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 10
    return m


def const(name, value):
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.asarray(value)))


def mlx_session(model, **options):
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so = om.record_assignment(om.session_options(DEVICE, fallback=False, so=so, **options))
    s = ort.InferenceSession(model.SerializeToString(), sess_options=so)
    placed = om.placement(s)
    assert set(placed) == {om.EP_NAME}, placed
    return s


def check_runs(model, feed_list, **options):
    """One MLX session fed every feed in turn (twice, so compiled replays are checked too),
    each compared with the CPU EP."""
    s = mlx_session(model, **options)
    for _ in range(2):
        for feeds in feed_list:
            ref = run_cpu(model, feeds)
            out = s.run(None, feeds)
            for i, (a, e) in enumerate(zip(out, ref)):
                assert_close(a, e, name=f"output {i} for {feeds}")


# ---- If ---------------------------------------------------------------------------------------

def if_on_int64_model():
    """y = If(k > 2) then (x + 1) * t else x * 2 (shape [2,3]) -- outer-scope x and t in the
    branches; t comes from a node of the main graph."""
    then_g = helper.make_graph(
        [const("one", np.float32(1)), helper.make_node("Add", ["x", "one"], ["p"]),
         helper.make_node("Mul", ["p", "t"], ["then_y"])],
        "then", [], [vi("then_y", TP.FLOAT, [2, 3])])
    else_g = helper.make_graph(
        [const("two", np.float32(2)), helper.make_node("Mul", ["x", "two"], ["else_y"])],
        "else", [], [vi("else_y", TP.FLOAT, [2, 3])])
    nodes = [const("thr", np.int64(2)), helper.make_node("Greater", ["k", "thr"], ["c"]),
             helper.make_node("Neg", ["x"], ["t"]),
             helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g)]
    return make_model(nodes, [vi("k", TP.INT64, []), vi("x", TP.FLOAT, [2, 3])],
                      [vi("y", TP.FLOAT, [2, 3])])


def test_if_data_dependent_int64_condition():
    x = rng.standard_normal((2, 3)).astype(np.float32)
    feeds = [{"k": np.array(k, np.int64), "x": x} for k in (5, 1, 3, -7, 2)]
    check_runs(if_on_int64_model(), feeds)


def test_if_data_dependent_condition_on_large_input_runs_eager():
    """The condition derives from a large tensor: not keyable, so the program stays eager and
    each run translates the branch its data selects."""
    then_g = helper.make_graph([helper.make_node("Exp", ["x"], ["a"])], "then", [],
                               [vi("a", TP.FLOAT, None)])
    else_g = helper.make_graph([helper.make_node("ReduceSum", ["x"], ["b"], keepdims=0)], "else",
                               [], [vi("b", TP.FLOAT, None)])
    nodes = [helper.make_node("ReduceMean", ["x"], ["m"], keepdims=0), const("z", np.float32(0)),
             helper.make_node("Greater", ["m", "z"], ["c"]),
             helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g)]
    m = make_model(nodes, [vi("x", TP.FLOAT, [100, 50])], [vi("y", TP.FLOAT, None)])
    base = rng.standard_normal((100, 50)).astype(np.float32)
    # The branches' outputs differ in shape ([100,50] vs scalar): fine in eager mode.
    check_runs(m, [{"x": base + 1}, {"x": base - 1}, {"x": base + 2}])


def test_if_constant_condition_translates_only_the_taken_branch():
    then_g = helper.make_graph([helper.make_node("Sigmoid", ["x"], ["a"])], "then", [],
                               [vi("a", TP.FLOAT, [3, 4])])
    # The other branch would fail at run time (z's shape does not broadcast with x's): it must
    # never be translated.
    else_g = helper.make_graph([helper.make_node("Add", ["x", "z"], ["b"])], "else", [],
                               [vi("b", TP.FLOAT, None)])
    nodes = [helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g)]
    m = make_model(nodes, [vi("x", TP.FLOAT, [3, 4]), vi("z", TP.FLOAT, ["n"])],
                   [vi("y", TP.FLOAT, [3, 4])],
                   inits=[numpy_helper.from_array(np.array(True), "c")])
    check_model(m, {"x": rng.standard_normal((3, 4)).astype(np.float32),
                    "z": np.ones(5, np.float32)})


def test_if_branches_with_outer_scope_initializer():
    """w is an initializer of the main graph read only inside the branches."""
    w = rng.standard_normal((4,)).astype(np.float32)
    then_g = helper.make_graph([helper.make_node("Mul", ["x", "w"], ["a"])], "then", [],
                               [vi("a", TP.FLOAT, [2, 4])])
    else_g = helper.make_graph([helper.make_node("Sub", ["x", "w"], ["g"]),
                                helper.make_node("Abs", ["g"], ["b"])], "else", [],
                               [vi("b", TP.FLOAT, [2, 4])])
    nodes = [helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g)]
    m = make_model(nodes, [vi("c", TP.BOOL, []), vi("x", TP.FLOAT, [2, 4])],
                   [vi("y", TP.FLOAT, [2, 4])], inits=[numpy_helper.from_array(w, "w")])
    x = rng.standard_normal((2, 4)).astype(np.float32)
    check_runs(m, [{"c": np.array(True), "x": x}, {"c": np.array(False), "x": x}])


# ---- Loop -------------------------------------------------------------------------------------

def test_loop_static_trip_count_with_state_and_scan_outputs():
    """for i in range(5): acc = acc * 0.5 + x[i]; out_i = acc + i (scan)."""
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("Gather", ["x", "i"], ["xi"], axis=0),
         const("half", np.float32(0.5)),
         helper.make_node("Mul", ["acc_in", "half"], ["h"]),
         helper.make_node("Add", ["h", "xi"], ["acc_out"]),
         helper.make_node("Cast", ["i"], ["fi"], to=TP.FLOAT),
         helper.make_node("Add", ["acc_out", "fi"], ["scan"])],
        "body", [vi("i", TP.INT64, []), vi("cond_in", TP.BOOL, []), vi("acc_in", TP.FLOAT, [3])],
        [vi("cond_out", TP.BOOL, []), vi("acc_out", TP.FLOAT, [3]), vi("scan", TP.FLOAT, [3])])
    nodes = [helper.make_node("Loop", ["M", "c", "acc0"], ["acc", "scans"], body=body)]
    m = make_model(nodes, [vi("x", TP.FLOAT, [5, 3]), vi("acc0", TP.FLOAT, [3])],
                   [vi("acc", TP.FLOAT, [3]), vi("scans", TP.FLOAT, [5, 3])],
                   inits=[numpy_helper.from_array(np.int64(5), "M"),
                          numpy_helper.from_array(np.array(True), "c")])
    x = rng.standard_normal((5, 3)).astype(np.float32)
    check_model(m, {"x": x, "acc0": np.zeros(3, np.float32)})


def data_dependent_exit_model():
    """while sum(y) < limit and i < M: y = y * 2 + 1 (cond computed in the body from an
    outer-scope limit)."""
    body = helper.make_graph(
        [const("two", np.float32(2)), const("one", np.float32(1)),
         helper.make_node("Mul", ["y_in", "two"], ["y2"]),
         helper.make_node("Add", ["y2", "one"], ["y_out"]),
         helper.make_node("ReduceSum", ["y_out"], ["s"], keepdims=0),
         helper.make_node("Less", ["s", "limit"], ["cond_out"]),
         helper.make_node("Identity", ["s"], ["sums"])],
        "body", [vi("i", TP.INT64, []), vi("cond_in", TP.BOOL, []), vi("y_in", TP.FLOAT, [4])],
        [vi("cond_out", TP.BOOL, []), vi("y_out", TP.FLOAT, [4]), vi("sums", TP.FLOAT, [])])
    nodes = [helper.make_node("ReduceSum", ["y0"], ["s0"], keepdims=0),
             helper.make_node("Less", ["s0", "limit"], ["c0"]),
             helper.make_node("Loop", ["M", "c0", "y0"], ["y", "sums"], body=body)]
    return make_model(nodes, [vi("M", TP.INT64, []), vi("limit", TP.FLOAT, []),
                              vi("y0", TP.FLOAT, [4])],
                      [vi("y", TP.FLOAT, [4]), vi("sums", TP.FLOAT, [None])])


def test_loop_data_dependent_exit():
    y0 = np.array([0.5, -0.25, 1.0, 0.0], np.float32)
    feeds = [{"M": np.array(m, np.int64), "limit": np.array(lim, np.float32), "y0": y0}
             for m, lim in ((100, 50.0), (100, 1000.0), (3, 1000.0), (100, -5.0), (0, 10.0))]
    check_runs(data_dependent_exit_model(), feeds)


def test_loop_cond_only_while_loop():
    """M omitted: a while loop ended by the body's condition alone."""
    body = helper.make_graph(
        [const("one", np.int64(1)), helper.make_node("Add", ["n_in", "one"], ["n_out"]),
         helper.make_node("Less", ["n_out", "stop"], ["cond_out"]),
         helper.make_node("Mul", ["n_out", "n_out"], ["sq"])],
        "body", [vi("i", TP.INT64, []), vi("cond_in", TP.BOOL, []), vi("n_in", TP.INT64, [])],
        [vi("cond_out", TP.BOOL, []), vi("n_out", TP.INT64, []), vi("sq", TP.INT64, [])])
    nodes = [helper.make_node("Loop", ["", "c", "n0"], ["n", "squares"], body=body)]
    m = make_model(nodes, [vi("c", TP.BOOL, []), vi("n0", TP.INT64, []), vi("stop", TP.INT64, [])],
                   [vi("n", TP.INT64, []), vi("squares", TP.INT64, [None])])
    feeds = [{"c": np.array(True), "n0": np.array(0, np.int64), "stop": np.array(s, np.int64)}
             for s in (4, 1, 9)]
    check_runs(m, feeds)


def test_nested_if_in_loop():
    """for i in range(M): acc = If(i % 2 == 0) then acc + x else acc * x  (x outer scope, two
    levels up)."""
    then_g = helper.make_graph([helper.make_node("Add", ["acc_in", "x"], ["t"])], "then", [],
                               [vi("t", TP.FLOAT, [2, 2])])
    else_g = helper.make_graph([helper.make_node("Mul", ["acc_in", "x"], ["e"])], "else", [],
                               [vi("e", TP.FLOAT, [2, 2])])
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]), const("two", np.int64(2)),
         const("zero", np.int64(0)), helper.make_node("Mod", ["i", "two"], ["r"]),
         helper.make_node("Equal", ["r", "zero"], ["even"]),
         helper.make_node("If", ["even"], ["acc_out"], then_branch=then_g, else_branch=else_g),
         helper.make_node("Identity", ["acc_out"], ["trace"])],
        "body", [vi("i", TP.INT64, []), vi("cond_in", TP.BOOL, []), vi("acc_in", TP.FLOAT, [2, 2])],
        [vi("cond_out", TP.BOOL, []), vi("acc_out", TP.FLOAT, [2, 2]), vi("trace", TP.FLOAT, [2, 2])])
    nodes = [helper.make_node("Loop", ["M", "", "acc0"], ["acc", "trace"], body=body)]
    m = make_model(nodes, [vi("M", TP.INT64, []), vi("x", TP.FLOAT, [2, 2]),
                           vi("acc0", TP.FLOAT, [2, 2])],
                   [vi("acc", TP.FLOAT, [2, 2]), vi("trace", TP.FLOAT, [None, 2, 2])])
    x = rng.uniform(0.5, 1.5, (2, 2)).astype(np.float32)
    feeds = [{"M": np.array(n, np.int64), "x": x, "acc0": np.ones((2, 2), np.float32)}
             for n in (5, 2, 5)]
    check_runs(m, feeds)


def test_loop_carried_shape_changes_and_iteration_slices():
    """Loop-carried values may change shape; Slice with starts from the iteration number (a
    host read that stays compiled: the counter is host-known)."""
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("Unsqueeze", ["i", "ax"], ["st"]), const("one", np.int64(1)),
         helper.make_node("Add", ["i", "one"], ["e"]),
         helper.make_node("Unsqueeze", ["e", "ax"], ["en"]),
         helper.make_node("Slice", ["x", "st", "en"], ["row"]),
         helper.make_node("Concat", ["acc_in", "row"], ["acc_out"], axis=0)],
        "body", [vi("i", TP.INT64, []), vi("cond_in", TP.BOOL, []), vi("acc_in", TP.FLOAT, None)],
        [vi("cond_out", TP.BOOL, []), vi("acc_out", TP.FLOAT, None)])
    nodes = [helper.make_node("Loop", ["M", "", "acc0"], ["acc"], body=body)]
    m = make_model(nodes, [vi("M", TP.INT64, []), vi("x", TP.FLOAT, [6, 3]),
                           vi("acc0", TP.FLOAT, [1, 3])], [vi("acc", TP.FLOAT, [None, 3])],
                   inits=[numpy_helper.from_array(np.array([0], np.int64), "ax")])
    x = rng.standard_normal((6, 3)).astype(np.float32)
    check_runs(m, [{"M": np.array(n, np.int64), "x": x, "acc0": np.zeros((1, 3), np.float32)}
                   for n in (4, 6, 0)])


# ---- Scan -------------------------------------------------------------------------------------

@pytest.mark.parametrize("in_dirs,out_dirs", [([0, 0], [0]), ([1, 0], [1]), ([0, 1], [0]),
                                              ([1, 1], [1])])
def test_scan_axes_and_directions(in_dirs, out_dirs):
    """state = state + a_t * b_t; out_t = state * 2 -- scan input a along axis 1 and b along
    axis 0, output stacked along axis 1 (or -1)."""
    body = helper.make_graph(
        [helper.make_node("Mul", ["a_t", "b_t"], ["ab"]),
         helper.make_node("Add", ["s_in", "ab"], ["s_out"]), const("two", np.float32(2)),
         helper.make_node("Mul", ["s_out", "two"], ["o"])],
        "body", [vi("s_in", TP.FLOAT, [2]), vi("a_t", TP.FLOAT, [2]), vi("b_t", TP.FLOAT, [2])],
        [vi("s_out", TP.FLOAT, [2]), vi("o", TP.FLOAT, [2])])
    nodes = [helper.make_node("Scan", ["s0", "a", "b"], ["s", "outs"], body=body, num_scan_inputs=2,
                              scan_input_axes=[1, 0], scan_input_directions=in_dirs,
                              scan_output_axes=[-1], scan_output_directions=out_dirs)]
    m = make_model(nodes, [vi("s0", TP.FLOAT, [2]), vi("a", TP.FLOAT, [2, 5]),
                           vi("b", TP.FLOAT, [5, 2])], [vi("s", TP.FLOAT, [2]), vi("outs", TP.FLOAT, [2, 5])],
                   opset=16)
    feeds = {"s0": np.zeros(2, np.float32), "a": rng.standard_normal((2, 5)).astype(np.float32),
             "b": rng.standard_normal((5, 2)).astype(np.float32)}
    check_model(m, feeds)


def test_scan_with_outer_scope_value_and_no_state():
    body = helper.make_graph([helper.make_node("MatMul", ["x_t", "w"], ["y_t"])], "body",
                             [vi("x_t", TP.FLOAT, [3])], [vi("y_t", TP.FLOAT, [4])])
    nodes = [helper.make_node("Relu", ["w0"], ["w"]),
             helper.make_node("Scan", ["x"], ["ys"], body=body, num_scan_inputs=1)]
    m = make_model(nodes, [vi("x", TP.FLOAT, [6, 3]), vi("w0", TP.FLOAT, [3, 4])],
                   [vi("ys", TP.FLOAT, [6, 4])], opset=11)
    check_model(m, {"x": rng.standard_normal((6, 3)).astype(np.float32),
                    "w0": rng.standard_normal((3, 4)).astype(np.float32)})


def test_scan8_batched():
    body = helper.make_graph([helper.make_node("Add", ["s_in", "x_t"], ["s_out"]),
                              helper.make_node("Identity", ["s_out"], ["o"])], "body",
                             [vi("s_in", TP.FLOAT, [2]), vi("x_t", TP.FLOAT, [2])],
                             [vi("s_out", TP.FLOAT, [2]), vi("o", TP.FLOAT, [2])])
    nodes = [helper.make_node("Scan", ["", "s0", "x"], ["s", "outs"], body=body, num_scan_inputs=1,
                              directions=[1])]
    m = make_model(nodes, [vi("s0", TP.FLOAT, [3, 2]), vi("x", TP.FLOAT, [3, 4, 2])],
                   [vi("s", TP.FLOAT, [3, 2]), vi("outs", TP.FLOAT, [3, 4, 2])], opset=8)
    check_model(m, {"s0": rng.standard_normal((3, 2)).astype(np.float32),
                    "x": rng.standard_normal((3, 4, 2)).astype(np.float32)})


def test_scan_inside_loop_with_positive_output_axis():
    """A Scan (rank-2 per-step output stacked along axis 1) nested in a Loop body."""
    scan_body = helper.make_graph(
        [helper.make_node("Add", ["s_in", "r"], ["s_out"]),
         helper.make_node("Unsqueeze", ["s_out", "ax"], ["o"])],
        "scan_body", [vi("s_in", TP.FLOAT, [3]), vi("r", TP.FLOAT, [3])],
        [vi("s_out", TP.FLOAT, [3]), vi("o", TP.FLOAT, [1, 3])])
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("Scan", ["acc_in", "x"], ["acc_out", "steps"], body=scan_body,
                          num_scan_inputs=1, scan_output_axes=[1])],
        "body", [vi("i", TP.INT64, []), vi("cond_in", TP.BOOL, []), vi("acc_in", TP.FLOAT, [3])],
        [vi("cond_out", TP.BOOL, []), vi("acc_out", TP.FLOAT, [3]), vi("steps", TP.FLOAT, [1, 4, 3])])
    nodes = [helper.make_node("Loop", ["M", "", "acc0"], ["acc", "all_steps"], body=body)]
    m = make_model(nodes, [vi("M", TP.INT64, []), vi("x", TP.FLOAT, [4, 3]), vi("acc0", TP.FLOAT, [3])],
                   [vi("acc", TP.FLOAT, [3]), vi("all_steps", TP.FLOAT, [None, 1, 4, 3])],
                   inits=[numpy_helper.from_array(np.array([0], np.int64), "ax")])
    x = rng.standard_normal((4, 3)).astype(np.float32)
    check_runs(m, [{"M": np.array(n, np.int64), "x": x, "acc0": np.zeros(3, np.float32)}
                   for n in (3, 1)])


def test_if_on_shape_derived_condition():
    """cond = Shape(x)[0] > 2: host-known from shapes alone."""
    then_g = helper.make_graph([helper.make_node("ReduceSum", ["x"], ["a"], keepdims=1)], "then",
                               [], [vi("a", TP.FLOAT, None)])
    else_g = helper.make_graph([helper.make_node("Neg", ["x"], ["b"])], "else", [],
                               [vi("b", TP.FLOAT, None)])
    nodes = [helper.make_node("Shape", ["x"], ["s"]), const("zero", np.int64(0)),
             helper.make_node("Gather", ["s", "zero"], ["n"]), const("two", np.int64(2)),
             helper.make_node("Greater", ["n", "two"], ["c"]),
             helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g)]
    m = make_model(nodes, [vi("x", TP.FLOAT, ["n", 3])], [vi("y", TP.FLOAT, None)])
    check_runs(m, [{"x": rng.standard_normal((n, 3)).astype(np.float32)} for n in (1, 4, 2, 5)])


def test_outer_value_from_a_cpu_node_reaches_the_body():
    """The If runs on MLX, but a value its branch reads comes from nodes MLX declines (float8
    casts): it must become an input of the fused node (ORT's implicit-input handling)."""
    then_g = helper.make_graph([helper.make_node("Add", ["t", "x"], ["a"])], "then", [],
                               [vi("a", TP.FLOAT, [4])])
    else_g = helper.make_graph([helper.make_node("Sub", ["t", "x"], ["b"])], "else", [],
                               [vi("b", TP.FLOAT, [4])])
    nodes = [helper.make_node("Cast", ["x"], ["f8"], to=TP.FLOAT8E4M3FN),
             helper.make_node("Cast", ["f8"], ["t"], to=TP.FLOAT),
             helper.make_node("If", ["c"], ["y"], name="the_if", then_branch=then_g,
                              else_branch=else_g)]
    m = make_model(nodes, [vi("c", TP.BOOL, []), vi("x", TP.FLOAT, [4])], [vi("y", TP.FLOAT, [4])])
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so = om.record_assignment(om.session_options(DEVICE, fallback=True, so=so))
    s = ort.InferenceSession(m.SerializeToString(), sess_options=so)
    assert ("the_if", "If") in om.placement(s)[om.EP_NAME]
    x = np.array([0.5, -1.25, 3.0, 100.0], np.float32)
    for c in (True, False, True):
        feeds = {"c": np.array(c), "x": x}
        assert_close(s.run(None, feeds)[0], run_cpu(m, feeds)[0])


# ---- Claim decisions --------------------------------------------------------------------------

def test_unsupported_body_node_declines_the_whole_if(tmp_path):
    """A body node the EP cannot run makes the If fall back (whole), and the decline reason
    names the inner node."""
    # A string tensor: no MLX dtype (sequences, declined here before, are supported now).
    then_g = helper.make_graph([helper.make_node("Cast", ["x"], ["sx"], to=TP.STRING),
                                helper.make_node("Size", ["sx"], ["n"])], "then", [],
                               [vi("n", TP.INT64, [])])
    else_g = helper.make_graph([helper.make_node("Size", ["x"], ["m"])], "else", [],
                               [vi("m", TP.INT64, [])])
    nodes = [helper.make_node("If", ["c"], ["y"], name="the_if", then_branch=then_g,
                              else_branch=else_g)]
    m = make_model(nodes, [vi("c", TP.BOOL, []), vi("x", TP.FLOAT, [3])], [vi("y", TP.INT64, [])])
    report = tmp_path / "report.jsonl"
    so = ort.SessionOptions()
    so = om.record_assignment(om.session_options(DEVICE, fallback=True, so=so,
                                                 report_path=str(report)))
    s = ort.InferenceSession(m.SerializeToString(), sess_options=so)
    assert om.EP_NAME not in om.placement(s)
    feeds = {"c": np.array(True), "x": np.ones(3, np.float32)}
    assert s.run(None, feeds)[0] == run_cpu(m, feeds)[0]
    reasons = [json.loads(line) for line in report.read_text().splitlines()]
    the_if = [r for r in reasons if r["node"] == "the_if"]
    assert the_if and "Cast" in the_if[0]["reason"], reasons


def test_loop_without_m_and_cond_is_declined():
    """Neither M nor cond: an endless loop on any EP. Declined (session created, never run)."""
    body = helper.make_graph([helper.make_node("Identity", ["cond_in"], ["cond_out"]),
                              helper.make_node("Identity", ["v_in"], ["v_out"])], "body",
                             [vi("i", TP.INT64, []), vi("cond_in", TP.BOOL, []),
                              vi("v_in", TP.FLOAT, [1])],
                             [vi("cond_out", TP.BOOL, []), vi("v_out", TP.FLOAT, [1])])
    nodes = [helper.make_node("Loop", ["", "", "x"], ["y"], name="endless", body=body)]
    m = make_model(nodes, [vi("x", TP.FLOAT, [1])], [vi("y", TP.FLOAT, [1])])
    so = om.record_assignment(om.session_options(DEVICE, fallback=True))
    s = ort.InferenceSession(m.SerializeToString(), sess_options=so)
    assert om.EP_NAME not in om.placement(s)


def test_placement_accounts_for_body_nodes():
    """placement(session, model) lists the nodes inside an If's branches under the EP that claimed
    the If: here MLX, with fallback off, so they ran there."""
    m = if_on_int64_model()
    m.graph.node[-1].name = "branch"
    s = mlx_session(m)
    plain = om.placement(s)
    full = om.placement(s, m)
    body = sorted(n for n, _ in full[om.EP_NAME] if n not in {x for x, _ in plain[om.EP_NAME]})
    assert body == ["branch/else_branch/Constant", "branch/else_branch/Mul",
                    "branch/then_branch/Add", "branch/then_branch/Constant",
                    "branch/then_branch/Mul"], body
    assert set(full) == {om.EP_NAME}
