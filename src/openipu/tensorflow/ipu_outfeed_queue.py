"""``ipu.ipu_outfeed_queue.IPUOutfeedQueue``: values sent from an IPU loop to the host."""

import enum

import numpy as np
import tensorflow as tf


class IPUOutfeedMode(enum.Enum):
    ALL = 1
    LAST = 2


class IPUOutfeedQueue:
    """``IPUOutfeedQueue(outfeed_mode=None, device_ordinal=None, buffer_depth=3,
    optimise_latency=False)``. ``enqueue`` (in a step ``IPUStrategy.run`` runs on the simulated
    IPU: one item per step; eagerly, or in a ``tf.function`` on the CPU through
    ``tf.py_function``) stores a tensor, tuple or dict; ``dequeue()`` stacks them (``ALL``:
    ``[n_enqueues, ...]``) or gives the last (``LAST``)."""

    def __init__(self, outfeed_mode=None, device_ordinal=None, buffer_depth=3, optimise_latency=False, **kwargs):
        self._mode = outfeed_mode or IPUOutfeedMode.ALL
        if not isinstance(self._mode, IPUOutfeedMode):
            raise ValueError("Expected `outfeed_mode` value to be of `IPUOutfeedMode` type, but is "
                             f"{type(self._mode)}.")
        self._items = []
        self._structure = None
        self._enqueued = False

    def enqueue(self, tensors):
        from ._custom_step import active
        flat = tf.nest.flatten(tensors)
        trace = active()
        if trace is not None:           # IPUStrategy.run is tracing the step for the simulated IPU
            trace.outfeeds.append((self, tensors, list(flat)))
            return None
        self._enqueued = True
        self._structure = tensors

        def store(*vals):
            self._items.append([np.asarray(v) for v in vals])
            return 0
        if tf.executing_eagerly():
            store(*[np.asarray(t) for t in flat])
            return None
        return tf.py_function(store, flat, Tout=tf.int32)

    def dequeue(self, wait_for_completion=False):
        if not self._enqueued:
            raise ValueError("Trying to dequeue an outfeed which has not been enqueued.")
        items, self._items = self._items, []
        if not items:
            flat = [np.zeros((0,)) for _ in tf.nest.flatten(self._structure)]
        elif self._mode == IPUOutfeedMode.LAST:
            flat = items[-1]
        else:
            flat = [np.stack(v) for v in zip(*items)]
        return tf.nest.pack_sequence_as(self._structure, [tf.convert_to_tensor(v) for v in flat])

    def __iter__(self):
        if self._mode != IPUOutfeedMode.ALL:
            raise ValueError("Only outfeeds in IPUOutfeedMode.ALL mode can be iterated over.")
        out = self.dequeue()
        n = tf.nest.flatten(out)[0].shape[0]
        for i in range(n):
            yield tf.nest.map_structure(lambda t, i=i: t[i], out)
