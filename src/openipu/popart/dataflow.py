"""``popart.DataFlow`` and ``popart.AnchorReturnType`` (PopART ``dataflow.hpp``), and PopART's
anchor / input buffer shape rules (``research/popart.md`` section 2)."""

from __future__ import annotations

from openipu.popart.errors import popart_exception


class AnchorReturnTypeId:
    Final = "Final"
    EveryN = "EveryN"
    All = "All"
    Sum = "Sum"


class TileSet:
    Compute = "Compute"
    IO = "IO"


class ExchangeStrategy:
    JustInTime = "JustInTime"
    OverlapInnerLoop = "OverlapInnerLoop"
    OverlapLoops = "OverlapLoops"
    OverlapStep = "OverlapStep"


_IDS = {"final": AnchorReturnTypeId.Final, "everyn": AnchorReturnTypeId.EveryN, "all": AnchorReturnTypeId.All,
        "sum": AnchorReturnTypeId.Sum}


class AnchorReturnType:
    """``AnchorReturnType("FINAL"|"ALL"|"SUM")`` or ``AnchorReturnType("EVERYN", n)`` (any case).

    FINAL: the last batch of the step; ALL: every batch; EVERYN: the N-th, 2N-th, ... batch; SUM:
    the sum over the step's batches. Raises ``popart_exception`` with PopART's messages.
    """

    def __init__(self, art: str, returnPeriod=None, tileSet=TileSet.Compute,  # noqa: N803
                 exchangeStrategy=ExchangeStrategy.JustInTime):  # noqa: N803
        if isinstance(returnPeriod, str) and returnPeriod in (TileSet.Compute, TileSet.IO):
            returnPeriod, tileSet = None, returnPeriod
        key = str(art).lower()
        if key not in _IDS:
            raise popart_exception(f"Invalid anchor return type ID supplied: {art}")
        self._id = _IDS[key]
        if self._id == AnchorReturnTypeId.EveryN:
            if returnPeriod is None:
                raise popart_exception("Must specify return period with option 'EVERYN'")
            if int(returnPeriod) <= 0:
                raise popart_exception("Anchor return period must be greater than zero")
            self._rp = int(returnPeriod)
        else:
            if returnPeriod is not None:
                raise popart_exception("A return period should not be supplied for this anchor return type")
            self._rp = 0
        self._tile_set, self._exchange = tileSet, exchangeStrategy

    def id(self) -> str:
        return self._id

    def rp(self) -> int:
        return self._rp

    def str(self) -> str:
        return {"Final": "FINAL", "EveryN": "EVERYN", "All": "ALL", "Sum": "SUM"}[self._id]

    def tileSet(self):  # noqa: N802
        return self._tile_set

    def exchangeStrategy(self):  # noqa: N802
        return self._exchange

    def __repr__(self):
        return f"AnchorReturnType({self.str()!r}" + (f", {self._rp})" if self._rp else ")")

    def __eq__(self, other):
        return isinstance(other, AnchorReturnType) and (self._id, self._rp) == (other._id, other._rp)


class DataFlow:
    """``DataFlow(batchesPerStep, {id: AnchorReturnType})`` or ``DataFlow(bps, [ids],
    anchorReturnType)``. Raises ``popart_exception`` for a non-positive ``batchesPerStep`` or an
    EVERYN period that exceeds or does not divide it."""

    def __init__(self, batchesPerStep: int, anchorTensors=None, anchorReturnType=None):  # noqa: N803
        if int(batchesPerStep) <= 0:
            raise popart_exception("'Batches per step' must be greater than zero")
        self._bps = int(batchesPerStep)
        anchorTensors = anchorTensors if anchorTensors is not None else {}
        if isinstance(anchorTensors, dict):
            self._arts = dict(anchorTensors)
        else:
            art = anchorReturnType if anchorReturnType is not None else AnchorReturnType("All")
            self._arts = {t: art for t in anchorTensors}
        for tid, art in self._arts.items():
            if not isinstance(art, AnchorReturnType):
                raise popart_exception(f"Anchor '{tid}': expected a popart.AnchorReturnType, got {type(art).__name__}")
        self._check_periods()

    def _check_periods(self):
        for art in self._arts.values():
            if art.id() == AnchorReturnTypeId.EveryN:
                if art.rp() > self._bps:
                    raise popart_exception("Return period must be <= to the number of batches per step")
                if self._bps % art.rp():
                    raise popart_exception("Return period must be a factor of the number of batches per step")

    def anchors(self) -> list[str]:
        return list(self._arts)

    def nAnchors(self) -> int:  # noqa: N802
        return len(self._arts)

    def isAnchored(self, tid: str) -> bool:  # noqa: N802
        return tid in self._arts

    def art(self, tid: str) -> AnchorReturnType:
        if tid not in self._arts:
            raise popart_exception(f"Tensor {tid} is not an anchor")
        return self._arts[tid]

    def batchesPerStep(self) -> int:  # noqa: N802
        return self._bps

    def setBatchesPerStep(self, n: int) -> None:  # noqa: N802
        if int(n) <= 0:
            raise popart_exception("'Batches per step' must be greater than zero")
        self._bps = int(n)
        self._check_periods()

    def __repr__(self):
        return f"DataFlow({self._bps}, {self._arts})"


def anchor_shape(art: AnchorReturnType, shape, bps: int, accl: int, repl: int) -> list[int]:
    """Host array shape of an anchor (PopART's ``initAnchorArrays`` rule).

    ALL: ``[bps, accl, repl, *shape]``; EVERYN(N): ``[bps // N, accl, repl, *shape]``; FINAL and
    SUM: ``[repl, *shape]``; then leading dims (of those added) equal to 1 are dropped.
    Raises ``RuntimeError`` (as PopART's Python) when N does not divide ``bps``.
    """
    i = art.id()
    if i == AnchorReturnTypeId.All:
        lead = [bps, accl, repl]
    elif i == AnchorReturnTypeId.EveryN:
        if bps % art.rp():
            raise RuntimeError("Invalid anchor period, is not divisble by batchesPerStep")
        lead = [bps // art.rp(), accl, repl]
    else:
        lead = [repl]
    return [d for d in lead if d != 1] + list(shape)


def anchor_elements(art: AnchorReturnType, nelms: int, bps: int, accl: int, repl: int) -> int:
    """Expected element count of an anchor buffer (PopART ``stepio_size_assertion.cpp``)."""
    i = art.id()
    div = 1 if i == AnchorReturnTypeId.All else art.rp() if i == AnchorReturnTypeId.EveryN else bps * accl
    return nelms * accl * bps * repl // div
