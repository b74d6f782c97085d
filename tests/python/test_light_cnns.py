"""The ImageNet CNNs of libonnx-testdata's light/ folder (squeezenet, resnet50, inception v1 and v2,
densenet121, shufflenet, zfnet512, alexnet, vgg19: the docs' CPU table runs them), every node on
MLX: the outputs of a random image equal ORT's CPU EP's (no NaN where ORT has none) and no
oneDNN convolution failed. Their weights are constants (ConstantOfShape), so the outputs are
near-uniform class scores; what this catches is a kernel path that answers NaN or garbage (a
pooling of a blocked output to one position once did, through inception v1's head)."""
import json
import pathlib

import numpy as np
import onnxruntime as ort
import pytest

import onnxruntime_mlx as om
from onnxruntime_mlx import conformance
from oracle import DEVICE

LIGHT = conformance.DEFAULT_DATA_DIR.parent / "light"
MODELS = ["squeezenet", "resnet50", "inception_v1", "inception_v2", "densenet121", "shufflenet", "zfnet512",
          "bvlc_alexnet", "vgg19"]


@pytest.mark.parametrize("name", MODELS)
def test_light_cnn_matches_ort(name, tmp_path):
    path = LIGHT / f"light_{name}.onnx"
    if not path.exists():
        if DEVICE == "gpu":
            pytest.skip("libonnx-testdata is not on this machine")
        pytest.fail(f"{path} missing (scripts/setup installs libonnx-testdata)")
    report = tmp_path / "r.jsonl"
    mlx = ort.InferenceSession(str(path), sess_options=om.session_options(DEVICE, fallback=False,
                                                                         report_path=str(report)))
    cpu = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    name_in, shape = mlx.get_inputs()[0].name, mlx.get_inputs()[0].shape
    x = np.random.default_rng(5).standard_normal([d if isinstance(d, int) else 1 for d in shape]).astype(np.float32)
    for _ in range(3):  # the probe, the compiled trace, a warm run
        got = mlx.run(None, {name_in: x})
    want = cpu.run(None, {name_in: x})
    del mlx  # the report's line is written as the session ends
    for g, w in zip(got, want):
        assert not np.isnan(g).any() or np.isnan(w).any(), "NaN where ORT's CPU EP has none"
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)
    line = next(json.loads(ln) for ln in pathlib.Path(report).read_text().splitlines() if '"fused_node"' in ln)
    assert line.get("process_dnnl_failures", 0) == 0, line["process_dnnl_failures"]
