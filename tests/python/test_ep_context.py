"""EPContext models (ORT's compiled-model cache): a session with ep.context_enable=1 writes a
context model whose EPContext nodes carry the MLX EP's saved fused groups; a later session runs
that model on MLX without the original graph, refuses one compiled for another EP version, MLX
version or device, and ORT's compatibility API reads the EP's judgement."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as TP
from onnx import helper, numpy_helper
from onnxruntime.capi import _pybind_state as C

import onnxruntime_mlx as om
from oracle import DEVICE, assert_close, run_cpu

rng = np.random.default_rng(11)
MAGIC = b"ORTMLXG\0"


def vi(name, dtype, shape):
    return helper.make_tensor_value_info(name, dtype, shape)


def mlp_model() -> onnx.ModelProto:
    """y = Relu(x @ W + B), W and B initializers."""
    w = numpy_helper.from_array(rng.standard_normal((4, 8)).astype(np.float32), "W")
    b = numpy_helper.from_array(rng.standard_normal((8,)).astype(np.float32), "B")
    g = helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["m"], name="mm"),
                           helper.make_node("Add", ["m", "B"], ["a"], name="add"),
                           helper.make_node("Relu", ["a"], ["y"], name="relu")], "mlp",
                          [vi("x", TP.FLOAT, [2, 4])], [vi("y", TP.FLOAT, [2, 8])], [w, b])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def if_model() -> onnx.ModelProto:
    """y = If(c) then x * w else |x - w| + 1; w an initializer of the main graph read only
    inside the branches, `one` a Constant inside a branch."""
    w = numpy_helper.from_array(rng.standard_normal((4,)).astype(np.float32), "w")
    then_g = helper.make_graph([helper.make_node("Mul", ["x", "w"], ["a"])], "then", [],
                               [vi("a", TP.FLOAT, [2, 4])])
    one = helper.make_node("Constant", [], ["one"],
                           value=numpy_helper.from_array(np.float32(1)))
    else_g = helper.make_graph([helper.make_node("Sub", ["x", "w"], ["d"]),
                                helper.make_node("Abs", ["d"], ["e"]), one,
                                helper.make_node("Add", ["e", "one"], ["b"])], "else", [],
                               [vi("b", TP.FLOAT, [2, 4])])
    g = helper.make_graph([helper.make_node("If", ["c"], ["y"], name="the_if",
                                            then_branch=then_g, else_branch=else_g)], "if",
                          [vi("c", TP.BOOL, []), vi("x", TP.FLOAT, [2, 4])],
                          [vi("y", TP.FLOAT, [2, 4])], [w])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])
    m.ir_version = 10
    return m


MODELS = {
    "mlp": (mlp_model, lambda: [{"x": rng.standard_normal((2, 4)).astype(np.float32)}]),
    "if": (if_model, lambda: [{"c": np.array(c), "x": rng.standard_normal((2, 4)).astype(np.float32)}
                              for c in (True, False)]),
}


def options(context: dict | None = None, **provider_options) -> ort.SessionOptions:
    so = om.record_assignment(om.session_options(DEVICE, fallback=False, **provider_options))
    for k, v in (context or {}).items():
        so.add_session_config_entry(k, str(v))
    return so


def session(path, context: dict | None = None) -> ort.InferenceSession:
    s = ort.InferenceSession(str(path), sess_options=options(context), enable_fallback=0)
    placed = om.placement(s)
    assert set(placed) == {om.EP_NAME}, placed
    return s


def compile_model(tmp_path, name, embed, ctx_name="ctx.onnx"):
    """Saves the model, runs a session that writes its context model; returns
    (model, context model path, that session)."""
    model = MODELS[name][0]()
    src = tmp_path / f"{name}.onnx"
    onnx.save(model, src)
    ctx = tmp_path / ctx_name
    s = session(src, {"ep.context_enable": 1, "ep.context_embed_mode": embed,
                      "ep.context_file_path": ctx})
    return model, ctx, s


def context_nodes(ctx_model: onnx.ModelProto):
    return [n for n in ctx_model.graph.node if n.op_type == "EPContext"]


def attr(node, name):
    return onnx.helper.get_attribute_value(next(a for a in node.attribute if a.name == name))


def compat_string() -> str:
    devs = om.ep_devices(DEVICE)
    assert devs
    import mlx.core as mx
    return f"{om.EP_NAME};version=0.1.0;mlx={mx.__version__};device={DEVICE}"


# ---- producing ----------------------------------------------------------------------------

@pytest.mark.parametrize("embed", [0, 1])
@pytest.mark.parametrize("name", ["mlp", "if"])
def test_context_model_is_written_with_an_mlx_epcontext_node(tmp_path, name, embed):
    model, ctx, _ = compile_model(tmp_path, name, embed)
    assert ctx.exists()
    cm = onnx.load(ctx)
    nodes = context_nodes(cm)
    assert len(nodes) == 1, cm.graph.node
    n = nodes[0]
    assert n.domain == "com.microsoft"
    assert attr(n, "source") == om.EP_NAME.encode()
    assert attr(n, "main_context") == 1
    assert attr(n, "embed_mode") == embed
    assert attr(n, "ep_sdk_version") == b"0.1.0"
    assert attr(n, "partition_name") == n.name.encode()
    # Constants travel in the payload: the EPContext node takes only the graph's real inputs.
    assert list(n.input) == [i.name for i in model.graph.input]
    assert list(n.output) == [o.name for o in model.graph.output]
    assert not cm.graph.initializer
    cache = attr(n, "ep_cache_context")
    if embed == 1:
        assert cache.startswith(MAGIC)
        assert compat_string().encode() in cache
        assert not list(tmp_path.glob("*.mlxctx"))
    else:
        side = tmp_path / cache.decode()
        assert side.parent == tmp_path and side.exists(), cache
        assert MAGIC in side.read_bytes()[:64]
    # ORT stores the EP's compatibility string in the model's metadata.
    meta = {p.key: p.value for p in cm.metadata_props}
    assert meta.get(f"ep_compatibility_info.{om.EP_NAME}") == compat_string()


def test_default_context_path_is_model_ctx_onnx(tmp_path):
    """With ep.context_file_path unset ORT writes <model>_ctx.onnx beside the model; the side
    file (ORT's default embed mode, 0) goes beside it."""
    src = tmp_path / "mlp.onnx"
    onnx.save(mlp_model(), src)
    session(src, {"ep.context_enable": 1})
    ctx = tmp_path / "mlp_ctx.onnx"
    assert ctx.exists(), list(tmp_path.iterdir())
    n = context_nodes(onnx.load(ctx))[0]
    assert attr(n, "embed_mode") == 0
    assert (tmp_path / attr(n, "ep_cache_context").decode()).exists()
    feeds = MODELS["mlp"][1]()[0]
    np.testing.assert_array_equal(session(ctx).run(None, feeds)[0],
                                  session(src).run(None, feeds)[0])


def test_no_context_written_without_the_session_key(tmp_path):
    src = tmp_path / "mlp.onnx"
    onnx.save(mlp_model(), src)
    session(src)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mlp.onnx"]


def test_weightless_request_is_refused(tmp_path):
    """The payload always carries the weights: a weightless request fails, by name, rather than
    giving a model with weights."""
    src = tmp_path / "mlp.onnx"
    onnx.save(mlp_model(), src)
    with pytest.raises(Exception, match="enable_weightless_ep_context_nodes"):
        session(src, {"ep.context_enable": 1, "ep.context_file_path": tmp_path / "w_ctx.onnx",
                      "ep.enable_weightless_ep_context_nodes": 1})


# ---- consuming ----------------------------------------------------------------------------

@pytest.mark.parametrize("embed", [0, 1])
@pytest.mark.parametrize("name", ["mlp", "if"])
def test_context_model_runs_on_mlx_like_the_original(tmp_path, name, embed):
    model, ctx, original = compile_model(tmp_path, name, embed)
    # The context model is read without the source model: remove it.
    (tmp_path / f"{name}.onnx").unlink()
    s = ort.InferenceSession(str(ctx), sess_options=options(), enable_fallback=0)
    placed = om.placement(s)
    assert list(placed) == [om.EP_NAME], placed
    assert [op for _, op in placed[om.EP_NAME]] == ["EPContext"], placed
    for feeds in MODELS[name][1]():
        for _ in range(2):  # eager then compiled replays
            got = s.run(None, feeds)
            want = original.run(None, feeds)
            for g, w in zip(got, want):
                np.testing.assert_array_equal(g, w)
            for g, r in zip(got, run_cpu(model, feeds)):
                assert_close(g, r)


def test_context_model_with_nodes_on_the_cpu_ep(tmp_path):
    """Two MLX groups split by a node MLX declines (MaxRoiPool): two EPContext nodes, the
    MaxRoiPool stays an ordinary node for the CPU EP, and the context model runs the same."""
    rois = numpy_helper.from_array(np.array([[0, 0, 0, 3, 3], [0, 1, 1, 2, 3]], np.float32), "rois")
    b = numpy_helper.from_array(rng.standard_normal((1, 2, 1, 1)).astype(np.float32), "B")
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("MaxRoiPool", ["r", "rois"], ["p"], name="pool",
                              pooled_shape=[2, 2]),
             helper.make_node("Add", ["p", "B"], ["y"], name="add")]
    g = helper.make_graph(nodes, "mixed", [vi("x", TP.FLOAT, [1, 2, 4, 4])],
                          [vi("y", TP.FLOAT, [2, 2, 2, 2])], [rois, b])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    src, ctx = tmp_path / "mixed.onnx", tmp_path / "mixed_ctx.onnx"
    onnx.save(model, src)

    def make(path, context=None):
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        so = om.record_assignment(om.session_options(DEVICE, so=so))
        for k, v in (context or {}).items():
            so.add_session_config_entry(k, str(v))
        return ort.InferenceSession(str(path), sess_options=so, enable_fallback=0)

    original = make(src, {"ep.context_enable": 1, "ep.context_file_path": ctx})
    cm = onnx.load(ctx)
    assert sorted(n.op_type for n in cm.graph.node) == ["EPContext", "EPContext", "MaxRoiPool"]
    s = make(ctx)
    placed = om.placement(s)
    assert sorted(op for _, op in placed[om.EP_NAME]) == ["EPContext", "EPContext"], placed
    assert [op for _, op in placed["CPUExecutionProvider"]] == ["MaxRoiPool"], placed
    feeds = {"x": rng.standard_normal((1, 2, 4, 4)).astype(np.float32)}
    np.testing.assert_array_equal(s.run(None, feeds)[0], original.run(None, feeds)[0])
    assert_close(s.run(None, feeds)[0], run_cpu(model, feeds)[0])


def test_side_file_is_found_relative_to_the_context_model(tmp_path):
    """embed_mode=0 names the side file relative to the context model's folder: the pair can be
    moved together."""
    _, ctx, original = compile_model(tmp_path, "mlp", 0)
    moved = tmp_path / "elsewhere"
    moved.mkdir()
    side = attr(context_nodes(onnx.load(ctx))[0], "ep_cache_context").decode()
    (tmp_path / side).rename(moved / side)
    ctx.rename(moved / ctx.name)
    feeds = MODELS["mlp"][1]()[0]
    np.testing.assert_array_equal(session(moved / ctx.name).run(None, feeds)[0],
                                  original.run(None, feeds)[0])
    # ...and a missing side file fails session creation, naming it.
    (moved / side).unlink()
    with pytest.raises(Exception, match=side):
        session(moved / ctx.name)


def test_foreign_epcontext_node_is_left_alone(tmp_path):
    """An EPContext node of another EP is not claimed: with nobody to run it, ORT fails to
    place it (and not the MLX EP trying to read its payload)."""
    n = helper.make_node("EPContext", ["x"], ["y"], name="other", domain="com.microsoft",
                         main_context=1, embed_mode=1, ep_cache_context=MAGIC + b"junk",
                         source="SomeOtherExecutionProvider")
    g = helper.make_graph([n], "foreign", [vi("x", TP.FLOAT, [2])], [vi("y", TP.FLOAT, [2])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17),
                                            helper.make_opsetid("com.microsoft", 1)])
    m.ir_version = 8
    p = tmp_path / "foreign.onnx"
    onnx.save(m, p)
    so = om.session_options(DEVICE)
    with pytest.raises(Exception) as err:
        ort.InferenceSession(str(p), sess_options=so, enable_fallback=0)
    assert "MLX EP" not in str(err.value), err.value


# ---- compatibility ------------------------------------------------------------------------

def _retag(data: bytes, key: str, new: str) -> bytes:
    """Replaces `key=<value>` in a compatibility string inside `data`, keeping the length (the
    string is length-prefixed in the payload)."""
    old = compat_string()
    fields = dict(f.split("=", 1) for f in old.split(";")[1:])
    value = fields[key]
    assert len(new) == len(value), (new, value)
    tampered = old.replace(f"{key}={value}", f"{key}={new}")
    assert old.encode() in data
    return data.replace(old.encode(), tampered.encode())


def _other(value: str) -> str:
    """A different value of the same length."""
    return ("9" if value[0] != "9" else "8") + value[1:]


@pytest.mark.parametrize("embed", [0, 1])
@pytest.mark.parametrize("key", ["version", "mlx", "device"])
def test_tampered_compatibility_fails_session_creation(tmp_path, embed, key):
    _, ctx, _ = compile_model(tmp_path, "mlp", embed)
    fields = dict(f.split("=", 1) for f in compat_string().split(";")[1:])
    new = {"cpu": "gpu", "gpu": "cpu"}.get(fields[key]) if key == "device" else _other(fields[key])
    cm = onnx.load(ctx)
    n = context_nodes(cm)[0]
    a = next(a for a in n.attribute if a.name == "ep_cache_context")
    if embed == 1:
        a.s = _retag(a.s, key, new)
        onnx.save(cm, ctx)
    else:
        side = tmp_path / a.s.decode()
        side.write_bytes(_retag(side.read_bytes(), key, new))
    with pytest.raises(Exception) as err:
        ort.InferenceSession(str(ctx), sess_options=options(), enable_fallback=0)
    msg = str(err.value)
    assert "[MLX EP]" in msg and "compiled for" in msg, msg
    assert f"{key} {new} (model) vs {fields[key]} (here)" in msg, msg


@pytest.mark.parametrize("embed", [0, 1])
def test_truncated_payload_fails_session_creation_cleanly(tmp_path, embed):
    _, ctx, _ = compile_model(tmp_path, "mlp", embed)
    cm = onnx.load(ctx)
    a = next(a for a in context_nodes(cm)[0].attribute if a.name == "ep_cache_context")
    if embed == 1:
        a.s = a.s[: len(a.s) // 2]
        onnx.save(cm, ctx)
    else:
        side = tmp_path / a.s.decode()
        side.write_bytes(side.read_bytes()[:200])
    with pytest.raises(Exception) as err:
        ort.InferenceSession(str(ctx), sess_options=options(), enable_fallback=0)
    assert "[MLX EP]" in str(err.value) and "truncated" in str(err.value), err.value


def test_tampered_metadata_is_judged_by_the_factory(tmp_path):
    """ORT keeps the EP's string in the model's metadata; the factory judges what is found there
    (ORT's C API consults it before compiling; the payload's own copy is what Compile checks)."""
    _, ctx, _ = compile_model(tmp_path, "mlp", 1)
    cm = onnx.load(ctx)
    key = f"ep_compatibility_info.{om.EP_NAME}"
    for p in cm.metadata_props:
        if p.key == key:
            p.value = p.value.replace("version=0.1.0", "version=9.1.0")
    onnx.save(cm, ctx)
    info = C.get_compatibility_info_from_model(str(ctx), om.EP_NAME)
    assert "version=9.1.0" in info
    assert C.get_model_compatibility_for_ep_devices(om.ep_devices(DEVICE), info) == \
        C.OrtCompiledModelCompatibility.EP_UNSUPPORTED


def test_compatibility_api(tmp_path):
    _, ctx, _ = compile_model(tmp_path, "mlp", 1)
    info = C.get_compatibility_info_from_model(str(ctx), om.EP_NAME)
    assert info == compat_string()
    devs = om.ep_devices(DEVICE)
    judge = lambda s: C.get_model_compatibility_for_ep_devices(devs, s)  # noqa: E731
    Compat = C.OrtCompiledModelCompatibility
    assert judge(info) == Compat.EP_SUPPORTED_OPTIMAL
    assert judge(info.replace("version=0.1.0", "version=0.0.9")) == Compat.EP_UNSUPPORTED
    fields = dict(f.split("=", 1) for f in info.split(";")[1:])
    assert judge(info.replace(f"mlx={fields['mlx']}", "mlx=0.0.1")) == Compat.EP_UNSUPPORTED
    assert judge(info.replace(f"device={DEVICE}", "device=tpu")) == Compat.EP_UNSUPPORTED
    assert judge("SomeOtherExecutionProvider;version=0.1.0") == Compat.EP_NOT_APPLICABLE
    if not any(d.device.type == ort.OrtHardwareDeviceType.GPU for d in ort.get_ep_devices()
               if d.ep_name == om.EP_NAME):
        # A GPU-compiled model on a machine whose MLX has no GPU backend cannot run.
        assert judge(info.replace(f"device={DEVICE}", "device=gpu")) == Compat.EP_UNSUPPORTED


def test_model_compiler_api_makes_a_context_model(tmp_path):
    """ORT's compile API (ModelCompiler) drives the same path through the session keys."""
    src = tmp_path / "mlp.onnx"
    model = mlp_model()
    onnx.save(model, src)
    out = tmp_path / "compiled.onnx"
    so = om.session_options(DEVICE)
    ort.ModelCompiler(so, str(src), embed_compiled_data_into_model=True).compile_to_file(str(out))
    n = context_nodes(onnx.load(out))[0]
    assert attr(n, "source") == om.EP_NAME.encode() and attr(n, "embed_mode") == 1
    feeds = MODELS["mlp"][1]()[0]
    assert_close(session(out).run(None, feeds)[0], run_cpu(model, feeds)[0])
