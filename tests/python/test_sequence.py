"""Sequences (seq(tensor)) and optionals inside fused groups, against ORT's CPU EP.

Every model here runs with CPU fallback disabled and placement must show every node on MLX
(check_model / mlx_session). Sequences and optionals only live inside a fused group (ORT's
plugin-EP kernel API returns tensors only): the models end in tensors, and the decline tests
show what happens when a sequence would have to leave the group."""
import json

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

import onnxruntime_mlx as om
from oracle import DEVICE, assert_close, check_model, run_cpu

rng = np.random.default_rng(11)


def vi(name, dtype, shape=None):
    return helper.make_tensor_value_info(name, dtype, shape)


def seq_vi(name, dtype):
    return helper.make_tensor_sequence_value_info(name, dtype, None)


def opt_vi(name, dtype, shape=None):
    return helper.make_value_info(
        name, helper.make_optional_type_proto(helper.make_tensor_type_proto(dtype, shape)))


def make_model(nodes, inputs, outputs, inits=(), opset=21):
    g = helper.make_graph(nodes, "seq", inputs, outputs, list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 10
    return m


def const(name, value):
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.asarray(value)))


def mlx_session(model):
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so = om.record_assignment(om.session_options(DEVICE, fallback=False, so=so))
    s = ort.InferenceSession(model.SerializeToString(), sess_options=so)
    placed = om.placement(s)
    assert set(placed) == {om.EP_NAME}, placed
    # ORT folds top-level Constant nodes into initializers: nothing left to place.
    n_nodes = sum(n.op_type != "Constant" for n in model.graph.node)
    assert len(placed[om.EP_NAME]) == n_nodes, placed
    return s


def check_runs(model, feed_list):
    """One MLX session fed every feed in turn, twice (the second pass replays compiled
    signatures), each compared with the CPU EP."""
    s = mlx_session(model)
    for _ in range(2):
        for feeds in feed_list:
            ref = run_cpu(model, feeds)
            out = s.run(None, feeds)
            assert len(out) == len(ref)
            for i, (a, e) in enumerate(zip(out, ref)):
                assert_close(a, e, name=f"output {i}")


# ---- Loop building a sequence (the common export) ---------------------------------------------

def loop_append_model(new_axis):
    """seq = []; for i in range(M): seq.append(x * i + i); y = ConcatFromSequence(seq)."""
    body = helper.make_graph(
        [helper.make_node("Cast", ["i"], ["fi"], to=TP.FLOAT),
         helper.make_node("Mul", ["x", "fi"], ["xi"]),
         helper.make_node("Add", ["xi", "fi"], ["t"]),
         helper.make_node("SequenceInsert", ["seq_in", "t"], ["seq_out"]),
         helper.make_node("Identity", ["cond_in"], ["cond_out"])],
        "body", [vi("i", TP.INT64, []), vi("cond_in", TP.BOOL, []), seq_vi("seq_in", TP.FLOAT)],
        [vi("cond_out", TP.BOOL, []), seq_vi("seq_out", TP.FLOAT)])
    nodes = [helper.make_node("SequenceEmpty", [], ["empty"], dtype=TP.FLOAT),
             helper.make_node("Loop", ["M", "", "empty"], ["seq"], body=body),
             helper.make_node("ConcatFromSequence", ["seq"], ["y"], axis=1, new_axis=new_axis),
             helper.make_node("SequenceLength", ["seq"], ["n"])]
    return make_model(nodes, [vi("M", TP.INT64, []), vi("x", TP.FLOAT, [2, 3])],
                      [vi("y", TP.FLOAT, None), vi("n", TP.INT64, [])])


@pytest.mark.parametrize("new_axis", [0, 1])
def test_loop_appends_then_concat_from_sequence(new_axis):
    x = rng.standard_normal((2, 3)).astype(np.float32)
    feeds = [{"M": np.array(m, np.int64), "x": x} for m in (3, 1, 5)]
    check_runs(loop_append_model(new_axis), feeds)


def test_loop_with_cond_grows_sequence_until_data_says_stop():
    """A while-loop (cond computed from data) that grows a sequence; the exit is a host read of
    data, so each run translates (and keys) its own number of iterations."""
    body = helper.make_graph(
        [const("half", np.float32(0.5)), helper.make_node("Mul", ["v_in", "half"], ["v_out"]),
         helper.make_node("SequenceInsert", ["seq_in", "v_out"], ["seq_out"]),
         helper.make_node("ReduceMax", ["v_out"], ["mx"], keepdims=0),
         const("lim", np.float32(1.0)), helper.make_node("Greater", ["mx", "lim"], ["cond_out"])],
        "body", [vi("i", TP.INT64, []), vi("cond_in", TP.BOOL, []), vi("v_in", TP.FLOAT, [4]),
                 seq_vi("seq_in", TP.FLOAT)],
        [vi("cond_out", TP.BOOL, []), vi("v_out", TP.FLOAT, [4]), seq_vi("seq_out", TP.FLOAT)])
    nodes = [const("go", np.array(True)),
             helper.make_node("SequenceEmpty", [], ["empty"], dtype=TP.FLOAT),
             helper.make_node("Loop", ["", "go", "x", "empty"], ["last", "seq"], body=body),
             helper.make_node("ConcatFromSequence", ["seq"], ["y"], axis=0, new_axis=1)]
    m = make_model(nodes, [vi("x", TP.FLOAT, [4])], [vi("last", TP.FLOAT, [4]),
                                                     vi("y", TP.FLOAT, None)])
    feeds = [{"x": np.array([v, 1, 0.5, 2], np.float32)} for v in (3.0, 40.0, 7.0)]
    check_runs(m, feeds)


# ---- SplitToSequence / SequenceAt -------------------------------------------------------------

@pytest.mark.parametrize("split,keepdims", [(None, 1), (None, 0), (np.int64(2), 1),
                                            (np.array([1, 3, 1], np.int64), 1)])
def test_split_to_sequence_then_sequence_at(split, keepdims):
    x = rng.standard_normal((3, 5)).astype(np.float32)
    inits = [numpy_helper.from_array(np.int64(0), "p0"), numpy_helper.from_array(np.int64(-1), "pl")]
    if split is not None:
        inits.append(numpy_helper.from_array(np.asarray(split), "split"))
    nodes = [helper.make_node("SplitToSequence", ["x"] + (["split"] if split is not None else []),
                              ["seq"], axis=1, keepdims=keepdims),
             helper.make_node("SequenceAt", ["seq", "p0"], ["first"]),
             helper.make_node("SequenceAt", ["seq", "pl"], ["last"]),
             helper.make_node("SequenceLength", ["seq"], ["n"])]
    m = make_model(nodes, [vi("x", TP.FLOAT, [3, 5])],
                   [vi("first", TP.FLOAT, None), vi("last", TP.FLOAT, None),
                    vi("n", TP.INT64, [])], inits)
    check_model(m, {"x": x})


def test_sequence_at_position_from_input_is_keyed():
    """The position is a graph input read on the host: each value keys its own replay."""
    nodes = [helper.make_node("SplitToSequence", ["x"], ["seq"], axis=0, keepdims=0),
             helper.make_node("SequenceAt", ["seq", "p"], ["row"]),
             helper.make_node("Neg", ["row"], ["y"])]
    m = make_model(nodes, [vi("x", TP.FLOAT, [4, 3]), vi("p", TP.INT32, [])],
                   [vi("y", TP.FLOAT, [3])])
    x = rng.standard_normal((4, 3)).astype(np.float32)
    check_runs(m, [{"x": x, "p": np.array(p, np.int32)} for p in (0, 3, -2, 1)])


def test_construct_insert_erase_length():
    a, b, c = (rng.standard_normal((2, 2)).astype(np.float32) for _ in range(3))
    nodes = [helper.make_node("SequenceConstruct", ["a", "b"], ["s0"]),
             helper.make_node("SequenceInsert", ["s0", "c", "front"], ["s1"]),   # c a b
             helper.make_node("SequenceInsert", ["s1", "a", "mid"], ["s2"]),     # c a a b
             helper.make_node("SequenceErase", ["s2", "front"], ["s3"]),         # a a b
             helper.make_node("SequenceErase", ["s3"], ["s4"]),                  # a a
             helper.make_node("SequenceInsert", ["s4", "c"], ["s5"]),            # a a c
             helper.make_node("SequenceLength", ["s5"], ["n"]),
             helper.make_node("ConcatFromSequence", ["s5"], ["y"], axis=-1)]
    inits = [numpy_helper.from_array(np.int64(0), "front"),
             numpy_helper.from_array(np.int64(-1), "mid")]
    m = make_model(nodes, [vi(k, TP.FLOAT, [2, 2]) for k in "abc"],
                   [vi("y", TP.FLOAT, None), vi("n", TP.INT64, [])], inits)
    check_model(m, {"a": a, "b": b, "c": c})


def test_if_returns_a_sequence():
    """The If's output is a sequence consumed in the same group (its branches build it)."""
    then_g = helper.make_graph([helper.make_node("SplitToSequence", ["x"], ["ts"], axis=0)],
                               "then", [], [seq_vi("ts", TP.FLOAT)])
    else_g = helper.make_graph([helper.make_node("Neg", ["x"], ["nx"]),
                                helper.make_node("SequenceConstruct", ["x", "nx"], ["es"])],
                               "else", [], [seq_vi("es", TP.FLOAT)])
    nodes = [helper.make_node("If", ["c"], ["s"], then_branch=then_g, else_branch=else_g),
             helper.make_node("ConcatFromSequence", ["s"], ["y"], axis=0),
             helper.make_node("SequenceLength", ["s"], ["n"])]
    m = make_model(nodes, [vi("c", TP.BOOL, []), vi("x", TP.FLOAT, [3, 2])],
                   [vi("y", TP.FLOAT, None), vi("n", TP.INT64, [])])
    x = rng.standard_normal((3, 2)).astype(np.float32)
    check_runs(m, [{"c": np.array(v), "x": x} for v in (True, False)])


def test_sequence_map_inside_a_group():
    body = helper.make_graph([helper.make_node("Mul", ["e", "k"], ["o"]),
                              helper.make_node("ReduceSum", ["e"], ["r"], keepdims=1)],
                             "map", [vi("e", TP.FLOAT, None), vi("k", TP.FLOAT, [])],
                             [vi("o", TP.FLOAT, None), vi("r", TP.FLOAT, None)])
    split = numpy_helper.from_array(np.array([1, 2, 3], np.int64), "split")
    nodes = [helper.make_node("SplitToSequence", ["x", "split"], ["s"], axis=0),
             helper.make_node("SequenceMap", ["s", "k"], ["so", "sr"], body=body),
             helper.make_node("ConcatFromSequence", ["so"], ["y"], axis=0),
             helper.make_node("ConcatFromSequence", ["sr"], ["z"], axis=0)]
    m = make_model(nodes, [vi("x", TP.FLOAT, [6, 2]), vi("k", TP.FLOAT, [])],
                   [vi("y", TP.FLOAT, None), vi("z", TP.FLOAT, None)], [split])
    check_model(m, {"x": rng.standard_normal((6, 2)).astype(np.float32),
                    "k": np.array(3, np.float32)})


# ---- Non-tensor inputs to a fused node -------------------------------------------------------

def test_sequence_graph_input():
    """A sequence fed by the caller reaches the fused node as a sequence OrtValue."""
    nodes = [helper.make_node("ConcatFromSequence", ["s"], ["y"], axis=0, new_axis=1),
             helper.make_node("SequenceLength", ["s"], ["n"])]
    m = make_model(nodes, [seq_vi("s", TP.FLOAT)], [vi("y", TP.FLOAT, None), vi("n", TP.INT64, [])])
    feeds = [{"s": [rng.standard_normal((2, 3)).astype(np.float32) for _ in range(k)]}
             for k in (3, 1, 4)]
    check_runs(m, feeds)


def optional_input_model():
    """y = OptionalHasElement(o) ? OptionalGetElement(o) + 1 : x, plus the flag itself."""
    then_g = helper.make_graph([helper.make_node("OptionalGetElement", ["o"], ["v"]),
                                const("one", np.float32(1)),
                                helper.make_node("Add", ["v", "one"], ["ty"])],
                               "then", [], [vi("ty", TP.FLOAT, [2])])
    else_g = helper.make_graph([helper.make_node("Identity", ["x"], ["ey"])], "else", [],
                               [vi("ey", TP.FLOAT, [2])])
    nodes = [helper.make_node("OptionalHasElement", ["o"], ["has"]),
             helper.make_node("If", ["has"], ["y"], then_branch=then_g, else_branch=else_g)]
    return make_model(nodes, [opt_vi("o", TP.FLOAT, [2]), vi("x", TP.FLOAT, [2])],
                      [vi("y", TP.FLOAT, [2]), vi("has", TP.BOOL, [])])


def test_optional_graph_input_with_and_without_element():
    x = np.array([5, 6], np.float32)
    feeds = [{"o": np.array([1, 2], np.float32), "x": x}, {"o": None, "x": x}]
    check_runs(optional_input_model(), feeds)


def test_optional_built_inside_the_group():
    """Optional(x) and Optional() (typed by the output) through Identity, HasElement and
    GetElement; an optional of a sequence too."""
    nodes = [helper.make_node("Optional", ["x"], ["ox"]),
             helper.make_node("Identity", ["ox"], ["ox2"]),
             helper.make_node("Optional", [], ["none"],
                              type=helper.make_tensor_type_proto(TP.FLOAT, [2])),
             helper.make_node("OptionalHasElement", ["ox2"], ["h1"]),
             helper.make_node("OptionalHasElement", ["none"], ["h2"]),
             helper.make_node("OptionalGetElement", ["ox2"], ["v"]),
             helper.make_node("SplitToSequence", ["x"], ["s"], axis=0),
             helper.make_node("Optional", ["s"], ["os"]),
             helper.make_node("OptionalGetElement", ["os"], ["s2"]),
             helper.make_node("ConcatFromSequence", ["s2"], ["z"], axis=0, new_axis=1)]
    m = make_model(nodes, [vi("x", TP.FLOAT, [2])],
                   [vi("v", TP.FLOAT, [2]), vi("h1", TP.BOOL, []), vi("h2", TP.BOOL, []),
                    vi("z", TP.FLOAT, None)])
    check_model(m, {"x": np.array([3, -4], np.float32)})


# ---- What stays declined -----------------------------------------------------------------------

def test_sequence_graph_output_is_declined_with_a_reason(tmp_path):
    """A sequence cannot be a fused node's output: SplitToSequence falls back to the CPU EP (with
    that reason), the rest still runs on MLX, results still match."""
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("SplitToSequence", ["r"], ["s"], axis=0, name="the_split")]
    m = make_model(nodes, [vi("x", TP.FLOAT, [3, 2])], [seq_vi("s", TP.FLOAT)])
    report = tmp_path / "report.jsonl"
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so = om.record_assignment(om.session_options(DEVICE, fallback=True, so=so,
                                                 report_path=str(report)))
    s = ort.InferenceSession(m.SerializeToString(), sess_options=so)
    placed = om.placement(s)
    assert len(placed.get(om.EP_NAME, [])) == 1, placed  # the Relu
    x = rng.standard_normal((3, 2)).astype(np.float32)
    out, ref = s.run(None, {"x": x})[0], run_cpu(m, {"x": x})[0]
    assert len(out) == len(ref) == 3
    for a, e in zip(out, ref):
        assert_close(a, e)
    reasons = [json.loads(line) for line in report.read_text().splitlines()]
    split = [r for r in reasons if r["node"] == "the_split"]
    assert split and "graph output" in split[0]["reason"], reasons


def test_optional_sequence_graph_input_and_empty_sequence():
    """optional(seq) fed with a list, and a plain sequence fed empty (length 0)."""
    then_g = helper.make_graph([helper.make_node("OptionalGetElement", ["o"], ["s"]),
                                helper.make_node("SequenceLength", ["s"], ["tn"])],
                               "then", [], [vi("tn", TP.INT64, [])])
    else_g = helper.make_graph([const("minus", np.int64(-1)),
                                helper.make_node("Identity", ["minus"], ["en"])],
                               "else", [], [vi("en", TP.INT64, [])])
    nodes = [helper.make_node("OptionalHasElement", ["o"], ["has"]),
             helper.make_node("If", ["has"], ["n"], then_branch=then_g, else_branch=else_g),
             helper.make_node("SequenceLength", ["e"], ["m"])]
    opt_seq = helper.make_value_info(
        "o", helper.make_optional_type_proto(
            helper.make_sequence_type_proto(helper.make_tensor_type_proto(TP.FLOAT, None))))
    m = make_model(nodes, [opt_seq, seq_vi("e", TP.FLOAT)],
                   [vi("n", TP.INT64, []), vi("m", TP.INT64, [])])
    a = np.ones((2,), np.float32)
    check_runs(m, [{"o": [a, a, a], "e": []}, {"o": None, "e": [a]}, {"o": [a], "e": []}])
