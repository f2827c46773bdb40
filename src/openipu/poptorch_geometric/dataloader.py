"""The IPU data loaders (PopTorch Geometric's ``poptorch_geometric.dataloader``): the loaders of
:mod:`openipu.poptorch_geometric.pyg_dataloader` on ``poptorch.DataLoader``, so each item is one
call's worth of data (``deviceIterations x replicas x gradientAccumulation`` mini-batches,
concatenated on dim 0 by :class:`CombinedBatchingCollater`; the wrapped model splits them)."""

from __future__ import annotations

from openipu import poptorch
from openipu.poptorch_geometric import pyg_dataloader
from openipu.poptorch_geometric.collate import CombinedBatchingCollater, FixedSizeCollater
from openipu.poptorch_geometric.pyg_collate import Collater
from openipu.poptorch_geometric.pyg_dataloader import FixedSizeStrategy, OverSizeStrategy  # noqa: F401


class DataLoader(pyg_dataloader.DataLoader, poptorch.DataLoader):
    """``DataLoader(dataset, batch_size=1, shuffle=False, follow_batch=None, exclude_keys=None,
    options=None, **kwargs)``: ``batch_size`` graphs per mini-batch, batched as PyG does (for
    datasets already padded, or one graph); a ``collate_fn`` is ignored."""

    def __init__(self, dataset, batch_size: int = 1, shuffle: bool = False, follow_batch=None, exclude_keys=None,
                 options=None, **kwargs):
        super().__init__(dataset, batch_size=batch_size, shuffle=shuffle, follow_batch=follow_batch,
                         exclude_keys=exclude_keys, options=options or poptorch.Options(), **kwargs)

    def _create_collater(self, batch_size=None, **collater_args):
        return CombinedBatchingCollater(Collater(**collater_args), batch_size)


class FixedSizeDataLoader(pyg_dataloader.FixedSizeDataLoader, poptorch.DataLoader):
    """``FixedSizeDataLoader(dataset, batch_size=2, shuffle=False, fixed_size_options=None,
    fixed_size_strategy=FixedSizeStrategy.PadToMax, over_size_strategy=OverSizeStrategy.Error,
    add_pad_masks=True, follow_batch=None, exclude_keys=None, options=None, **kwargs)``: the
    fixed-size batches of :class:`pyg_dataloader.FixedSizeDataLoader` on ``poptorch.DataLoader``
    (``options`` default ``poptorch.Options()``)."""

    def __init__(self, dataset, batch_size: int = 2, shuffle: bool = False, fixed_size_options=None,
                 fixed_size_strategy=FixedSizeStrategy.PadToMax, over_size_strategy=OverSizeStrategy.Error,
                 add_pad_masks: bool = True, follow_batch=None, exclude_keys=None, options=None, **kwargs):
        super().__init__(dataset, batch_size=batch_size, shuffle=shuffle, fixed_size_options=fixed_size_options,
                         fixed_size_strategy=fixed_size_strategy, over_size_strategy=over_size_strategy,
                         add_pad_masks=add_pad_masks, follow_batch=follow_batch, exclude_keys=exclude_keys,
                         options=options or poptorch.Options(), **kwargs)

    def _create_collater(self, mini_batch_size=None, **collater_args):
        return CombinedBatchingCollater(FixedSizeCollater(**collater_args), mini_batch_size)
