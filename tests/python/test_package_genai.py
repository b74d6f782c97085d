"""onnxruntime-genai's own generation loop on the MLX EP: greedy search through og.Generator over
the checked-in test LLMs, tokens equal to genai on ORT's CPU EP, with the growing KV cache and
with past_present_share_buffer. That the EP ran the model is read from its own report
(report_path, passed through genai's provider options): no node declined, and every fused node
ran once per generated token."""
from __future__ import annotations

import gc
import json
import pathlib
import shutil

import numpy as np
import pytest

import onnxruntime_mlx as om

og = pytest.importorskip("onnxruntime_genai")
from onnxruntime_mlx import genai  # noqa: E402
from onnxruntime_mlx.generate import Decoder, uses_group_query_attention  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]
LLMS = sorted(p for p in (ROOT / "tests/models/llm").iterdir() if (p / "genai_config.json").is_file())
PROMPT = [1, 17, 42, 99, 3, 250, 7, 64]
NEW = 12


def _generate(cfg, share: bool | None, new: int = NEW) -> list[int]:
    model = og.Model(cfg)
    params = og.GeneratorParams(model)
    search = {"max_length": len(PROMPT) + new, "do_sample": False}
    if share is not None:
        search["past_present_share_buffer"] = share
    params.set_search_options(**search)
    gen = og.Generator(model, params)
    gen.append_tokens(np.array(PROMPT, np.int32))
    while not gen.is_done():
        gen.generate_next_token()
    tokens = [int(t) for t in gen.get_sequence(0)]
    del gen, params, model
    gc.collect()  # the session goes, and the EP writes its run statistics to the report
    return tokens[len(PROMPT):]


def _runs(tokens: list[int]) -> int:
    """Model runs for `tokens`: one per token; where EOS stopped it early, one more (the run
    that produced EOS, which genai leaves out of the sequence)."""
    return NEW if len(tokens) == NEW else len(tokens) + 1


def _cpu_config(d):
    cfg = og.Config(str(d))
    cfg.clear_providers()
    return cfg


def _check_report(path: pathlib.Path, runs: int):
    lines = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    declined = [r for r in lines if "reason" in r]
    fused = [r for r in lines if "fused_node" in r]
    assert not declined, declined[:5]
    assert fused, lines
    assert all(r["runs"] == runs for r in fused), [(r["fused_node"], r["runs"]) for r in fused]


def _modes(d):
    # genai shares the KV buffer for GroupQueryAttention models; with other attention ops the
    # cache length comes from the buffer's shape, so neither EP can decode that way.
    return [False, True] if uses_group_query_attention(d / "model.onnx") else [False]


CASES = [(d, share) for d in LLMS for share in _modes(d)]


@pytest.mark.parametrize("model_dir, share", CASES,
                         ids=[f"{d.name}-{'shared' if s else 'grow'}" for d, s in CASES])
def test_genai_generator_on_the_ep_is_token_exact(model_dir, share, tmp_path):
    report = tmp_path / "report.jsonl"
    got = _generate(genai.config(model_dir, "cpu", report_path=report), share)
    _check_report(report, _runs(got))
    if model_dir.name == "llama-fp16":
        # ORT's CPU EP cannot decode this fp16 model (its buffer reuse fails at the first step):
        # the reference is the package's own decode loop on the EP, compared to the CPU EP's
        # logits in test_llm.py.
        ref, _, _ = Decoder(model_dir, "mlx", "cpu").generate(PROMPT, NEW)
    else:
        ref = _generate(_cpu_config(model_dir), share)
    assert got == ref


def test_genai_config_json_names_the_ep(tmp_path):
    # The provider entry written in genai_config.json, options passed through to the EP.
    src = ROOT / "tests/models/llm/qwen2-int4"
    d = tmp_path / "model"
    d.mkdir()
    for f in src.iterdir():
        if f.is_file() and f.name != "genai_config.json":
            (d / f.name).symlink_to(f)
    cfg = json.loads((src / "genai_config.json").read_text())
    report = tmp_path / "report.jsonl"
    cfg["model"]["decoder"]["session_options"]["provider_options"] = [
        {om.EP_NAME: {"device": "cpu", "report_path": str(report)}}]
    (d / "genai_config.json").write_text(json.dumps(cfg))
    genai.register()
    got = _generate(og.Config(str(d)), True)
    _check_report(report, _runs(got))
    assert got == _generate(_cpu_config(src), True)


def test_genai_bad_option_is_an_error_not_a_cpu_run():
    with pytest.raises(om.OptionError, match="'compil'"):
        genai.config(LLMS[0], "cpu", compil=0)
    # Past the package (genai's own set_provider_option), the EP's refusal is raised by genai:
    # it does not retry on the CPU EP.
    cfg = genai.config(LLMS[0], "cpu")
    cfg.set_provider_option(om.EP_NAME, "cache_size", "-3")
    with pytest.raises(Exception, match="cache_size"):
        og.Model(cfg)


def test_genai_example_in_the_module_docstring_runs(tmp_path):
    # The docstring's example, as written, on a copy of a test model folder.
    d = tmp_path / "model_dir"
    shutil.copytree(ROOT / "tests/models/llm/llama-fp32", d)
    code = genai.__doc__.split("\n\n")[1]
    lines = [ln[4:] for ln in code.splitlines()]
    src = "\n".join(lines).replace('"path/to/model_dir"', repr(str(d)))
    scope = {"prompt_ids": np.array(PROMPT, np.int32)}
    exec(compile(src, "genai-example", "exec"), scope)  # noqa: S102 - the documented example
    tokens = [int(t) for t in scope["tokens"]]
    assert len(tokens) == 64 and tokens[:len(PROMPT)] == PROMPT
    assert tokens[len(PROMPT):] == _generate(_cpu_config(d), None, 64 - len(PROMPT))
