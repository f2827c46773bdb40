"""Poplar's profile: ``printProfileSummary`` text and the profile files ``autoReport`` writes.

The summary mirrors Poplar's layout (Target / Graph / Memory Usage / Execution blocks, comma
thousands separators, ``kB``/``MB`` computed with 1024, "(x.x% of total)"). Every cycle figure
is a *prediction for the IPU*; the host wall time appears on its own, labelled line.
"""

from __future__ import annotations

import json
import math
import os

import numpy as np

from openipu import __version__
from openipu.poplar.cost import CATEGORIES


def _kb(b):
    return f"{b / 1024:,.1f} kB"


def _mb(b):
    return f"{b / 1024 / 1024:,.1f} MB"


def execution_totals(engine):
    """Aggregate the runs of ``engine``: total cycles (max over IPUs, summed over runs), per-IPU
    category durations and tile-average figures, FLOPs and cycles by vertex type."""
    comp = engine._compiled.compiler
    spec = engine._spec
    counts = engine._counts.astype(np.float64)
    total = float(sum(r["cycles_per_ipu"].max() for r in engine._runs))
    tile_avg = {c: 0.0 for c in CATEGORIES}
    tile_avg["compute_excl"] = 0.0
    by_type: dict = {}
    flops = 0.0
    for step, n in zip(comp.steps, counts):
        if n == 0:
            continue
        for c in tile_avg:
            tile_avg[c] += n * float(step.cost.tile_sum[c].sum()) / spec.num_tiles
        flops += n * step.cost.flops
        for k, (inst, cyc) in step.cost.by_vertex_type.items():
            i0, c0 = by_type.get(k, (0, 0.0))
            by_type[k] = (max(i0, inst), c0 + n * cyc)
    return total, tile_avg, by_type, flops


def profile_summary(graph, compiled, engine=None, options=None) -> str:
    """The text of ``Engine.printProfileSummary``."""
    options = options or {}
    spec = graph._top._target.spec
    reps = graph._state.replication_factor
    mem = compiled.memory
    L = []
    w = L.append
    w("Target:")
    rows = [("Number of IPUs:", f"{spec.num_ipus:,}"), ("Tiles per IPU:", f"{spec.tiles_per_ipu:,}"),
            ("Total Tiles:", f"{spec.num_tiles:,}"), ("Memory Per-Tile:", _kb(spec.bytes_per_tile)),
            ("Total Memory:", _mb(spec.bytes_per_tile * spec.num_tiles)),
            ("Clock Speed (approx):", f"{spec.clock_hz / 1e6:,.1f} MHz"),
            ("Number of Replicas:", f"{reps:,}"), ("IPUs per Replica:", f"{max(1, spec.num_ipus // reps):,}"),
            ("Tiles per Replica:", f"{spec.num_tiles // reps:,}"),
            ("Memory per Replica:", _mb(spec.bytes_per_tile * spec.num_tiles // reps))]
    for k, v in rows:
        w(f"  {k:<24}{v}")
    w("")
    w("Graph:")
    st = graph._state
    for k, v in (("Number of vertices:", graph.getNumVertices()), ("Number of edges:", mem.num_edges),
                 ("Number of variables:", mem.num_variables), ("Number of compute sets:", len(st.compute_sets))):
        w(f"  {k:<24}{v:>12,}")
    w("")
    w("Memory Usage:")
    w("  Total:")
    total = float(mem.total.sum())
    w(f"    {'Including Gaps:':<20}{total:>14,.0f} B")
    w("    Excluding Gaps:")
    w("      By Memory Region:")
    over = float(np.maximum(mem.total - spec.bytes_per_tile, 0).sum())
    for k, v in (("Non-interleaved:", total - over), ("Interleaved:", 0.0), ("Overflowed:", over)):
        w(f"        {k:<16}{v:>14,.0f} B")
    w("      By Data Type:")
    for k in ("Variables", "Constants", "Stack", "Vertex Instances", "Control Code", "Vertex Code",
              "Internal Exchange Code"):
        v = float(mem.categories[k].sum())
        w(f"          {k + ':':<30}{v:>14,.0f} B")
    vs = float(mem.categories["Vertex Instances"].sum())
    w(f"        Vertex Data ({vs:,.0f}B):")
    w("          By Type:")
    if mem.vertex_state_by_type:
        width = max(len(n) for n in mem.vertex_state_by_type) + 4
        for n, b in sorted(mem.vertex_state_by_type.items(), key=lambda kv: (-kv[1], kv[0])):
            w(f"            {n:<{width}}{b:>14,.0f} B")
    w("")
    w("  By Tile (Excluding Gaps):")
    w("    Range (KB) Histogram (Excluding Gaps)               Count (tiles)")
    kb = mem.total / 1024
    top = max(float(kb.max()), 1.0)
    step = max(1, 2 ** math.ceil(math.log2(max(top / 16, 1))))
    lo_b, hi_b = int(kb.min() // step), int(kb.max() // step)
    counts = np.bincount((kb // step).astype(np.int64) - lo_b, minlength=hi_b - lo_b + 1)
    digits = len(str((hi_b + 1) * step))
    cmax = counts.max()
    for i, c in enumerate(counts):
        lo = (lo_b + i) * step
        bar = "*" * (0 if c == 0 else max(1, math.ceil(c * 40 / cmax)))
        w(f"    {f'{lo:>{digits}} - {lo + step:>{digits}}':>10} {bar:<40}{c:>7,}")
    w("")
    t_max = int(np.argmax(mem.total))
    for label in ("Including Gaps", "Excluding Gaps"):
        b = mem.total[t_max]
        w(f"    Maximum ({label}): {b:,.0f} ({b / 1024:.1f} K) on tile {t_max}")
    w(f"    {mem.out_of_memory_tiles.size} tile(s) out of memory")
    if engine is not None and engine._runs:
        w("")
        w("Execution:")
        w("")
        w("Programs executed:")
        w("")
        for r in engine._runs[:10]:
            w(f"{r['name'] or '<anonymous>'}.")
        w("")
        total_c, avg, by_type, flops = execution_totals(engine)
        us = total_c / spec.clock_hz * 1e6

        def line(label, value):
            pct = 100.0 * value / total_c if total_c else 0.0
            w(f"  {label:<54}{value:,.1f} ({pct:.1f}% of total)")
        w(f"  {'Total cycles:':<54}{total_c:,.0f} (approx {us:,.1f} microseconds)")
        line("Tile average compute cycles (including idle threads):", avg["compute"])
        if spec.is_ipu_model:
            line("Tile average compute cycles (excluding idle threads):", avg["compute_excl"])
        line("Tile average IPU exchange cycles:", avg["exchange"])
        line("Tile average global exchange cycles:", avg["global_exchange"])
        line("Tile average host exchange cycles:", avg["host_exchange"])
        line("Tile average sync cycles:", avg["sync"])
        if by_type:
            w("")
            w("  Cycles by vertex type:")
            width = max(len(n) for n in by_type)
            for n, (inst, cyc) in sorted(by_type.items(), key=lambda kv: (-kv[1][1], kv[0])):
                w(f"    {n:<{width}}{f'({inst} instances):':>24}{cyc:>13,.0f}")
        if options.get("showExecutionSteps", "false") in ("true", True):
            w("")
            w("  Execution steps (predicted cycles per execution, first IPU):")
            comp = engine._compiled.compiler
            for s, n in zip(comp.steps, engine._counts):
                if n:
                    w(f"    {s.idx:>5} {s.kind:<14} {s.name[:40]:<40} x{int(n):<6} {float(s.total.max()):>12,.0f}")
        w("")
        w(f"  (openipu: predicted IPU figures above; host wall time to simulate: {engine.host_seconds:.3f} s)")
    return "\n".join(L) + "\n"


def profile_dict(graph, compiled, engine=None) -> dict:
    """The profile as plain data: target, graph, memory per tile by category, liveness per
    program step, program steps with predicted cycles, and the execution trace."""
    spec = graph._top._target.spec
    mem = compiled.memory
    comp = compiled.compiler
    d = {
        "openipuVersion": __version__,
        "target": {"version": spec.version, "arch": spec.arch, "numIPUs": spec.num_ipus,
                   "tilesPerIPU": spec.tiles_per_ipu, "numTiles": spec.num_tiles,
                   "bytesPerTile": spec.bytes_per_tile, "clockHz": spec.clock_hz,
                   "replicationFactor": graph._state.replication_factor, "type": spec.target_type},
        "graph": {"numVertices": graph.getNumVertices(), "numEdges": mem.num_edges,
                  "numVariables": mem.num_variables, "numComputeSets": len(graph._state.compute_sets)},
        "memory": {"bytesPerTile": mem.bytes_per_tile,
                   "byCategory": {k: v.astype(np.int64).tolist() for k, v in mem.categories.items()},
                   "total": mem.total.astype(np.int64).tolist(),
                   "alwaysLive": mem.always_live_variables.astype(np.int64).tolist(),
                   "notAlwaysLivePeak": mem.not_always_live_peak.astype(np.int64).tolist(),
                   "outOfMemoryTiles": mem.out_of_memory_tiles.tolist()},
        "liveness": mem.liveness.astype(np.int64).tolist(),
        "steps": [{"index": s.idx, "type": s.kind, "name": s.name,
                   "cyclesPerIpu": {c: s.cost.duration[c].tolist() for c in CATEGORIES},
                   "flops": s.cost.flops} for s in comp.steps],
        "compileHostSeconds": compiled.compile_seconds,
    }
    if engine is not None and engine._runs:
        total, avg, by_type, flops = execution_totals(engine)
        d["execution"] = {
            "totalCycles": total, "tileAverage": avg, "flops": flops,
            "cyclesByVertexType": {k: {"instances": i, "cycles": c} for k, (i, c) in by_type.items()},
            "runs": [{"program": r["program"], "name": r["name"], "cyclesPerIpu": r["cycles_per_ipu"].tolist(),
                      "hostSeconds": r["host_seconds"],
                      "trace": [[int(i), float(c)] for i, c in (r["trace"] or [])[:10000]]} for r in engine._runs],
        }
    return d


#: Version of the ``profile.pop`` format :func:`write_profile` writes (docs/profile-format.md).
PROFILE_FORMAT_VERSION = 1
#: The ``meta.magic`` value that marks an openipu profile.
PROFILE_MAGIC = "openipu-profile"
#: The Poplar SDK version whose API openipu implements (``report.poplarVersion``).
POPLAR_API_VERSION = (3, 4, 0)

_SCHEMA = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE arrays (name TEXT PRIMARY KEY, data BLOB NOT NULL);
CREATE TABLE target (key TEXT PRIMARY KEY, value);
CREATE TABLE graph (key TEXT PRIMARY KEY, value INTEGER);
CREATE TABLE memory_categories (position INTEGER PRIMARY KEY, name TEXT NOT NULL, array TEXT NOT NULL);
CREATE TABLE variables (id INTEGER PRIMARY KEY, name TEXT, type TEXT, shape TEXT, bytes INTEGER,
                        num_tiles INTEGER, constant INTEGER, always_live INTEGER);
CREATE TABLE vertex_types (id INTEGER PRIMARY KEY, name TEXT, count INTEGER, state_bytes REAL,
                           code_bytes REAL, cycles REAL);
CREATE TABLE compute_sets (id INTEGER PRIMARY KEY, name TEXT, num_vertices INTEGER, num_tiles INTEGER);
CREATE TABLE compute_set_vertices (compute_set INTEGER, vertex_type INTEGER, count INTEGER);
CREATE TABLE steps (idx INTEGER PRIMARY KEY, type TEXT, name TEXT, compute_set INTEGER, flops REAL,
                    tile_cycles TEXT);
CREATE TABLE programs (id INTEGER PRIMARY KEY, parent INTEGER, position INTEGER, type TEXT, name TEXT,
                       step INTEGER, repeat_count INTEGER, root INTEGER);
CREATE TABLE runs (id INTEGER PRIMARY KEY, program INTEGER, name TEXT, host_seconds REAL, dry INTEGER);
"""


def _npy(a) -> bytes:
    """``a`` as the bytes of a ``.npy`` file (numpy's own format; no pickled objects)."""
    import io
    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(a), allow_pickle=False)
    return buf.getvalue()


def _pva_type(step) -> str:
    """libpva's program type of a lowered step: OnTileExecute, DoExchange (a copy that exchanges),
    StreamCopyMid, GlobalExchange, Sync, ..."""
    name = type(step).__name__
    if name == "_CopyStep":
        return "DoExchange" if float(step.cost.duration["exchange"].max()) > 0 else "OnTileExecute"
    if step.kind == "StreamCopy":
        return "StreamCopyMid"
    if step.kind == "Step":
        return "Sync" if step.name.startswith("Sync") else (step.name or "Step")
    return step.kind


def _program_rows(roots) -> list:
    """Rows ``(id, parent, position, type, name, step, repeat_count, root)`` of the program trees of
    the compiled ``roots`` (one per engine program); ``step`` is the program step a leaf runs."""
    from openipu.poplar import executable as E
    rows: list = []
    stack = [(r, -1, i, i) for i, r in reversed(list(enumerate(roots)))]
    while stack:
        node, parent, pos, root = stack.pop()
        nid = len(rows)
        children: list = []
        if isinstance(node, E._Leaf):
            st = node.step
            rows.append((nid, parent, pos, _pva_type(st), st.name, int(st.idx), None, root))
        elif isinstance(node, E._Step):          # a branch's predicate read
            rows.append((nid, parent, pos, _pva_type(node), node.name, int(node.idx), None, root))
        elif isinstance(node, E._Seq):
            name = getattr(node, "name", "")
            if parent < 0:      # an engine program: its index, and the name its Sequence was given
                name = f"program {root}" + (f": {name}" if name else "")
            rows.append((nid, parent, pos, "Sequence", name, None, None, root))
            children = node.nodes
        elif isinstance(node, E._Repeat):
            rows.append((nid, parent, pos, "Repeat", getattr(node, "name", ""), None, int(node.count), root))
            children = [node.body]
        elif isinstance(node, E._While):
            rows.append((nid, parent, pos, "RepeatWhileTrue" if not node.until else "RepeatWhileFalse",
                         getattr(node, "name", ""), None, None, root))
            children = [node.cond, node.branch, node.body]
        elif isinstance(node, E._If):
            rows.append((nid, parent, pos, "If", getattr(node, "name", ""), None, None, root))
            children = [node.branch, node.then, node.other]
        elif isinstance(node, E._Switch):
            rows.append((nid, parent, pos, "Switch", getattr(node, "name", ""), None, None, root))
            children = [node.branch] + list(node.cases.values()) + [node.default]
        else:
            rows.append((nid, parent, pos, type(node).__name__.lstrip("_"), "", None, None, root))
        stack.extend((c, nid, k, root) for k, c in reversed(list(enumerate(children))))
    return rows


def _profile_tables(graph, compiled, engine):
    """The tables of ``profile.pop`` as ``{table: rows}`` plus ``{array name: ndarray}``."""
    spec = graph._top._target.spec
    st = graph._state
    mem = compiled.memory
    comp = compiled.compiler
    arrays: dict = {}
    tables: dict = {}
    tables["target"] = [("version", spec.version), ("arch", spec.arch), ("type", spec.target_type),
                        ("numIPUs", spec.num_ipus), ("tilesPerIPU", spec.tiles_per_ipu),
                        ("numTiles", spec.num_tiles), ("bytesPerTile", spec.bytes_per_tile),
                        ("clockHz", float(spec.clock_hz)), ("replicationFactor", st.replication_factor),
                        ("numWorkerContexts", spec.num_worker_contexts)]
    tables["graph"] = [("numVertices", graph.getNumVertices()), ("numEdges", mem.num_edges),
                       ("numVariables", mem.num_variables), ("numComputeSets", len(st.compute_sets)),
                       ("numProgramSteps", len(comp.steps))]
    cats = []
    for i, (k, v) in enumerate(mem.categories.items()):
        arrays[f"memory/category/{k}"] = np.asarray(v, np.float64).astype(np.int64)
        cats.append((i, k, f"memory/category/{k}"))
    tables["memory_categories"] = cats
    arrays["memory/total"] = mem.total.astype(np.int64)
    arrays["memory/alwaysLiveVariables"] = mem.always_live_variables.astype(np.int64)
    arrays["memory/notAlwaysLivePeak"] = mem.not_always_live_peak.astype(np.int64)
    arrays["memory/outOfMemoryTiles"] = np.asarray(mem.out_of_memory_tiles, np.int64)
    arrays["liveness/notAlwaysLive"] = np.asarray(mem.liveness, np.float64).astype(np.int64)
    if getattr(mem, "liveness_by_ipu", None) is not None:
        arrays["liveness/notAlwaysLiveByIpu"] = np.asarray(mem.liveness_by_ipu, np.float64).astype(np.int64)

    nal = set(np.asarray(getattr(mem, "not_always_live_ids", None) if getattr(mem, "not_always_live_ids", None)
                         is not None else [], np.int64).tolist())
    if getattr(mem, "nal_segments", None) is not None and len(comp.steps):
        peak = int(np.argmax(mem.liveness)) if np.size(mem.liveness) else 0
        arrays["liveness/peakVariables"] = mem.live_at_step(min(peak, len(comp.steps) - 1)).astype(np.int64)
    var_rows = []
    for v in st.variables:
        if v._pending:
            v._flush()
        ti = v._ti
        ntiles = int(np.unique(ti[ti >= 0]).size) if ti.size else 0
        var_rows.append((v.id, v.name, v.type.name, ",".join(str(d) for d in v.shape), int(v.nbytes), ntiles,
                         int(bool(v.constant)), int(not v.constant and v.id not in nal)))
    tables["variables"] = var_rows

    vt_names: dict = {}
    cs_rows, csv_rows = [], []
    counts: dict = {}
    for cs in st.compute_sets:
        per: dict = {}
        tiles = []
        for g in cs.groups:
            per[g.type_name] = per.get(g.type_name, 0) + int(np.asarray(g.tiles).size)
            tiles.append(np.asarray(g.tiles, np.int64).reshape(-1))
        for vid in cs.user_vertices:
            per[st.v_type[vid]] = per.get(st.v_type[vid], 0) + 1
        if cs.user_vertices:
            tiles.append(np.array([st.v_tile[v] for v in cs.user_vertices], np.int64))
        ntiles = int(np.unique(np.concatenate(tiles)).size) if tiles else 0
        cs_rows.append((cs.id, cs.name, sum(per.values()), ntiles))
        for name, n in per.items():
            tid = vt_names.setdefault(name, len(vt_names))
            csv_rows.append((cs.id, tid, n))
            counts[name] = counts.get(name, 0) + n
    cycles_by_type: dict = {}
    if engine is not None and engine._runs:
        cycles_by_type = {k: c for k, (_, c) in execution_totals(engine)[2].items()}
    tables["vertex_types"] = [(i, n, counts.get(n, 0), float(comp.vertex_state_by_type.get(n, 0.0)),
                               float(comp.vertex_type_code.get(n, 0.0)), float(cycles_by_type.get(n, 0.0)))
                              for n, i in vt_names.items()]
    tables["compute_sets"] = cs_rows
    tables["compute_set_vertices"] = csv_rows

    n = len(comp.steps)
    ipus = spec.num_ipus
    for c in CATEGORIES:
        arrays[f"steps/cycles/{c}"] = (np.stack([s.cost.duration[c] for s in comp.steps]) if n
                                       else np.zeros((0, ipus))).astype(np.float64)
    step_rows = []
    seen: dict = {}
    for s in comp.steps:
        key = None
        tc = getattr(s.cost, "tile_compute", None)
        if tc is not None:
            key = seen.get(id(tc))
            if key is None:
                key = seen[id(tc)] = f"steps/tileCompute/{len(seen)}"
                arrays[key] = np.asarray(tc, np.float32)
        step_rows.append((s.idx, _pva_type(s), s.name, getattr(s, "cs_id", None), float(s.cost.flops), key))
    tables["steps"] = step_rows
    tables["programs"] = _program_rows(compiled.roots)

    run_rows = []
    if engine is not None:
        for i, r in enumerate(engine._runs):
            run_rows.append((i, int(r["program"]), r["name"] or "", float(r["host_seconds"]), int(bool(r.get("dry")))))
            arrays[f"runs/{i}/cyclesPerIpu"] = np.asarray(r["cycles_per_ipu"], np.float64)
            arrays[f"runs/{i}/counts"] = np.asarray(r["counts"], np.int64)
            tr = r["trace"] or []
            arrays[f"runs/{i}/trace/step"] = np.fromiter((t[0] for t in tr), np.int32, len(tr))
            arrays[f"runs/{i}/trace/end"] = np.fromiter((t[1] for t in tr), np.float64, len(tr))
    tables["runs"] = run_rows
    return tables, arrays


def write_profile(directory: str, graph, compiled, engine=None) -> str:
    """Write the profile (``profile.pop``, format in docs/profile-format.md) under ``directory``.

    An SQLite database (stdlib ``sqlite3``): tables for target, graph, variables, vertex types,
    compute sets, program steps, program trees and runs; per-tile and per-step numbers as ``.npy``
    BLOBs (``np.save``, no pickles) in ``arrays``. Written to a temporary file and renamed, so a
    reader never sees half a profile. Cycle figures are predicted IPU cycles; ``runs.host_seconds``
    is host wall time. Returns the path of ``profile.pop``.
    """
    import sqlite3
    import time as _time

    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, "profile.pop")
    tmp = f"{path}.tmp{os.getpid()}"
    if os.path.exists(tmp):
        os.remove(tmp)
    tables, arrays = _profile_tables(graph, compiled, engine)
    con = sqlite3.connect(tmp)
    try:
        con.executescript(_SCHEMA)
        meta = {"magic": PROFILE_MAGIC, "format_version": str(PROFILE_FORMAT_VERSION),
                "poplar_version": ".".join(map(str, POPLAR_API_VERSION)), "openipu_version": __version__,
                "created_unix": f"{_time.time():.3f}", "compile_host_seconds": f"{compiled.compile_seconds:.6f}"}
        con.executemany("INSERT INTO meta VALUES (?, ?)", meta.items())
        con.executemany("INSERT INTO arrays VALUES (?, ?)", ((k, _npy(v)) for k, v in arrays.items()))
        for name, rows in tables.items():
            if rows:
                q = ",".join("?" * len(rows[0]))
                con.executemany(f"INSERT INTO {name} VALUES ({q})", rows)
        con.commit()
    finally:
        con.close()
    os.replace(tmp, path)
    return path


def run_breakdown(engine, run: int = -1) -> dict:
    """Predicted IPU cycles of one run of ``engine`` (default: the last), split by category.

    Returns ``{"cycles": c, "seconds": s, "by_category": {category: cycles}, "flops": f}`` where
    ``cycles`` is the run's length on the slowest IPU (predicted IPU cycles, not host time),
    ``seconds`` = cycles / clock, and ``by_category`` sums each step's category durations on that
    IPU (compute, exchange, global_exchange, host_exchange, sync). Raises ``IndexError`` when the
    engine has no profiled run.
    """
    rec = engine._runs[run]
    comp = engine._compiled.compiler
    ipu = int(np.argmax(rec["cycles_per_ipu"]))
    by_cat = {c: 0.0 for c in CATEGORIES}
    flops = 0.0
    for step, n in zip(comp.steps, rec["counts"]):
        if n:
            for c in CATEGORIES:
                by_cat[c] += n * float(step.cost.duration[c][ipu])
            flops += n * step.cost.flops
    cycles = float(rec["cycles_per_ipu"].max())
    return {"cycles": cycles, "seconds": cycles / engine._spec.clock_hz, "by_category": by_cat, "flops": flops}
