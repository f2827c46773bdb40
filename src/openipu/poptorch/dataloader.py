"""``poptorch.DataLoader`` and ``AsynchronousDataAccessor`` (``research/poptorch.md`` 1.6).

The loader batches ``batch_size * deviceIterations * (replicationFactor / inputGroupSize) *
gradientAccumulation`` samples (``combinedBatchSize``): one call's worth. ``drop_last`` is True by
default (unlike PyTorch's). ``DataLoaderMode.Async`` / ``AsyncRebatched`` wrap it in an
``AsynchronousDataAccessor``, which loads ahead in a background thread (PopTorch uses a worker
process and shared memory; a thread gives the same overlap of loading with running here, with
no pickling of the dataset).
"""

from __future__ import annotations

import atexit
import queue
import threading

import torch

from openipu.poptorch.enums import DataLoaderMode
from openipu.poptorch.errors import Error


class _ProcessSlice(torch.utils.data.Dataset):
    """This process's contiguous share of a map-style dataset when ``Options.Distributed`` says
    there are several processes (PopTorch's ``_SubDataset``): with ``drop_last`` every process gets
    the same whole number of ``step``-sample calls, else the samples are shared out as evenly as
    possible. ``shuffle``: each epoch (:meth:`reshuffle`) permutes the whole dataset with a
    generator seeded by ``Options.randomSeed``, the same in every process, and each process reads
    its slice of the permutation."""

    def __init__(self, dataset, options, step: int, drop_last: bool, shuffle: bool):
        n, procs, pid = len(dataset), options.Distributed.numProcesses, options.Distributed.processId
        if drop_last:
            per = step * (n // (step * procs))
            self._offset, self._length = pid * per, per
        else:
            sizes = [n // procs + (n % procs > p) for p in range(procs)]
            self._offset, self._length = sum(sizes[:pid]), sizes[pid]
        self._dataset = dataset
        self._order = None
        self._generator = None
        if shuffle:
            if options.random_seed is None:
                raise AssertionError("When using auto_distributed_partitioning you must set "
                                     "poptorch.Options.randomSeed() to ensure that tensors are in the same order in "
                                     "all processes.")
            self._generator = torch.Generator().manual_seed(int(options.random_seed))

    def reshuffle(self) -> None:
        if self._generator is not None:
            self._order = torch.randperm(len(self._dataset), generator=self._generator)

    def __len__(self):
        return self._length

    def __getitem__(self, i):
        if not 0 <= i < self._length:
            raise IndexError(i)
        g = self._offset + i
        return self._dataset[int(self._order[g]) if self._order is not None else g]


class DataLoader(torch.utils.data.DataLoader):
    """``poptorch.DataLoader(options, dataset, batch_size=1, shuffle=None, num_workers=0,
    drop_last=True, persistent_workers=None, auto_distributed_partitioning=True,
    mode=DataLoaderMode.Sync, async_options=None, rebatched_worker_size=None, **kwargs)``.
    With ``Options.Distributed`` naming several processes (and ``auto_distributed_partitioning``)
    each process loads its own contiguous share of the dataset (:class:`_ProcessSlice`);
    shuffling then needs ``Options.randomSeed`` (``AssertionError`` otherwise)."""

    def __init__(self, options, dataset, batch_size: int = 1, shuffle=None, num_workers: int = 0,
                 drop_last: bool = True, persistent_workers=None, auto_distributed_partitioning: bool = True,
                 mode=DataLoaderMode.Sync, async_options=None, rebatched_worker_size=None, **kwargs):
        from openipu.poptorch.options import Options
        options = options or Options()
        self._options = options
        self._combined_batch_size = None
        factor = options.batch_factor() if batch_size is not None else 1
        self._combine_batches = None
        self._slice = None
        if kwargs.get("batch_sampler") is not None:
            # a user batch sampler draws whole batches: one call combines ``factor`` of them
            # (PopTorch's rule: batch_size must stay 1 and shuffle off)
            if batch_size != 1 or shuffle:
                raise Error("`batch_sampler` option is mutually exclusive with batch_size, shuffle.")
            self._combine_batches, self._sampler_drop_last = factor, drop_last
            super().__init__(dataset, num_workers=num_workers,
                             persistent_workers=bool(persistent_workers) and num_workers > 0, **kwargs)
            self._combined_batch_size = getattr(kwargs["batch_sampler"], "batch_size", 1) * factor
            self._mode = DataLoaderMode(mode)
            self._accessor = None
            if self._mode != DataLoaderMode.Sync:
                self._accessor = AsynchronousDataAccessor(self, **(async_options or {}))
            return
        combined = None if batch_size is None else int(batch_size) * factor
        if persistent_workers is None:
            persistent_workers = num_workers > 0
        if kwargs.get("sampler", 0) is None:
            del kwargs["sampler"]
        procs = options.Distributed.numProcesses
        if procs > 1 and auto_distributed_partitioning:
            if isinstance(dataset, torch.utils.data.IterableDataset):
                raise AssertionError("auto_distributed_partitioning not supported for IterableDataset")
            if combined is None:
                raise AssertionError("batch_size=None not allowed when using auto_distributed_partitioning.")
            dataset = self._slice = _ProcessSlice(dataset, options, combined, drop_last, bool(shuffle))
            shuffle = False
        super().__init__(dataset, batch_size=combined, shuffle=bool(shuffle), num_workers=num_workers,
                         drop_last=drop_last, persistent_workers=persistent_workers and num_workers > 0, **kwargs)
        self._combined_batch_size = combined
        self._mode = DataLoaderMode(mode)
        self._accessor = None
        if self._mode != DataLoaderMode.Sync:
            self._accessor = AsynchronousDataAccessor(self, **(async_options or {}))

    @property
    def combinedBatchSize(self):  # noqa: N802
        """Samples per call: ``batch_size * deviceIterations * replicas * accumulation`` (None with
        ``batch_size=None``). PopTorch keeps it in ``_combined_batch_size``, which applications
        read directly (graphcore/examples' FastPitch), so the attribute has PopTorch's name."""
        return self._combined_batch_size

    @property
    def options(self):
        return self._options

    def __iter__(self):
        if self._slice is not None:
            self._slice.reshuffle()
        if self._accessor is not None:
            return iter(self._accessor)
        if self._combine_batches not in (None, 1):
            from openipu.poptorch._utils import combined_batch_generator
            return combined_batch_generator(super().__iter__(), self._combine_batches, self._sampler_drop_last)
        return super().__iter__()

    def __len__(self):
        n = super().__len__()
        if self._combine_batches not in (None, 1):
            n = n // self._combine_batches if self._sampler_drop_last else -(-n // self._combine_batches)
        return n

    def terminate(self):
        if self._accessor is not None:
            self._accessor.terminate()


class AsynchronousDataAccessor:
    """Loads the batches of ``dataset`` (a DataLoader or any iterable) ahead in a background
    thread, ``buffer_size`` batches deep. ``load_indefinitely``: restart at the end of each
    epoch; ``early_preload``: start loading at construction. ``terminate()`` stops it (also at
    exit)."""

    def __init__(self, dataset, buffer_size: int = 3, miss_sleep_time_in_ms: float = 0.1,
                 load_indefinitely: bool = True, early_preload: bool = False, sharing_strategy=None,
                 rebatched_size=None):
        if buffer_size < 1:
            raise Error("buffer_size must be at least 1")
        self._data = dataset
        self._size = int(buffer_size)
        self._indefinitely = bool(load_indefinitely)
        self._queue = None
        self._thread = None
        self._stop = threading.Event()
        self._epoch_done = object()
        atexit.register(self.terminate)
        if early_preload:
            self._start()

    def __len__(self):
        return len(self._data)

    def _start(self):
        self._queue = queue.Queue(maxsize=self._size)
        self._stop.clear()

        def work():
            while not self._stop.is_set():
                for batch in (torch.utils.data.DataLoader.__iter__(self._data)
                              if isinstance(self._data, DataLoader) else iter(self._data)):
                    if not self._put(batch):
                        return
                if not self._put(self._epoch_done) or not self._indefinitely:
                    return
        self._thread = threading.Thread(target=work, daemon=True)
        self._thread.start()

    def _put(self, item) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def __iter__(self):
        if self._thread is None or not self._thread.is_alive() and self._queue.empty():
            self._start()
        while True:
            item = self._queue.get()
            if item is self._epoch_done:
                if not self._indefinitely:
                    self._thread = None
                return
            yield item

    def terminate(self):
        """Stop loading."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._thread = None
