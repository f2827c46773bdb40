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


def write_profile(directory: str, graph, compiled, engine=None) -> str:
    """Write ``profile.json`` under ``directory``; return its path (Poplar writes ``profile.pop``)."""
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, "profile.json")
    with open(path, "w") as f:
        json.dump(profile_dict(graph, compiled, engine), f)
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
