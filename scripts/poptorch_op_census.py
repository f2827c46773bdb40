"""Which ATen ops real models emit through PopTorch's capture, and whether each lowers.

    python scripts/poptorch_op_census.py [--json OUT.json]

Captures (``torch.export`` + the decompositions :mod:`openipu.poptorch.capture` runs) ResNet-18
(``transformers`` ``ResNetForImageClassification``), BERT (``BertForQuestionAnswering``), GPT-2
(``GPT2LMHeadModel``), ViT (``ViTForImageClassification``) — random weights, small shapes, in
training mode with a loss where the model has one — and a ``torch_geometric`` GCN on KarateClub;
prints each op with the models that emit it and how it lowers: ``lowering`` (a lowering of its
own), ``decomposed`` (through torch's decomposition, :func:`openipu.poptorch.lower.lower_decomposed`)
or ``MISSING``. Exit status 1 when any op is missing. Host time only; nothing runs on the IPU.
"""

from __future__ import annotations

import argparse
import json
import operator
import sys
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples" / "models"))


def _models():
    from torch_models import ResNet18WithLoss
    from transformers import (BertConfig, BertForQuestionAnswering, GPT2Config, GPT2LMHeadModel, ViTConfig,
                              ViTForImageClassification)
    torch.manual_seed(0)
    ids = torch.randint(0, 1000, (2, 16))

    yield "resnet18", ResNet18WithLoss().train(), (torch.randn(2, 3, 32, 32), torch.tensor([1, 2])), {}
    bert = BertForQuestionAnswering(BertConfig(vocab_size=1000, hidden_size=64, num_hidden_layers=2,
                                               num_attention_heads=4, intermediate_size=128)).train()
    yield "bert-squad", bert, (), dict(input_ids=ids, attention_mask=torch.ones_like(ids),
                                       token_type_ids=torch.zeros_like(ids), start_positions=torch.tensor([1, 2]),
                                       end_positions=torch.tensor([3, 4]))
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=1000, n_embd=64, n_layer=2, n_head=4, n_positions=64,
                                           use_cache=False)).train()
    yield "gpt2", gpt2, (), dict(input_ids=ids, labels=ids)
    vit = ViTForImageClassification(ViTConfig(image_size=32, patch_size=8, hidden_size=64, num_hidden_layers=2,
                                              num_attention_heads=4, intermediate_size=128, num_labels=10)).train()
    yield "vit", vit, (), dict(pixel_values=torch.randn(2, 3, 32, 32), labels=torch.tensor([1, 2]))
    try:
        yield "gcn", *_gcn()
    except ImportError:
        print("torch_geometric not installed: GCN skipped", file=sys.stderr)


def _gcn():
    from torch_models import GCN, karate_club
    # GCNConv's own normalisation adds self loops with a data-dependent edge list: done once on
    # the host (GCNNorm)
    data = karate_club()
    return GCN(data.num_features, 16, 4).train(), (data.x, data.edge_index, data.edge_weight, data.y), {}


def census() -> dict:
    """``{op: {"models": [...], "how": "lowering" | "decomposed" | "MISSING"}}``."""
    from openipu.poptorch import capture
    from openipu.poptorch.lower import decomposition_of, load_lowerings, lowering_of, op_name
    load_lowerings()
    ops = defaultdict(set)
    for name, model, args, kwargs in _models():
        ep = capture.capture(model, args, kwargs)
        for n in ep.graph_module.graph.nodes:
            if n.op == "call_function" and n.target is not operator.getitem:
                ops[op_name(n.target)].add(name)
    out = {}
    for op, models in sorted(ops.items()):
        target = eval("torch.ops." + op, {"torch": torch}) if op.startswith(("aten.", "prims.", "poptorch.")) else None
        how = "lowering" if lowering_of(target) else "decomposed" if decomposition_of(target) else "MISSING"
        out[op] = {"models": sorted(models), "how": how}
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", help="also write the census as JSON")
    a = p.parse_args()
    c = census()
    w = max(len(k) for k in c)
    for op, v in c.items():
        print(f"{op:<{w}}  {v['how']:<10}  {', '.join(v['models'])}")
    missing = [k for k, v in c.items() if v["how"] == "MISSING"]
    print(f"{len(c)} ops, {len(missing)} missing" + (f": {', '.join(missing)}" if missing else ""))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(c, f, indent=1)
    sys.exit(1 if missing else 0)


if __name__ == "__main__":
    main()
