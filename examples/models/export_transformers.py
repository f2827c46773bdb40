"""Export real transformer architectures (``transformers``, random weights) to ONNX.

    python examples/models/export_transformers.py MODEL OUT.onnx [--batch B] [--seq S] [--layers L]

MODEL: ``bert-base-squad`` (``BertForQuestionAnswering``, ``BertConfig()`` defaults: 12 layers,
hidden 768, 12 heads), ``bert-large-squad`` (24 layers, hidden 1024, 16 heads, FF 4096) or
``gpt2`` (``GPT2LMHeadModel``, ``GPT2Config()`` defaults: GPT-2 small, 12 layers, hidden 768).
Weights are random (seeded: ``torch.manual_seed(0)``), so no download is needed; the graph,
shapes and FLOPs are those of the real models. Exported with ``torch.onnx.export(dynamo=True)``
at a fixed batch and sequence length; weights go to ``OUT.onnx.data`` beside the model.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

ARCHS = ("bert-base-squad", "bert-large-squad", "gpt2")


def build(name: str, layers: int | None = None):
    """``(model, vocab size, input names)`` of an architecture, in eval mode, random weights."""
    import torch
    from transformers import BertConfig, BertForQuestionAnswering, GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    if name == "bert-base-squad":
        cfg = BertConfig() if layers is None else BertConfig(num_hidden_layers=layers)
        return BertForQuestionAnswering(cfg).eval(), cfg.vocab_size, ["input_ids", "attention_mask", "token_type_ids"]
    if name == "bert-large-squad":
        cfg = BertConfig(hidden_size=1024, num_hidden_layers=layers or 24, num_attention_heads=16,
                         intermediate_size=4096)
        return BertForQuestionAnswering(cfg).eval(), cfg.vocab_size, ["input_ids", "attention_mask", "token_type_ids"]
    if name == "gpt2":
        cfg = GPT2Config() if layers is None else GPT2Config(n_layer=layers)
        cfg.use_cache = False
        return GPT2LMHeadModel(cfg).eval(), cfg.vocab_size, ["input_ids", "attention_mask"]
    raise ValueError(f"unknown model '{name}'; known: {', '.join(ARCHS)}")


def export(name: str, out: Path, batch: int, seq: int, layers: int | None = None) -> Path:
    """Export ``name`` at ``batch`` x ``seq`` to ``out`` (ONNX with external weights)."""
    import torch
    model, vocab, names = build(name, layers)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, vocab, (batch, seq), generator=g)
    # by keyword: GPT-2's second positional parameter is past_key_values, not attention_mask
    kwargs = {"attention_mask": torch.ones(batch, seq, dtype=torch.long)}
    if "token_type_ids" in names:
        kwargs["token_type_ids"] = torch.zeros(batch, seq, dtype=torch.long)
    logging.getLogger("torch.onnx").setLevel(logging.ERROR)
    out.parent.mkdir(parents=True, exist_ok=True)
    with torch.no_grad():
        torch.onnx.export(model, (ids,), str(out), kwargs=kwargs, input_names=names, dynamo=True, verbose=False)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model", choices=ARCHS)
    p.add_argument("out", type=Path)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--seq", type=int, default=384)
    p.add_argument("--layers", type=int, default=None, help="override the number of layers")
    a = p.parse_args()
    export(a.model, a.out, a.batch, a.seq, a.layers)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
