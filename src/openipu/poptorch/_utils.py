"""Helpers for combined batches (PopTorch's ``poptorch._utils``): consecutive batches of a user
``batch_sampler`` concatenated on dim 0 into one call's worth of data."""

from __future__ import annotations

import torch

from openipu.poptorch._args import (custom_arg_parsers, flattenTensorStructure, getCustomParser,  # noqa: F401
                                    reconstructTensorStructure)


def combine_batch_tensors_gen(tensors):
    """Yield ``torch.cat`` on dim 0 of the i-th tensor of every batch (``tensors``: one list of
    tensors per batch, all the same length), for each i."""
    for i in range(len(tensors[0])):
        yield torch.cat([batch[i] for batch in tensors])


def combined_batch_generator(iterator, num_batches_to_combine: int, drop_last: bool = True):
    """Wrap a loader iterator: yield batches made of ``num_batches_to_combine`` consecutive
    batches concatenated tensor by tensor on dim 0 (the last, shorter group is dropped when
    ``drop_last``)."""
    group, last = [], None
    for batch in iterator:
        group.append(flattenTensorStructure(batch))
        last = batch
        if len(group) == num_batches_to_combine:
            yield reconstructTensorStructure(last, combine_batch_tensors_gen(group))
            group = []
    if group and not drop_last:
        yield reconstructTensorStructure(last, combine_batch_tensors_gen(group))
