"""Generates the small decoder-only LLMs the tests use, with onnxruntime-genai's own model
builder (the graph form users actually run: MatMulNBits, GroupQueryAttention,
SkipSimplifiedLayerNormalization, input_ids/attention_mask/past_key_values.N.* -> logits/present.N.*).

Runs in a separate venv (torch + transformers + onnxruntime-genai are ~5 GB and pull another
onnxruntime): scripts/gen_llm_models creates it. Weights are randomly initialised from a fixed
seed; nothing is downloaded. Output: tests/models/llm/<family>-<precision>/.

    .deps/llm-venv/bin/python tools/gen_llm_models.py [--out DIR] [--families llama,qwen2,gemma]
"""
import argparse
import json
import pathlib
import shutil
import subprocess
import sys
import tempfile

import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

VOCAB = 512
COMMON = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
              rms_norm_eps=1e-6, tie_word_embeddings=False)
HEAD_DIM = 16
# --size: "test" (the checked-in models: fast, exact comparisons) or the benchmark sizes (random
# weights: only speed is measured, so any size works; "bench" ~ 60M parameters, "large" ~ 0.5B).
SIZES = {
    "test": {},
    "bench": dict(vocab_size=32000, hidden_size=512, intermediate_size=1536, num_hidden_layers=8,
                  num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=4096),
    "large": dict(vocab_size=32000, hidden_size=1024, intermediate_size=4096, num_hidden_layers=24,
                  num_attention_heads=16, num_key_value_heads=8, max_position_embeddings=4096),
}


def set_size(size: str) -> None:
    global VOCAB, HEAD_DIM
    COMMON.update(SIZES[size])
    VOCAB = COMMON["vocab_size"]
    HEAD_DIM = COMMON["hidden_size"] // COMMON["num_attention_heads"]


def configs():
    from transformers import GemmaConfig, LlamaConfig, Qwen2Config, Phi3Config
    return {
        "llama": (LlamaConfig(**COMMON, head_dim=HEAD_DIM), "LlamaForCausalLM"),
        "qwen2": (Qwen2Config(**COMMON), "Qwen2ForCausalLM"),
        "gemma": (GemmaConfig(**COMMON, head_dim=HEAD_DIM), "GemmaForCausalLM"),
        # original_max_position_embeddings == max_position_embeddings keeps the builder off its
        # LongRoPE path (which needs rope_scaling factors a random config lacks: KeyError
        # 'multi_cache' otherwise).
        "phi3": (Phi3Config(**{k: v for k, v in COMMON.items() if k != "rms_norm_eps"},
                            original_max_position_embeddings=COMMON["max_position_embeddings"],
                            pad_token_id=0, bos_token_id=1, eos_token_id=2), "Phi3ForCausalLM"),
    }


def save_tokenizer(d: pathlib.Path):
    vocab = {f"t{i}": i for i in range(VOCAB)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="t0", bos_token="t1",
                            eos_token="t2", pad_token="t0").save_pretrained(d)


def build(family: str, precision: str, out: pathlib.Path, ep: str = "cpu") -> bool:
    import transformers
    cfg, cls_name = configs()[family]
    torch.manual_seed(1234)
    with tempfile.TemporaryDirectory() as tmp:
        hf = pathlib.Path(tmp) / "hf"
        model = getattr(transformers, cls_name)(cfg).eval()
        model.save_pretrained(hf)
        save_tokenizer(hf)
        # The builder's graph depends on the EP it targets (-e cuda: fp16 GroupQueryAttention and
        # its CUDA kernels' layouts); its name says which: llama-fp16 (cpu), llama_cuda-fp16.
        dest = out / (f"{family}-{precision}" if ep == "cpu" else f"{family}_{ep}-{precision}")
        shutil.rmtree(dest, ignore_errors=True)
        cmd = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(hf), "-o",
               str(dest), "-p", precision, "-e", ep, "-c", str(pathlib.Path(tmp) / "cache")]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            print(f"[gen] {dest.name}: builder failed:\n{r.stderr[-2000:]}")
            shutil.rmtree(dest, ignore_errors=True)
            return False
        # Keep the HF checkpoint too (config + safetensors, no tokenizer): the benchmarks run
        # the same weights through mlx-lm and PyTorch.
        shutil.copytree(hf, dest / "hf", ignore=shutil.ignore_patterns("tokenizer*", "special_tokens*"))
        (dest / "source.json").write_text(json.dumps({"family": family, "class": cls_name,
                                                       "config": cfg.to_dict()}, default=str))
        for junk in dest.glob("tokenizer*"):
            junk.unlink()
        print(f"[gen] {dest.name}: ok")
        return True


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(pathlib.Path(__file__).resolve().parents[1] / "tests/models/llm"))
    ap.add_argument("--families", default="llama,qwen2,gemma,phi3")
    ap.add_argument("--precisions", default="fp32,int4")
    ap.add_argument("--size", default="test", choices=sorted(SIZES))
    ap.add_argument("--eps", default="cpu", help="comma-separated builder targets (-e): cpu, cuda")
    a = ap.parse_args()
    set_size(a.size)
    out = pathlib.Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    results = {f"{f}-{p}-{e}": build(f, p, out, e) for e in a.eps.split(",")
               for f in a.families.split(",") for p in a.precisions.split(",")}
    print(json.dumps(results))


if __name__ == "__main__":
    main()
