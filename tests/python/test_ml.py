"""ai.onnx.ml operators on the MLX EP against ORT's CPU EP: linear models, feature transforms and
tree ensembles (TreeEnsembleRegressor/Classifier v1/v3, TreeEnsemble v5) on random trees with
every comparison mode, missing-value tracks, aggregates, base values and post-transforms."""
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxruntime_mlx as om
from oracle import check_model, placement_of, run_cpu

rng = np.random.default_rng(0)
F32, I64 = TensorProto.FLOAT, TensorProto.INT64


def ml_model(op, inputs, attrs, outputs, ml_opset=3):
    """One ai.onnx.ml node; inputs: name -> array (graph inputs); outputs: [(name, elem)]."""
    g_in = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), list(a.shape))
            for n, a in inputs.items()]
    node = helper.make_node(op, list(inputs), [o for o, _ in outputs], domain="ai.onnx.ml", **attrs)
    g_out = [helper.make_tensor_value_info(o, t, None) for o, t in outputs]
    g = helper.make_graph([node], f"{op}_test", g_in, g_out)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17),
                                            helper.make_opsetid("ai.onnx.ml", ml_opset)])
    m.ir_version = 10
    return m


def check(op, inputs, attrs, outputs, ml_opset=3):
    m = ml_model(op, inputs, attrs, outputs, ml_opset)
    return check_model(m, inputs)


def declined(op, inputs, attrs, outputs, ml_opset=3):
    m = ml_model(op, inputs, attrs, outputs, ml_opset)
    return om.EP_NAME not in placement_of(m, inputs)


def data(shape, dtype=np.float32, lo=-3, hi=3):
    if np.issubdtype(dtype, np.integer):
        return rng.integers(lo, hi + 1, size=shape).astype(dtype)
    return rng.uniform(lo, hi, size=shape).astype(dtype)


TRANSFORMS = ["NONE", "SOFTMAX", "LOGISTIC", "SOFTMAX_ZERO", "PROBIT"]
IN_TYPES = [np.float32, np.float64, np.int64, np.int32]


# --------------------------------------------------------------------------------------------
# LinearClassifier / LinearRegressor

@pytest.mark.parametrize("pt", TRANSFORMS)
@pytest.mark.parametrize("dtype", IN_TYPES)
def test_linear_classifier_multiclass(pt, dtype):
    x = data((6, 4), dtype)
    coef = rng.uniform(-1, 1, 12).astype(np.float32)
    attrs = {"coefficients": coef, "intercepts": [0.1, -0.2, 0.3], "classlabels_ints": [7, 8, 9],
             "post_transform": pt}
    if pt == "PROBIT":
        # Scores in (0, 1) and away from 0.5, where ORT's float32 erfinv formula cancels.
        attrs["coefficients"] = np.abs(coef) * 0.01
        x = np.abs(x).astype(dtype)
        attrs["intercepts"] = [0.1, 0.25, 0.7]
    check("LinearClassifier", {"X": x}, attrs, [("Y", I64), ("Z", F32)])


@pytest.mark.parametrize("pt", ["NONE", "LOGISTIC", "SOFTMAX"])
@pytest.mark.parametrize("labels", [[3, 5], None])
def test_linear_classifier_binary(pt, labels):
    x = data((7, 3))
    attrs = {"coefficients": [0.5, -0.4, 0.3], "intercepts": [0.05], "post_transform": pt}
    if labels:
        attrs["classlabels_ints"] = labels
    check("LinearClassifier", {"X": x}, attrs, [("Y", I64), ("Z", F32)])


def test_linear_classifier_binary_probit_and_1d():
    x = np.abs(data((3,))) * 0.05
    check("LinearClassifier", {"X": x.astype(np.float32)},
          {"coefficients": [0.5, 0.4, 0.3], "intercepts": [0.05], "post_transform": "PROBIT"},
          [("Y", I64), ("Z", F32)])
    assert declined("LinearClassifier", {"X": data((3, 3))},
                    {"coefficients": [0.5, 0.4, 0.3], "intercepts": [0.2], "classlabels_ints": [0, 1],
                     "post_transform": "PROBIT"}, [("Y", I64), ("Z", F32)])


def test_linear_classifier_declines_strings():
    assert declined("LinearClassifier", {"X": data((3, 2))},
                    {"coefficients": [1.0, 2.0, 3.0, 4.0], "intercepts": [0.0, 1.0],
                     "classlabels_strings": ["a", "b"]}, [("Y", TensorProto.STRING), ("Z", F32)])


@pytest.mark.parametrize("targets,pt", [(1, "NONE"), (1, "PROBIT"), (1, "SOFTMAX"), (3, "NONE"),
                                        (3, "SOFTMAX"), (3, "LOGISTIC"), (3, "SOFTMAX_ZERO")])
@pytest.mark.parametrize("intercepts", [True, False])
def test_linear_regressor(targets, pt, intercepts):
    x = data((5, 4)) if pt != "PROBIT" else np.abs(data((5, 4))) * 0.02
    attrs = {"coefficients": rng.uniform(0, 1, 4 * targets).astype(np.float32), "targets": targets,
             "post_transform": pt}
    if intercepts:
        attrs["intercepts"] = rng.uniform(0, 0.05, targets).astype(np.float32)
    check("LinearRegressor", {"X": x}, attrs, [("Y", F32)])


def test_linear_regressor_1d():
    check("LinearRegressor", {"X": data((4,))},
          {"coefficients": [1.0, 2.0, -1.0, 0.5], "intercepts": [0.25]}, [("Y", F32)])


# --------------------------------------------------------------------------------------------
# Normalizer, Scaler, Binarizer

@pytest.mark.parametrize("norm", ["MAX", "L1", "L2"])
@pytest.mark.parametrize("dtype", IN_TYPES)
@pytest.mark.parametrize("shape", [(4, 5), (6,)])
def test_normalizer(norm, dtype, shape):
    x = data(shape, dtype)
    if len(shape) == 2:
        x[1] = 0  # a zero row stays unchanged
    check("Normalizer", {"X": x}, {"norm": norm}, [("Y", F32)])


@pytest.mark.parametrize("dtype", IN_TYPES)
@pytest.mark.parametrize("per_feature", [True, False])
def test_scaler(dtype, per_feature):
    x = data((4, 3), dtype)
    attrs = ({"offset": [0.5, -1.0, 2.0], "scale": [2.0, 0.5, -1.5]} if per_feature
             else {"offset": [0.25], "scale": [3.0]})
    check("Scaler", {"X": x}, attrs, [("Y", F32)])


def test_scaler_1d():
    check("Scaler", {"X": data((3,))}, {"offset": [1.0, 2.0, 3.0], "scale": [0.5, 0.5, 2.0]},
          [("Y", F32)])


@pytest.mark.parametrize("threshold", [None, 0.5, -1.0])
def test_binarizer(threshold):
    x = data((4, 5))
    x[0, 0] = 0.5
    attrs = {} if threshold is None else {"threshold": threshold}
    check("Binarizer", {"X": x}, attrs, [("Y", F32)])


# --------------------------------------------------------------------------------------------
# ArrayFeatureExtractor, Imputer, OneHotEncoder, FeatureVectorizer

@pytest.mark.parametrize("shape", [(5,), (3, 5), (2, 3, 5)])
@pytest.mark.parametrize("dtype", IN_TYPES)
def test_array_feature_extractor(shape, dtype):
    x = data(shape, dtype)
    y = np.array([[4, 0], [2, 2]], np.int64)
    check("ArrayFeatureExtractor", {"X": x, "Y": y}, {}, [("Z", helper.np_dtype_to_tensor_dtype(x.dtype))])


@pytest.mark.parametrize("replaced", [np.nan, 0.0])
@pytest.mark.parametrize("per_feature", [True, False])
def test_imputer_float(replaced, per_feature):
    x = data((5, 3)).round()
    x[0, 1] = x[3, 2] = np.nan
    x[1, 0] = x[2, 2] = 0.0
    vals = [1.5, -2.0, 7.0] if per_feature else [9.0]
    check("Imputer", {"X": x}, {"imputed_value_floats": vals, "replaced_value_float": replaced},
          [("Y", F32)])


def test_imputer_int64_and_1d():
    x = data((4, 3), np.int64)
    x[0] = -1
    check("Imputer", {"X": x}, {"imputed_value_int64s": [5, 6, 7], "replaced_value_int64": -1},
          [("Y", I64)])
    check("Imputer", {"X": np.array([1.0, np.nan, 3.0], np.float32)},
          {"imputed_value_floats": [0.0], "replaced_value_float": np.nan}, [("Y", F32)])


@pytest.mark.parametrize("dtype", [np.int64, np.float32, np.float64])
@pytest.mark.parametrize("shape", [(6,), (3, 4)])
def test_one_hot_encoder(dtype, shape):
    x = data(shape, dtype, 0, 6)
    check("OneHotEncoder", {"X": x}, {"cats_int64s": [5, 1, 3, 0], "zeros": 1}, [("Y", F32)])


def test_one_hot_encoder_declines():
    x = data((3,), np.int64, 0, 1)
    assert declined("OneHotEncoder", {"X": x}, {"cats_int64s": [0, 1], "zeros": 0}, [("Y", F32)])


@pytest.mark.parametrize("dtype", IN_TYPES)
def test_feature_vectorizer(dtype):
    # ORT binds all inputs to one type. Widths 2, 4, 1 into 3 (padded), 2 (cut), 1.
    a, b, c = data((3, 2), dtype), data((3, 4), dtype), data((3, 1), dtype)
    check("FeatureVectorizer", {"a": a, "b": b, "c": c}, {"inputdimensions": [3, 2, 1]},
          [("Y", F32)])


# --------------------------------------------------------------------------------------------
# Tree ensembles: random trees on integer-valued features, so equality modes and ties matter.

MODES = ["BRANCH_LEQ", "BRANCH_LT", "BRANCH_GTE", "BRANCH_GT", "BRANCH_EQ", "BRANCH_NEQ"]


def random_tree(depth, n_features, n_targets, modes, leaf_prob=0.25, missing=False):
    """A nested dict tree: branch {mode, feature, value, missing, true, false} or leaf
    {weights: [(target, w), ...]}."""
    if depth == 0 or (depth < 3 and rng.random() < leaf_prob):
        k = rng.integers(1, min(n_targets, 2) + 1)
        targets = rng.choice(n_targets, size=k, replace=False)
        return {"weights": [(int(t), float(rng.uniform(-1, 1))) for t in targets]}
    return {"mode": modes[rng.integers(len(modes))], "feature": int(rng.integers(n_features)),
            "value": float(rng.integers(0, 5)), "missing": int(missing and rng.random() < 0.5),
            "true": random_tree(depth - 1, n_features, n_targets, modes, leaf_prob, missing),
            "false": random_tree(depth - 1, n_features, n_targets, modes, leaf_prob, missing)}


def legacy_attrs(trees, prefix):
    """TreeEnsembleRegressor/Classifier node and weight attributes of `trees`."""
    a = {k: [] for k in ("nodes_treeids", "nodes_nodeids", "nodes_featureids", "nodes_modes",
                         "nodes_values", "nodes_truenodeids", "nodes_falsenodeids",
                         "nodes_missing_value_tracks_true")}
    w = {f"{prefix}ids": [], f"{prefix}nodeids": [], f"{prefix}treeids": [], f"{prefix}weights": []}
    for tid, tree in enumerate(trees):
        nodes = []

        def visit(t):
            i = len(nodes)
            nodes.append(t)
            if "weights" not in t:
                t["_t"], t["_f"] = visit(t["true"]), visit(t["false"])
            return i
        visit(tree)
        for nid, t in enumerate(nodes):
            leaf = "weights" in t
            a["nodes_treeids"].append(tid)
            a["nodes_nodeids"].append(nid)
            a["nodes_featureids"].append(0 if leaf else t["feature"])
            a["nodes_modes"].append("LEAF" if leaf else t["mode"])
            a["nodes_values"].append(0.0 if leaf else t["value"])
            a["nodes_truenodeids"].append(0 if leaf else t["_t"])
            a["nodes_falsenodeids"].append(0 if leaf else t["_f"])
            a["nodes_missing_value_tracks_true"].append(0 if leaf else t["missing"])
            if leaf:
                for target, weight in t["weights"]:
                    w[f"{prefix}ids"].append(target)
                    w[f"{prefix}nodeids"].append(nid)
                    w[f"{prefix}treeids"].append(tid)
                    w[f"{prefix}weights"].append(weight)
    return {**a, **w}


def tree_x(n, n_features, nan=False, dtype=np.float32):
    x = rng.integers(0, 5, size=(n, n_features)).astype(dtype)
    if nan:
        x[rng.random(x.shape) < 0.2] = np.nan
    return x


@pytest.mark.parametrize("agg", ["SUM", "AVERAGE", "MIN", "MAX"])
@pytest.mark.parametrize("n_targets", [1, 3])
@pytest.mark.parametrize("ml_opset", [1, 3])
def test_tree_regressor(agg, n_targets, ml_opset):
    trees = [random_tree(4, 5, n_targets, MODES) for _ in range(6)]
    attrs = {**legacy_attrs(trees, "target_"), "n_targets": n_targets, "aggregate_function": agg}
    check("TreeEnsembleRegressor", {"X": tree_x(20, 5)}, attrs, [("Y", F32)], ml_opset)


@pytest.mark.parametrize("pt", TRANSFORMS)
@pytest.mark.parametrize("n_targets", [1, 3])
def test_tree_regressor_transforms_and_base(pt, n_targets):
    trees = [random_tree(3, 4, n_targets, ["BRANCH_LEQ"]) for _ in range(4)]
    attrs = legacy_attrs(trees, "target_")
    if pt == "PROBIT":  # scores in (0, 0.4): away from 0.5 (see above)
        attrs["target_weights"] = [abs(v) * 0.02 for v in attrs["target_weights"]]
    attrs.update(n_targets=n_targets, post_transform=pt,
                 base_values=[0.1 * (k + 1) for k in range(n_targets)])
    check("TreeEnsembleRegressor", {"X": tree_x(12, 4)}, attrs, [("Y", F32)])


@pytest.mark.parametrize("dtype", [np.float64, np.int64, np.int32])
def test_tree_regressor_input_types(dtype):
    trees = [random_tree(4, 3, 2, MODES) for _ in range(3)]
    attrs = {**legacy_attrs(trees, "target_"), "n_targets": 2}
    x = tree_x(10, 3, dtype=dtype)
    expected = None
    if dtype != np.float64:  # ORT has no integer kernel: the float32 model is the reference
        m32 = ml_model("TreeEnsembleRegressor", {"X": x.astype(np.float32)}, attrs, [("Y", F32)])
        expected = run_cpu(m32, {"X": x.astype(np.float32)})
    m = ml_model("TreeEnsembleRegressor", {"X": x}, attrs, [("Y", F32)])
    check_model(m, {"X": x}, expected=expected)


def test_tree_regressor_missing_values():
    trees = [random_tree(5, 4, 1, MODES, missing=True) for _ in range(5)]
    attrs = {**legacy_attrs(trees, "target_"), "n_targets": 1}
    check("TreeEnsembleRegressor", {"X": tree_x(30, 4, nan=True)}, attrs, [("Y", F32)])


def test_tree_regressor_as_tensor():
    trees = [random_tree(3, 3, 1, ["BRANCH_LT"]) for _ in range(3)]
    attrs = {**legacy_attrs(trees, "target_"), "n_targets": 1}
    attrs["nodes_values_as_tensor"] = numpy_helper.from_array(
        np.array(attrs.pop("nodes_values"), np.float32), "v")
    check("TreeEnsembleRegressor", {"X": tree_x(8, 3)}, attrs, [("Y", F32)])


@pytest.mark.parametrize("pt", ["NONE", "SOFTMAX", "LOGISTIC", "SOFTMAX_ZERO"])
@pytest.mark.parametrize("base", [False, True])
def test_tree_classifier_multiclass(pt, base):
    trees = [random_tree(4, 5, 4, MODES) for _ in range(5)]
    attrs = {**legacy_attrs(trees, "class_"), "classlabels_int64s": [10, 20, 30, 40],
             "post_transform": pt}
    if base:
        attrs["base_values"] = [0.1, -0.2, 0.3, 0.0]
    check("TreeEnsembleClassifier", {"X": tree_x(25, 5, nan=True)}, attrs,
          [("Y", I64), ("Z", F32)])


def binary_trees(classes, positive=True):
    trees = [random_tree(3, 4, 2, MODES) for _ in range(4)]
    attrs = legacy_attrs(trees, "class_")
    ids = attrs["class_ids"]
    for i in range(len(ids)):
        ids[i] = classes[i % len(classes)]
    if positive:
        attrs["class_weights"] = [abs(v) for v in attrs["class_weights"]]
    return attrs


def test_tree_leaf_feature_ids_are_ignored():
    # Leaves' nodes_featureids mean nothing; far out of range here (reading X there faults).
    trees = [random_tree(3, 4, 1, MODES) for _ in range(3)]
    attrs = legacy_attrs(trees, "target_")
    attrs["nodes_featureids"] = [f if m != "LEAF" else 2**30 + i
                                 for i, (f, m) in enumerate(zip(attrs["nodes_featureids"], attrs["nodes_modes"]))]
    check("TreeEnsembleRegressor", {"X": tree_x(16, 4)}, {**attrs, "n_targets": 1}, [("Y", F32)])


@pytest.mark.parametrize("classes", [[1], [0], [0, 1]])
@pytest.mark.parametrize("base", [None, [0.3], [-0.2, 0.4]])
@pytest.mark.parametrize("pt", ["NONE", "LOGISTIC", "SOFTMAX", "PROBIT"])
@pytest.mark.parametrize("positive", [True, False])
def test_tree_classifier_binary(classes, base, pt, positive):
    attrs = {**binary_trees(classes, positive), "classlabels_int64s": [4, 9], "post_transform": pt}
    if pt == "PROBIT":
        attrs["class_weights"] = [abs(v) * 0.02 for v in attrs["class_weights"]]
    if base:
        attrs["base_values"] = base
    x = tree_x(25, 4)
    m = ml_model("TreeEnsembleClassifier", {"X": x}, attrs, [("Y", I64), ("Z", F32)])
    placed = placement_of(m, {"X": x})
    if om.EP_NAME not in placed:
        # Only the cases where ORT leaves a score uninitialised are declined.
        one_score = base is None or len(base) == 1
        assert one_score and (pt == "PROBIT" or (len(classes) == 2 and len(base or []) == 1)
                              or classes == [0])
        return
    check_model(m, {"X": x})


# --------------------------------------------------------------------------------------------
# TreeEnsemble (ai.onnx.ml 5)

V5_MODES = {"BRANCH_LEQ": 0, "BRANCH_LT": 1, "BRANCH_GTE": 2, "BRANCH_GT": 3, "BRANCH_EQ": 4,
            "BRANCH_NEQ": 5}


def v5_attrs(trees, members=False, dtype=np.float32):
    n = {k: [] for k in ("featureids", "splits", "modes", "truenodeids", "falsenodeids",
                         "trueleafs", "falseleafs", "missing")}
    leaf_t, leaf_w, roots, sets = [], [], [], []

    def add_leaf(t):
        target, weight = t["weights"][0]
        leaf_t.append(target)
        leaf_w.append(weight)
        return len(leaf_t) - 1

    def visit(t):
        i = len(n["modes"])
        for k in n:
            n[k].append(0)
        mode = V5_MODES[t["mode"]]
        if members and rng.random() < 0.4:
            mode = 6
            sets.extend(sorted(set(rng.integers(0, 5, size=2).tolist())) + [np.nan])
        n["featureids"][i], n["splits"][i], n["modes"][i] = t["feature"], t["value"], mode
        n["missing"][i] = t["missing"]
        for side in ("true", "false"):
            child = t[side]
            if "weights" in child:
                n[side + "leafs"][i], n[side + "nodeids"][i] = 1, add_leaf(child)
            else:
                n[side + "leafs"][i], n[side + "nodeids"][i] = 0, visit(child)
        return i

    for tree in trees:
        if "weights" in tree:  # a one-leaf tree: both branches to the same leaf
            i = len(n["modes"])
            for k in n:
                n[k].append(0)
            leaf = add_leaf(tree)
            n["trueleafs"][i] = n["falseleafs"][i] = 1
            n["truenodeids"][i] = n["falsenodeids"][i] = leaf
            roots.append(i)
        else:
            roots.append(visit(tree))
    attrs = {"nodes_featureids": n["featureids"],
             "nodes_splits": numpy_helper.from_array(np.array(n["splits"], dtype), "s"),
             "nodes_modes": numpy_helper.from_array(np.array(n["modes"], np.uint8), "m"),
             "nodes_truenodeids": n["truenodeids"], "nodes_falsenodeids": n["falsenodeids"],
             "nodes_trueleafs": n["trueleafs"], "nodes_falseleafs": n["falseleafs"],
             "nodes_missing_value_tracks_true": n["missing"], "tree_roots": roots,
             "leaf_targetids": leaf_t,
             "leaf_weights": numpy_helper.from_array(np.array(leaf_w, dtype), "w")}
    if sets:
        attrs["membership_values"] = numpy_helper.from_array(np.array(sets, dtype), "mv")
    return attrs


@pytest.mark.parametrize("agg", [0, 1, 2, 3])
@pytest.mark.parametrize("n_targets", [1, 2])
def test_tree_ensemble_v5(agg, n_targets):
    trees = [random_tree(4, 5, n_targets, MODES, missing=True) for _ in range(5)]
    trees.append({"weights": [(0, 0.75)]})
    attrs = {**v5_attrs(trees), "n_targets": n_targets, "aggregate_function": agg}
    check("TreeEnsemble", {"X": tree_x(20, 5, nan=True)}, attrs, [("Y", F32)], ml_opset=5)


@pytest.mark.parametrize("pt", [0, 1, 2, 3, 4])
def test_tree_ensemble_v5_membership_and_transforms(pt):
    trees = [random_tree(4, 3, 3, MODES) for _ in range(4)]
    attrs = {**v5_attrs(trees, members=True), "n_targets": 3, "post_transform": pt}
    if pt == 4:  # PROBIT: scores in (0, 0.5)
        w = numpy_helper.to_array(attrs["leaf_weights"])
        attrs["leaf_weights"] = numpy_helper.from_array(np.abs(w) * 0.05, "w")
    x = tree_x(20, 3)
    if pt in (1, 2):  # ORT reads 1 as LOGISTIC, 2 as SOFTMAX (the spec: the reverse): declined
        assert declined("TreeEnsemble", {"X": x}, attrs, [("Y", F32)], ml_opset=5)
        return
    check("TreeEnsemble", {"X": x}, attrs, [("Y", F32)], ml_opset=5)


def test_tree_ensemble_v5_double():
    trees = [random_tree(4, 3, 1, MODES) for _ in range(3)]
    attrs = {**v5_attrs(trees, members=True, dtype=np.float64), "n_targets": 1}
    check("TreeEnsemble", {"X": tree_x(10, 3, dtype=np.float64)}, attrs,
          [("Y", TensorProto.DOUBLE)], ml_opset=5)
