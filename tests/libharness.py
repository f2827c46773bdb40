"""A small harness for PopLibs op tests: build a graph, map inputs, run, read outputs back.

    h = OpHarness(tiles=16)
    a = h.input("a", np.arange(12.0).reshape(3, 4), mapping="random")
    out = popops.add(h.graph, a, a, h.prog)
    res = h.run(out=out)            # {"out": ndarray}
"""

from __future__ import annotations

import numpy as np

from openipu import poplar
from openipu.poplar import program as P

_NP_TO_POPLAR = {np.dtype(np.float32): poplar.FLOAT, np.dtype(np.float16): poplar.HALF,
                 np.dtype(np.int32): poplar.INT, np.dtype(np.uint32): poplar.UNSIGNED_INT,
                 np.dtype(np.bool_): poplar.BOOL, np.dtype(np.int16): poplar.SHORT,
                 np.dtype(np.uint16): poplar.UNSIGNED_SHORT, np.dtype(np.int8): poplar.SIGNED_CHAR,
                 np.dtype(np.uint8): poplar.UNSIGNED_CHAR}


class OpHarness:
    """One IPU Model device with ``tiles`` tiles, a graph and a program ``Sequence``."""

    def __init__(self, tiles: int = 16, version: str = "ipu2", num_ipus: int = 1, replicas: int = 1, seed: int = 0):
        m = poplar.IPUModel(version)
        m.tilesPerIPU = tiles
        m.numIPUs = num_ipus
        self.device = m.createDevice()
        self.graph = poplar.Graph(self.device.getTarget(), replication_factor=replicas) if replicas > 1 \
            else poplar.Graph(self.device.getTarget())
        self.prog = P.Sequence()
        self.rng = np.random.default_rng(seed)
        self.engine = None

    def map(self, t, mapping="linear"):
        """Map ``t``: "linear" (mapTensorLinearly), "tile0", "random" (each element on a random
        tile), "blocks" (contiguous blocks of random sizes on random tiles), or an int tile."""
        from openipu.poplibs import poputil
        n, T = t.numElements(), self.graph.getTarget().getNumTiles()
        if mapping == "linear":
            poputil.mapTensorLinearly(self.graph, t)
        elif mapping == "tile0":
            self.graph.setTileMapping(t, 0)
        elif isinstance(mapping, int):
            self.graph.setTileMapping(t, mapping)
        elif mapping == "random":
            self.graph.setTileMapping(t, self.rng.integers(0, T, n))
        elif mapping == "blocks":
            cuts = np.sort(self.rng.integers(0, n + 1, min(T, max(n, 1))))
            tiles = np.repeat(self.rng.integers(0, T, cuts.size + 1), np.diff(np.r_[0, cuts, n]))
            self.graph.setTileMapping(t, tiles)
        else:
            raise ValueError(mapping)
        return t

    def input(self, name: str, value: np.ndarray, type_=None, mapping="linear"):
        """A variable holding ``value`` (set as its initial value), mapped by ``mapping``."""
        value = np.asarray(value)
        type_ = type_ or _NP_TO_POPLAR[value.dtype]
        t = self.graph.addVariable(type_, list(value.shape), name)
        self.map(t, mapping)
        self.graph.setInitialValue(t, value)
        return t

    def run(self, **outputs) -> dict:
        """Compile and run ``prog`` once; return each named output tensor as an ndarray."""
        for name, t in outputs.items():
            self.graph.createHostRead(name, t)
        self.engine = poplar.Engine(self.graph, self.prog)
        self.engine.load(self.device)
        self.engine.run(0)
        return {name: np.asarray(self.engine.readTensor(name)) for name in outputs}

    def cycles(self) -> int:
        """Predicted IPU cycles of the last run."""
        return self.engine.last_run_cycles
