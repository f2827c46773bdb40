"""Print the exact predictions (IPU cycles per step, tile memory) of a fixed set of models, to
check that a change to the simulator's internals leaves every prediction as it was.

    python scripts/prediction_snapshot.py [CASE ...] > after.txt
    diff before.txt after.txt

Each case runs ``openipu.runner.run_model`` in its own subprocess (memory is freed between
cases). Figures are predictions for the IPU; the host seconds printed last are not compared.
Cases: the nine light models at their own batch, light_resnet50 in fp16 at batch 4 on two
IPUs, and a two-layer BERT (hidden 128, random weights, exported with torch.onnx at batch 2 x 32).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

from openipu import runner

CASES = {m: {"model": m} for m in runner.LIGHT_MODELS}
CASES["light_resnet50_fp16_b4_2ipu"] = {"model": "light_resnet50", "precision": "fp16", "batch_size": 4, "num_ipus": 2}
CASES["bert_tiny"] = {"model": "@bert_tiny"}


def _bert_tiny(path: Path) -> str:
    if not path.exists():
        import logging

        import torch
        from transformers import BertConfig, BertModel
        torch.manual_seed(0)
        cfg = BertConfig(hidden_size=128, num_hidden_layers=2, num_attention_heads=4, intermediate_size=512,
                         vocab_size=1000)
        m = BertModel(cfg).eval()
        ids = torch.randint(0, 1000, (2, 32))
        logging.getLogger("torch.onnx").setLevel(logging.ERROR)
        torch.onnx.export(m, (ids, torch.ones(2, 32, dtype=torch.long)), str(path),
                          input_names=["input_ids", "attention_mask"], dynamo=True, verbose=False)
    return str(path)


def _one(name: str, workdir: str) -> dict:
    kw = dict(CASES[name])
    if kw["model"] == "@bert_tiny":
        kw["model"] = _bert_tiny(Path(workdir) / "bert_tiny.onnx")
    r = runner.run_model(kw.pop("model"), **kw)
    return {"case": name, "fits": r.fits, "step_cycles": r.step_cycles, "tile_bytes_max": r.tile_bytes_max,
            "tile_bytes_mean": round(r.tile_bytes_mean, 6),
            "by_category": {k: round(float(v), 3) for k, v in sorted(r.by_category.items())},
            "host_compile_s": round(r.host_compile_seconds, 2)}


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--one":
        print(json.dumps(_one(sys.argv[2], sys.argv[3])))
        return
    names = sys.argv[1:] or list(CASES)
    with tempfile.TemporaryDirectory() as d:
        for name in names:
            p = subprocess.run([sys.executable, __file__, "--one", name, d], capture_output=True, text=True)
            if p.returncode:
                print(f"{name}: FAILED\n{p.stderr[-2000:]}")
                continue
            rec = json.loads(p.stdout.strip().splitlines()[-1])
            host = rec.pop("host_compile_s")
            print(json.dumps(rec, sort_keys=True), f"  # host compile {host} s", flush=True)


if __name__ == "__main__":
    main()
