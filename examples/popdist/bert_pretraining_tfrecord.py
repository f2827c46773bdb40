"""Write a small random BERT pre-training data set in the TFRecord layout Graphcore's
``nlp/bert/pytorch`` application reads (``--dataset pretraining --input-files DIR/*.tfrecord``),
with the ``.index`` files its ``TFRecordPretrainingDataset`` needs.

The application's ``--dataset generated`` holds exactly one step of one instance's samples, so
under ``poprun --num-instances 2`` PopTorch's distributed partitioning leaves each instance less
than one step (the application stops with "Not enough data in input_files"; Graphcore's own
benchmarks of it use ``--num-instances 1``). This stands in for the Wikipedia download.

    python bert_pretraining_tfrecord.py OUT_DIR [--samples 64] [--files 2] [--sequence-length 128]
        [--mask-tokens 20] [--vocab-size 1024] [--seed 0]

Each record: ``input_ids``, ``input_mask`` (ones), ``segment_ids`` (0 then 1), ``masked_lm_positions``,
``masked_lm_ids`` (int64, ``mask_tokens`` each), ``next_sentence_labels`` (int64, 1). Needs the
``tfrecord`` package (the application's requirement).
"""

import argparse
import os

import numpy as np


def write(out_dir: str, samples: int = 64, files: int = 2, sequence_length: int = 128, mask_tokens: int = 20,
          vocab_size: int = 1024, seed: int = 0) -> list[str]:
    """Write ``files`` TFRecord files (and their indexes) holding ``samples`` records in all;
    returns the ``.tfrecord`` paths."""
    from tfrecord.tools.tfrecord2idx import create_index
    from tfrecord.writer import TFRecordWriter
    rng = np.random.default_rng(seed)
    os.makedirs(out_dir, exist_ok=True)
    paths = []
    for f in range(files):
        path = os.path.join(out_dir, f"part-{f:03d}.tfrecord")
        w = TFRecordWriter(path)
        for _ in range(samples // files):
            split = int(rng.integers(1, sequence_length))
            w.write({
                "input_ids": (rng.integers(0, vocab_size, sequence_length).tolist(), "int"),
                "input_mask": ([1] * sequence_length, "int"),
                "segment_ids": ([0] * split + [1] * (sequence_length - split), "int"),
                "masked_lm_positions": (np.sort(rng.choice(sequence_length, mask_tokens, replace=False)).tolist(), "int"),
                "masked_lm_ids": (rng.integers(0, vocab_size, mask_tokens).tolist(), "int"),
                "next_sentence_labels": ([int(rng.integers(0, 2))], "int"),
            })
        w.close()
        create_index(path, path.replace(".tfrecord", ".index"))
        paths.append(path)
    return paths


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out_dir")
    p.add_argument("--samples", type=int, default=64)
    p.add_argument("--files", type=int, default=2)
    p.add_argument("--sequence-length", type=int, default=128)
    p.add_argument("--mask-tokens", type=int, default=20)
    p.add_argument("--vocab-size", type=int, default=1024)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    for path in write(a.out_dir, a.samples, a.files, a.sequence_length, a.mask_tokens, a.vocab_size, a.seed):
        print(path)
