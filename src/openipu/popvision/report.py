"""The ``pva`` report reader: libpva's Python API over the ``profile.pop`` the engine writes.

``openReport(path)`` reads and checks the whole profile (an SQLite database,
docs/profile-format.md) at once, so a truncated, damaged or crafted file fails there with a
``pva.Error`` subclass, not later. The file is untrusted data: :mod:`openipu.popvision.reader`
opens it read-only, refuses anything in it that could run SQL (views, triggers, virtual tables),
bounds every query's time and every size, and decodes the ``.npy`` arrays only after checking
their headers. Per-tile figures are numpy arrays (one per category, length = tiles); the objects
libpva exposes (``report.compilation.tiles[i].memory.total.includingGaps`` ...) are views built
from them on access, and a damage found while building them is :class:`CorruptReport` too.

Every cycle figure is a *predicted IPU* figure from openipu's cost model (the profile of the
IPU Model); the only host time is ``Run.hostSeconds`` / ``Report.compileHostSeconds``.
"""

from __future__ import annotations

import functools
import os
import re
from functools import cached_property

import numpy as np

from openipu.popvision.errors import CorruptReport
from openipu.popvision.reader import SUPPORTED_FORMAT_VERSIONS, _q, read_profile  # noqa: F401 - re-exported

#: libpva's memory category names for the categories openipu's memory plan counts.
CATEGORY_NAMES = {"Variables": "variable", "Constants": "constant", "Stack": "stack",
                  "Vertex Instances": "vertexInstanceState", "Control Code": "controlCode",
                  "Vertex Code": "vertexCode", "Internal Exchange Code": "internalExchangeCode"}
#: libpva's other memory categories: openipu does not model them, so they read 0 bytes.
UNMODELLED_CATEGORIES = ("controlId", "controlTable", "copyDescriptor", "globalExchangeCode",
                         "globalExchangePacketHeader", "globalMessage", "hostExchangeCode", "hostExchangePacketHeader",
                         "hostMessage", "instrumentationResults", "message", "rearrangement", "sharedCodeStorage",
                         "sharedDataStorage", "vectorListDescriptor", "vertexFieldData")
_EXEC_CATEGORIES = ("compute", "exchange", "global_exchange", "host_exchange", "sync")


def _guarded(fn):
    """Defence in depth for the lazily built parts of a report: the data was checked at open
    time, so an exception while building them means a damaged profile (or a reader bug); either
    way the caller gets :class:`CorruptReport` naming the profile, not a raw Python error."""
    @functools.wraps(fn)
    def wrapper(self, *args, **kw):
        try:
            return fn(self, *args, **kw)
        except (LookupError, ValueError, TypeError, ArithmeticError, MemoryError, RecursionError) as e:
            raise CorruptReport(f"Profile '{_path_of(self)}' is damaged: building {fn.__name__} failed "
                                f"({type(e).__name__}: {_q(str(e), 200)})") from None
    return wrapper


def _path_of(obj) -> str:
    for attr in ("_r", "_comp"):
        obj = getattr(obj, attr, obj)
    return getattr(obj, "path", None) or getattr(getattr(obj, "_r", None), "path", "?")


# ----------------------------------------------------------------------------------------------
# small value objects
# ----------------------------------------------------------------------------------------------
class _Obj:
    def __init__(self, **kw):
        self.__dict__.update(kw)

    def __repr__(self):
        inner = ", ".join(f"{k}={v!r}" for k, v in self.__dict__.items() if not k.startswith("_")
                          and not isinstance(v, (list, np.ndarray, dict)))
        return f"{type(self).__name__}({inner})"


class Version(_Obj):
    """``report.poplarVersion``: ``major``, ``minor``, ``point``, ``string``, ``packageHash``."""


class Target(_Obj):
    """``compilation.target``: ``numTiles``, ``numIPUs``, ``tilesPerIpu``, ``bytesPerTile`` (bytes),
    ``clockFrequency`` (Hz), ``numReplicas``, ``type`` ("IPU" / "IPU_MODEL"), ``arch``."""


class GraphInfo(_Obj):
    """``compilation.graph``: ``numVertices``, ``numEdges``, ``numVariables``, ``numComputeSets``."""


class MemorySize(_Obj):
    """``includingGaps`` / ``excludingGaps`` in bytes (openipu models no gaps: they are equal)."""


class CategoryMemory(_Obj):
    """One memory category on one tile: ``total`` bytes and its regions (``nonInterleaved`` holds
    it all; ``interleaved`` and ``overflowed`` are 0 unless the tile is over its memory)."""


class _Categories:
    def __init__(self, report, tile):
        self._r, self._t = report, tile

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        arr = self._r._cat_by_pva.get(name)
        if arr is None and name not in UNMODELLED_CATEGORIES:
            raise AttributeError(f"No memory category '{name}'; categories: {', '.join(self.__dir__())}")
        b = 0 if arr is None else int(arr[self._t])
        over = max(0, int(self._r._arrays["memory/total"][self._t]) - self._r.compilation.target.bytesPerTile)
        return CategoryMemory(total=b, nonInterleaved=_Obj(nonOverlapped=b, overlapped=0), interleaved=_Obj(
            nonOverlapped=0, overlapped=0), overflowed=_Obj(nonOverlapped=min(b, over), overlapped=0))

    def __dir__(self):
        return sorted(set(self._r._cat_by_pva) | set(UNMODELLED_CATEGORIES))


class TileMemory(_Obj):
    """``tile.memory``: ``total`` (:class:`MemorySize`, bytes), ``alwaysLiveBytes``,
    ``notAlwaysLiveBytes`` (the peak of the not-always-live variables) and ``category.<name>``."""


class Tile(_Obj):
    """``compilation.tiles[i]``: ``number`` (global tile), ``tileInIpu``, ``ipu``, ``memory``."""


class Ipu(_Obj):
    """``compilation.ipus[i]``: ``id`` and its ``tiles``."""


class Variable(_Obj):
    """``compilation.variables[i]``: ``name``, ``size`` (bytes), ``type``, ``shape``, ``numTiles``,
    ``constant``, ``alwaysLive`` (True / False; None when the profile does not record it)."""


class VertexType(_Obj):
    """``name``, ``count`` (instances), ``stateBytes``, ``codeBytes`` (bytes per tile holding it),
    ``cycles`` (predicted tile cycles summed over the executed runs)."""


class Vertex(_Obj):
    """``computeset.vertices[i]``: ``type`` (:class:`VertexType`) and ``count`` of instances."""


class ComputeSet(_Obj):
    """``id``, ``name``, ``vertices`` (per vertex type), ``numVertices``, ``numTiles``,
    ``estimatedCyclesByTile`` (predicted compute cycles per tile, float array)."""


class LivenessStep(_Obj):
    """``compilation.livenessProgramSteps[i]``: ``index``, ``program``,
    ``notAlwaysLiveMemory.bytes`` (not-always-live bytes summed over tiles during that step) and
    ``notAlwaysLiveMemoryForIpu(ipu).bytes`` (the same over one IPU's tiles)."""

    def notAlwaysLiveMemoryForIpu(self, ipu: int):  # noqa: N802
        by = self._by_ipu
        if by is None:
            if ipu == 0 and self._num_ipus == 1:
                return self.notAlwaysLiveMemory
            raise CorruptReport("This profile has no per-IPU liveness")
        return _Obj(bytes=int(by[ipu, self.index]))


class Program(_Obj):
    """A program node. ``type`` (a :class:`Program.Type` name), ``name``, ``children``, ``id``;
    lowered steps have ``step`` (program step index), ``estimatedCyclesByTile``, ``cyclesByIpu``
    (predicted cycles per IPU, dict category -> array) and, for OnTileExecute, ``computeset``.
    ``accept(visitor)`` calls ``visitor.visit<Type>(self)``."""

    class Type:
        OnTileExecute = "OnTileExecute"
        DoExchange = "DoExchange"
        GlobalExchange = "GlobalExchange"
        StreamCopyBegin = "StreamCopyBegin"
        StreamCopyMid = "StreamCopyMid"
        StreamCopyEnd = "StreamCopyEnd"
        Sync = "Sync"
        Sequence = "Sequence"
        Repeat = "Repeat"
        RepeatWhileTrue = "RepeatWhileTrue"
        RepeatWhileFalse = "RepeatWhileFalse"
        If = "If"
        Switch = "Switch"
        Branch = "Branch"
        HostFunction = "HostFunction"
        PrintTensor = "PrintTensor"
        Abort = "Abort"

    @cached_property
    @_guarded
    def estimatedCyclesByTile(self):  # noqa: N802
        """Predicted cycles of this lowered step on each tile (float32 array, built on access)."""
        comp, step = self.__dict__.get("_comp"), self.__dict__.get("step")
        if comp is None or step is None:
            raise AttributeError(f"A {self.type} program has no estimatedCyclesByTile")
        return comp._step_tile_cycles(step)

    def accept(self, visitor):
        fn = getattr(visitor, f"visit{self.type}", None)
        if fn is None:
            fn = getattr(visitor, "visitProgram", None)
        if fn is not None:
            fn(self)


class ProgramVisitor:
    """``pva.ProgramVisitor``: subclass and define ``visitOnTileExecute(program)``,
    ``visitDoExchange``, ``visitStreamCopyMid``, ``visitSync``, ``visitSequence`` ... (one per
    :class:`Program.Type`); ``visitProgram`` catches the types a subclass does not define."""

    def __init__(self):
        pass


class ExecutionStepVisitor:
    """``pva.ExecutionStepVisitor``: subclass and define ``visitStep(step)``; ``run.accept(v)``
    or ``report.execution.accept(v)`` calls it for each execution step in order."""

    def __init__(self):
        pass

    def visitStep(self, step):  # noqa: N802
        pass


class CycleRange(_Obj):
    """``min`` and ``max`` of a cycle figure over the tiles of an IPU."""


class StepIpu(_Obj):
    """``step.ipus[i]``: ``cycles`` (predicted cycles the step took on IPU i), ``activeCycles``
    (``cyclesFrom`` / ``cyclesTo``, each a :class:`CycleRange`), ``cyclesByCategory``."""


class ExecutionStep(_Obj):
    """One executed program step: ``program``, ``cyclesFrom`` / ``cyclesTo`` (predicted cycles
    since the start of the run), ``cycles``, ``ipus`` (per IPU) and ``cyclesByTile``."""


class Run(_Obj):
    """``execution.runs[i]``: ``program`` (engine program index), ``name``, ``cycles`` (max over
    IPUs), ``cyclesByIpu`` (array), ``hostSeconds`` (host wall time), ``steps``, ``programCounts``
    (executions of each program step)."""

    def accept(self, visitor):
        for s in self.steps:
            visitor.visitStep(s)


# ----------------------------------------------------------------------------------------------
# the report
# ----------------------------------------------------------------------------------------------
class Report:
    """``pva.Report``: ``poplarVersion``, ``compilation``, ``execution`` of one profile."""

    def __init__(self, path: str):
        self.path = str(path)
        self._data, self._arrays = read_profile(self.path)
        meta = self._data["meta"]
        self.formatVersion = int(meta["format_version"])
        self.openipuVersion = meta.get("openipu_version", "")
        self.compileHostSeconds = float(meta.get("compile_host_seconds", "nan"))
        major, minor, point = (int(x) for x in re.match(r"(\d+)\.(\d+)\.(\d+)",
                                                        meta.get("poplar_version", "0.0.0")).groups())
        self.poplarVersion = Version(major=major, minor=minor, point=point, packageHash="openipu",
                                     string=f"{major}.{minor}.{point} (openipu {self.openipuVersion})")
        self._cat_by_pva = {CATEGORY_NAMES.get(name, name): self._arrays[arr]
                            for _, name, arr in self._data["memory_categories"]}
        self.compilation = Compilation(self)
        self.execution = Execution(self)
        self.runOptions = read_run_options(os.path.dirname(self.path))

    def __repr__(self):
        return f"pva.Report('{self.path}')"


class Compilation:
    """``report.compilation``: target, graph, tiles, ipus, memory, variables, vertex types,
    compute sets, program trees and liveness. openipu extensions hold the numpy arrays:
    ``memoryByTile`` (bytes per tile), ``memoryByCategory`` ({Poplar category name: bytes per
    tile}), ``livenessBytes`` (not-always-live bytes summed over tiles, per program step)."""

    def __init__(self, report: Report):
        self._r = report
        t = report._data["target"]
        self.target = Target(numTiles=int(t["numTiles"]), numIPUs=int(t["numIPUs"]), tilesPerIpu=int(t["tilesPerIPU"]),
                             bytesPerTile=int(t["bytesPerTile"]), clockFrequency=float(t["clockHz"]),
                             numReplicas=int(t["replicationFactor"]), type=t["type"], arch=t["arch"],
                             version=t["version"], numWorkerContexts=int(t.get("numWorkerContexts", 6)))
        g = report._data["graph"]
        self.graph = GraphInfo(numVertices=int(g["numVertices"]), numEdges=int(g["numEdges"]),
                               numVariables=int(g["numVariables"]), numComputeSets=int(g["numComputeSets"]),
                               numProgramSteps=int(g.get("numProgramSteps", 0)))
        a = report._arrays
        self.memoryByTile = a["memory/total"]
        self.memoryByCategory = {name: a[arr] for _, name, arr in report._data["memory_categories"]}
        self.alwaysLiveBytesByTile = a.get("memory/alwaysLiveVariables")
        self.notAlwaysLiveBytesByTile = a.get("memory/notAlwaysLivePeak")
        self.livenessBytes = a["liveness/notAlwaysLive"]
        self.outOfMemoryTiles = a.get("memory/outOfMemoryTiles", np.zeros(0, np.int64))

    # -- memory -------------------------------------------------------------------------------
    @cached_property
    @_guarded
    def tiles(self) -> list:
        tpi = self.target.tilesPerIpu
        al, nal = self.alwaysLiveBytesByTile, self.notAlwaysLiveBytesByTile
        out = []
        for t, b in enumerate(self.memoryByTile.tolist()):
            mem = TileMemory(total=MemorySize(includingGaps=b, excludingGaps=b),
                             alwaysLiveBytes=int(al[t]) if al is not None else 0,
                             notAlwaysLiveBytes=int(nal[t]) if nal is not None else 0,
                             category=_Categories(self._r, t))
            out.append(Tile(number=t, tileInIpu=t % tpi, ipu=t // tpi, memory=mem))
        return out

    @cached_property
    @_guarded
    def ipus(self) -> list:
        tpi = self.target.tilesPerIpu
        return [Ipu(id=i, tiles=self.tiles[i * tpi:(i + 1) * tpi]) for i in range(self.target.numIPUs)]

    @property
    def totalMemory(self) -> int:  # noqa: N802
        """Bytes over all tiles (openipu extension)."""
        return int(self.memoryByTile.sum())

    def worstTile(self) -> tuple[int, int]:  # noqa: N802
        """``(tile, bytes)`` of the tile using most memory (openipu extension)."""
        t = int(np.argmax(self.memoryByTile))
        return t, int(self.memoryByTile[t])

    # -- graph objects --------------------------------------------------------------------------
    @cached_property
    @_guarded
    def variables(self) -> list:
        return [Variable(id=i, name=n, type=ty, shape=tuple(int(x) for x in sh.split(",") if x), size=int(b),
                         numTiles=int(nt), constant=bool(c), alwaysLive=None if al is None else bool(al))
                for i, n, ty, sh, b, nt, c, al in self._r._data["variables"]]

    @cached_property
    @_guarded
    def vertexTypes(self) -> list:  # noqa: N802
        return [VertexType(id=i, name=n, count=int(c), stateBytes=float(sb), codeBytes=float(cb), cycles=float(cy))
                for i, n, c, sb, cb, cy in self._r._data["vertex_types"]]

    @cached_property
    @_guarded
    def _tile_compute(self) -> dict:
        return {n: a for n, a in self._r._arrays.items() if n.startswith("steps/tileCompute/")}

    @cached_property
    @_guarded
    def computeSets(self) -> list:  # noqa: N802
        vt = {v.id: v for v in self.vertexTypes}
        per: dict = {}
        for cs, tid, n in self._r._data["compute_set_vertices"]:
            per.setdefault(cs, []).append(Vertex(type=vt[tid], count=int(n)))
        est: dict = {}
        for idx, _, _, cs, _, key in self._r._data["steps"]:
            if cs is not None and key is not None:
                est.setdefault(cs, self._tile_compute[key])
        zeros = np.zeros(self.target.numTiles, np.float32)
        return [ComputeSet(id=i, name=n, vertices=per.get(i, []), numVertices=int(nv), numTiles=int(nt),
                           estimatedCyclesByTile=est.get(i, zeros))
                for i, n, nv, nt in self._r._data["compute_sets"]]

    def stepCycles(self) -> dict:  # noqa: N802
        """Predicted cycles per program step and IPU: {category: float array [steps, ipus]}
        (categories compute, exchange, global_exchange, host_exchange, sync). openipu extension."""
        return {c: self._r._arrays[f"steps/cycles/{c}"] for c in _EXEC_CATEGORIES}

    @cached_property
    @_guarded
    def _step_total(self) -> np.ndarray:
        return sum(self.stepCycles().values())

    def _step_tile_cycles(self, idx: int) -> np.ndarray:
        """Predicted cycles of program step ``idx`` on each tile: the tile's own compute cycles
        plus its IPU's exchange and sync cycles in that step (every tile of a BSP step waits for
        them)."""
        key = self._r._data["steps"][idx][5]
        tpi = self.target.tilesPerIpu
        other = np.repeat(self._step_total[idx] - self.stepCycles()["compute"][idx], tpi)
        if key is None:
            return np.repeat(self._step_total[idx], tpi).astype(np.float32)
        return (self._tile_compute[key] + other).astype(np.float32)

    # -- programs -------------------------------------------------------------------------------
    @cached_property
    @_guarded
    def _program_nodes(self) -> list:
        cs_by_id = {c.id: c for c in self.computeSets}
        steps = self._r._data["steps"]
        cyc = self.stepCycles()
        nodes = []
        for pid, parent, pos, ty, name, step, rep, root in self._r._data["programs"]:
            p = Program(id=pid, type=ty, name=name or "", children=[], step=step, repeatCount=rep, root=root,
                        _parent=parent, _comp=self)
            if step is not None:
                srow = steps[step]
                p.computeset = cs_by_id.get(srow[3]) if srow[3] is not None else None
                p.cyclesByIpu = {c: cyc[c][step] for c in _EXEC_CATEGORIES}
                p.flops = srow[4]
            nodes.append(p)
        for p in nodes:
            if p._parent is not None and p._parent >= 0:
                nodes[p._parent].children.append(p)
        return nodes

    @property
    def programs(self) -> list:
        """Every program node (containers and lowered steps), in tree order."""
        return self._program_nodes

    @property
    def controlPrograms(self) -> list:  # noqa: N802
        """The root program of each engine program."""
        return [p for p in self._program_nodes if p._parent is None or p._parent < 0]

    @cached_property
    @_guarded
    def _step_programs(self) -> dict:
        out: dict = {}
        for p in self._program_nodes:
            if p.step is not None:
                out.setdefault(p.step, p)
        return out

    def programOfStep(self, idx: int) -> Program:  # noqa: N802
        """The program node of program step ``idx`` (openipu extension)."""
        p = self._step_programs.get(idx)
        if p is None:
            row = self._r._data["steps"][idx]
            p = Program(id=-1, type=row[1], name=row[2] or "", children=[], step=idx, repeatCount=None, root=-1,
                        _comp=self)
        return p

    # -- liveness -------------------------------------------------------------------------------
    @cached_property
    @_guarded
    def livenessProgramSteps(self) -> list:  # noqa: N802
        by_ipu = self._r._arrays.get("liveness/notAlwaysLiveByIpu")
        n = len(self._r._data["steps"])
        return [LivenessStep(index=i, program=self.programOfStep(i) if i < n else None,
                             notAlwaysLiveMemory=_Obj(bytes=int(b)), _by_ipu=by_ipu, _num_ipus=self.target.numIPUs)
                for i, b in enumerate(self.livenessBytes.tolist())]

    @_guarded
    def livenessPeakVariables(self) -> list | None:  # noqa: N802
        """The not-always-live variables live at the liveness peak (:meth:`livenessPeak`), largest
        first: those whose def-use segments cover that program step (a reused block's variables
        counted at its first occurrence). The always-live variables (``alwaysLive``) are live there
        too, as at every step. None when the profile does not record them (openipu extension)."""
        ids = self._r._arrays.get("liveness/peakVariables")
        if ids is None:
            return None
        by_id = {v.id: v for v in self.variables}
        return sorted((by_id[i] for i in ids.tolist()), key=lambda v: (-v.size, v.name))

    def livenessPeak(self) -> tuple[int, int]:  # noqa: N802
        """``(program step, bytes)`` where the not-always-live bytes over all tiles peak (openipu
        extension)."""
        i = int(np.argmax(self.livenessBytes)) if self.livenessBytes.size else 0
        return i, int(self.livenessBytes[i]) if self.livenessBytes.size else 0


class Execution:
    """``report.execution``: ``runs`` (one per engine run), ``steps`` (every run's steps in
    order), ``totalCycles.total`` (predicted cycles of all runs, max over IPUs per run)."""

    def __init__(self, report: Report):
        self._r = report
        self._rows = report._data["runs"]
        total = sum(float(report._arrays[f"runs/{i}/cyclesPerIpu"].max()) for i, *_ in self._rows)
        self.totalCycles = _Obj(total=int(round(total)))

    @cached_property
    @_guarded
    def runs(self) -> list:
        out = []
        comp = self._r.compilation
        for i, prog, name, host, dry in self._rows:
            a = self._r._arrays
            out.append(_LazyRun(comp, a, i, program=int(prog), name=name, hostSeconds=float(host), dry=bool(dry),
                                cyclesByIpu=a[f"runs/{i}/cyclesPerIpu"],
                                cycles=int(round(float(a[f"runs/{i}/cyclesPerIpu"].max()))),
                                programCounts=a[f"runs/{i}/counts"]))
        return out

    @property
    def steps(self) -> list:
        return [s for r in self.runs for s in r.steps]

    def accept(self, visitor):
        for r in self.runs:
            r.accept(visitor)


class _LazyRun(Run):
    def __init__(self, comp, arrays, i, **kw):
        super().__init__(**kw)
        self._comp, self._a, self._i = comp, arrays, i

    @cached_property
    @_guarded
    def steps(self) -> list:
        comp, a, i = self._comp, self._a, self._i
        idx = a[f"runs/{i}/trace/step"]
        end = a[f"runs/{i}/trace/end"]
        start = np.concatenate(([0.0], end[:-1])) if end.size else end
        cyc = comp.stepCycles()
        total = comp._step_total
        out = []
        peak = total.max(axis=1).round().astype(np.int64).tolist() if total.size else []
        for k, (s, e0, e1) in enumerate(zip(idx.tolist(), start.tolist(), end.tolist())):
            out.append(_LazyStep(comp, s, index=k, programStep=s, cyclesFrom=e0, cyclesTo=e1, cycles=peak[s]))
        return out


class _LazyStep(ExecutionStep):
    def __init__(self, comp, s, **kw):
        super().__init__(**kw)
        self._comp, self._s = comp, s

    @property
    def program(self):
        return self._comp.programOfStep(self._s)

    @cached_property
    @_guarded
    def ipus(self) -> list:
        """Per IPU: :class:`StepIpu` (built on access)."""
        comp, s, e0 = self._comp, self._s, self.cyclesFrom
        cyc = comp.stepCycles()
        per = comp._step_total[s]
        return [StepIpu(ipu=j, cycles=int(round(float(per[j]))),
                        activeCycles=_Obj(cyclesFrom=CycleRange(min=e0, max=e0),
                                          cyclesTo=CycleRange(min=e0 + float(per[j]), max=e0 + float(per[j]))),
                        cyclesByCategory={c: float(cyc[c][s][j]) for c in _EXEC_CATEGORIES})
                for j in range(per.size)]

    @property
    def cyclesByTile(self):
        return self._comp._step_tile_cycles(self._s)


#: ``run.json`` (written by ``openipu run --report`` beside ``profile.pop``): its keys and types.
RUN_OPTION_TYPES = {"model": str, "ipu": str, "num_ipus": int, "batch_size": int, "batches_per_step": int,
                    "precision": str, "offline": bool, "available_memory_proportion": (float, int, type(None))}
_RUN_JSON_MAX_BYTES = 64 << 10


def read_run_options(directory: str) -> dict:
    """The options ``openipu run`` recorded in ``directory/run.json`` (batch size, batches per
    step, precision, target, offline ...), as ``{key: value}`` with only the keys of
    :data:`RUN_OPTION_TYPES` whose values have those types; ``{}`` when there is no such file or
    it is not a small JSON object (the file is untrusted data: read as JSON, at most 64 KiB,
    nothing in it is executed). Profiles written by the sessions have no ``run.json``."""
    import json
    p = os.path.join(directory, "run.json")
    try:
        if not os.path.isfile(p) or os.path.getsize(p) > _RUN_JSON_MAX_BYTES:
            return {}
        with open(p, "rb") as f:
            d = json.loads(f.read(_RUN_JSON_MAX_BYTES))
    except (OSError, ValueError, RecursionError):
        return {}
    if not isinstance(d, dict):
        return {}
    out = {}
    for k, ty in RUN_OPTION_TYPES.items():
        v = d.get(k)
        if k in d and isinstance(v, ty) and not (ty is int and isinstance(v, bool)):
            out[k] = v[:500] if isinstance(v, str) else v
    for k in ("batch_size", "batches_per_step", "num_ipus"):
        if k in out and not 1 <= out[k] <= 1 << 40:
            del out[k]
    return out


def openReport(path, *_args) -> Report:  # noqa: N802
    """``pva.openReport(path)``: read a ``profile.pop`` (or the ``profile.pop`` inside a directory).

    Raises ``FileNotFoundError`` (no such file), :class:`NotAReport` (not a profile),
    :class:`UnsupportedFormat` (an older or newer format version), :class:`CorruptReport`
    (truncated, damaged, over the reader's size limits, or holding views, triggers or virtual
    tables), each with a one-line message. The file is untrusted: nothing in it is executed, no
    file is created or changed, and each SQL query is stopped after
    ``reader.QUERY_TIME_LIMIT_SECONDS`` (see :mod:`openipu.popvision.reader`).
    """
    path = os.fspath(path)
    if os.path.isdir(path):
        path = os.path.join(path, "profile.pop")
    try:
        return Report(path)
    except (LookupError, ValueError, TypeError, ArithmeticError, MemoryError, RecursionError) as e:
        # defence in depth: read_profile checked the file, so this is a damage it did not foresee
        raise CorruptReport(f"Profile '{path}' is damaged ({type(e).__name__}: {_q(str(e), 200)})") from None
