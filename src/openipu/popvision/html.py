"""The Graph Analyser report: one self-contained HTML page of a profile (``openipu report``).

Views (each a ``<section>`` with a stable id): ``summary`` (target, memory, cycles, predicted
throughput), ``memory-heatmap`` (bytes per tile laid out per IPU), ``memory-histogram`` (with
the out-of-memory line at ``bytesPerTile``), ``memory-categories``, ``liveness`` (not-always-live
bytes per program step, peak marked, and the variables live at the peak), ``operations``
(predicted cycles and memory per ONNX op and PopLibs call), ``program-tree`` (named programs),
``execution-trace`` (compute, exchange, sync of each superstep on each IPU, zoomable; the hover
gives each bar's own duration), ``largest-variables``, ``largest-vertices``
(vertex types and compute sets) and, given a second profile, ``compare``.

Charts are plotly figures; plotly.js is inlined once, so the page works offline. Every cycle
figure is a predicted IPU figure.
"""

from __future__ import annotations

import html
import math

import numpy as np

#: At most this many execution steps are drawn in the trace (the first ones of the run).
MAX_TRACE_STEPS = 20_000
#: The program tree view shows at most this many levels (deeper nodes are summarised).
MAX_TREE_DEPTH = 64
_COLOURS = {"sync": "#9e9e9e", "exchange": "#ff9800", "global_exchange": "#e91e63", "host_exchange": "#9c27b0",
            "compute": "#2196f3"}
_LABELS = {"compute": "compute", "exchange": "exchange", "global_exchange": "IPU-Link exchange",
           "host_exchange": "host I/O", "sync": "sync"}


def _e(s) -> str:
    return html.escape(str(s), quote=True)


def _fig_html(fig, div_id: str) -> str:
    fig.update_layout(margin=dict(l=60, r=20, t=40, b=40), template="plotly_white")
    return fig.to_html(full_html=False, include_plotlyjs=False, div_id=div_id,
                       config={"displaylogo": False, "responsive": True})


def summary_figures(report) -> dict:
    """The headline numbers of a report, as the HTML shows them: ``total_memory`` (bytes over
    all tiles), ``worst_tile`` / ``worst_tile_bytes``, ``cycles_per_run`` (predicted cycles of the
    first run, max over IPUs; None without runs), ``liveness_peak`` / ``liveness_peak_step``
    (not-always-live bytes over tiles), ``biggest_compute_set`` (name of the compute set with
    the most predicted cycles on its busiest tile) and ``biggest_compute_set_cycles``."""
    c = report.compilation
    t, b = c.worstTile()
    step, peak = c.livenessPeak()
    runs = report.execution.runs
    css = [cs for cs in c.computeSets if cs.estimatedCyclesByTile.size]
    big = max(css, key=lambda cs: float(cs.estimatedCyclesByTile.max()), default=None)
    return {"total_memory": c.totalMemory, "worst_tile": t, "worst_tile_bytes": b,
            "cycles_per_run": runs[0].cycles if runs else None, "liveness_peak": peak, "liveness_peak_step": step,
            "biggest_compute_set": big.name if big else "", "biggest_compute_set_cycles":
            int(round(float(big.estimatedCyclesByTile.max()))) if big else 0}


def _run_rows(report) -> tuple[list, int | None]:
    """Summary rows of what the run was (batch, precision, mode) and the samples per run, None
    when the profile does not record it (a session's profile has no ``run.json``)."""
    o = report.runOptions
    runs = report.execution.runs
    dry = bool(runs) and runs[0].dry
    mode = ("offline prediction (nothing was run: no outputs, no host run time)" if dry or o.get("offline")
            else "run on the simulated IPU (IPU Model)" if runs else "compiled only (no run recorded)")
    rows = [("Mode", mode, "mode")]
    if "batch_size" in o:
        bps = o.get("batches_per_step", 1)
        rows.append(("Batch size", f"{o['batch_size']:,}" + (f" x {bps:,} batches per step" if bps > 1 else ""),
                     "batch-size"))
        samples = o["batch_size"] * bps
    else:
        rows.append(("Batch size", "not recorded (only `openipu run --report` records it)", "batch-size"))
        samples = None
    if "precision" in o:
        rows.append(("Precision", o["precision"], "precision"))
    else:       # a session's profile: what the graph's variables hold, by bytes
        by: dict = {}
        for v in report.compilation.variables:
            by[v.type] = by.get(v.type, 0) + v.size
        total = sum(by.values()) or 1
        mix = ", ".join(f"{t} {b / total:.0%}" for t, b in sorted(by.items(), key=lambda kv: -kv[1])[:3])
        rows.append(("Precision", f"not recorded; variable bytes by type: {mix}", "precision"))
    if "model" in o:
        rows.insert(0, ("Model", o["model"], "model"))
    return rows, samples


def _summary(report) -> str:
    c = report.compilation
    tg = c.target
    f = summary_figures(report)
    clock = tg.clockFrequency
    run_rows, samples = _run_rows(report)
    rows = run_rows + [
            ("Target", f"{tg.numIPUs} x {tg.arch} ({tg.version}, {tg.type}), {tg.tilesPerIpu:,} tiles per IPU, "
                       f"{tg.bytesPerTile / 1024:,.1f} KiB per tile, {clock / 1e6:,.1f} MHz", "target"),
            ("Poplar version", report.poplarVersion.string, "poplar-version"),
            ("Graph", f"{c.graph.numVertices:,} vertices, {c.graph.numEdges:,} edges, {c.graph.numVariables:,} "
                      f"variables, {c.graph.numComputeSets:,} compute sets", "graph"),
            ("Total memory (bytes, all tiles)", f"{f['total_memory']:,}", "total-memory"),
            ("Worst tile", f"tile {f['worst_tile']}: {f['worst_tile_bytes']:,} B "
                           f"({f['worst_tile_bytes'] / tg.bytesPerTile:.1%} of a tile)", "worst-tile"),
            ("Tiles out of memory", f"{c.outOfMemoryTiles.size:,}", "oom-tiles"),
            ("Liveness peak (not-always-live bytes, all tiles)",
             f"{f['liveness_peak']:,} B at program step {f['liveness_peak_step']}", "liveness-peak"),
            ("Biggest compute set (predicted cycles on its busiest tile)",
             f"{f['biggest_compute_set']}: {f['biggest_compute_set_cycles']:,} cycles", "biggest-compute-set")]
    if f["cycles_per_run"] is not None:
        cyc = f["cycles_per_run"]
        if not cyc:
            tput = "-"
        elif samples:
            tput = f"{clock / cyc * samples:,.1f} samples/s ({clock / cyc:,.1f} runs/s of {samples:,} samples)"
        else:
            tput = f"{clock / cyc:,.1f} runs/s (samples per run not recorded)"
        rows += [("Cycles per run (predicted, first run)", f"{cyc:,}", "cycles-per-run"),
                 ("Latency per run (predicted)", f"{cyc / clock * 1e6:,.1f} us", "latency"),
                 ("Throughput (predicted)", tput, "throughput")]
        run = report.execution.runs[0]
        if not run.dry:
            rows.append(("Host time of that run (simulation on this machine, not IPU)", f"{run.hostSeconds:.3f} s",
                         "host-seconds"))
    body = "".join(f"<tr><th>{_e(k)}</th><td id='{i}'>{_e(v)}</td></tr>" for k, v, i in rows)
    return f"<table class='summary'>{body}</table>"


def _heatmap(report, go) -> str:
    c = report.compilation
    tpi, n_ipus = c.target.tilesPerIpu, c.target.numIPUs
    cols = int(math.ceil(math.sqrt(tpi * 1.5)))
    rows = int(math.ceil(tpi / cols))
    pad = rows * cols - tpi
    mem = c.memoryByTile.astype(np.float64).reshape(n_ipus, tpi)
    z = np.pad(mem, ((0, 0), (0, pad)), constant_values=np.nan).reshape(n_ipus * rows, cols)
    tiles = np.pad(np.arange(n_ipus * tpi, dtype=np.float64).reshape(n_ipus, tpi), ((0, 0), (0, pad)),
                   constant_values=np.nan).reshape(n_ipus * rows, cols)
    fig = go.Figure(go.Heatmap(z=z, customdata=tiles, colorscale="Viridis", zmin=0,
                               hovertemplate="tile %{customdata}<br>%{z:,.0f} B<extra></extra>",
                               colorbar=dict(title="bytes")))
    fig.update_layout(title=f"Memory per tile (bytes; {n_ipus} IPU(s), {cols} tiles per row)", height=380 * n_ipus)
    fig.update_yaxes(autorange="reversed", title="IPU rows")
    return _fig_html(fig, "plot-memory-heatmap")


def _histogram(reports, names, go) -> str:
    fig = go.Figure()
    for r, n in zip(reports, names):
        fig.add_trace(go.Histogram(x=r.compilation.memoryByTile, name=n, nbinsx=80, opacity=0.7))
    limit = reports[0].compilation.target.bytesPerTile
    fig.add_vline(x=limit, line=dict(color="red", dash="dash"),
                  annotation_text=f"out of memory: {limit:,} B per tile", annotation_position="top left")
    fig.update_layout(title="Tiles by memory used (bytes)", barmode="overlay", xaxis_title="bytes per tile",
                      yaxis_title="tiles", height=380)
    return _fig_html(fig, "plot-memory-histogram" if len(reports) == 1 else "plot-compare-histogram")


def _categories(reports, names, go) -> str:
    fig = go.Figure()
    for r, n in zip(reports, names):
        cats = r.compilation.memoryByCategory
        fig.add_trace(go.Bar(x=list(cats), y=[int(v.sum()) for v in cats.values()], name=n))
    fig.update_layout(title="Memory by category (bytes, all tiles)", yaxis_title="bytes", barmode="group", height=380)
    return _fig_html(fig, "plot-memory-categories" if len(reports) == 1 else "plot-compare-categories")


def _liveness(reports, names, go) -> str:
    fig = go.Figure()
    for r, n in zip(reports, names):
        live = r.compilation.livenessBytes
        fig.add_trace(go.Scatter(y=live, mode="lines", name=f"{n} not-always-live bytes"))
        step, peak = r.compilation.livenessPeak()
        fig.add_trace(go.Scatter(x=[step], y=[peak], mode="markers+text", marker=dict(size=11, color="red"),
                                 text=[f"peak {peak:,} B @ step {step}"], textposition="top center",
                                 name=f"{n} peak"))
    fig.update_layout(title="Liveness: not-always-live memory over program steps (bytes, all tiles)",
                      xaxis_title="program step", yaxis_title="bytes", height=400)
    return _fig_html(fig, "plot-liveness" if len(reports) == 1 else "plot-compare-liveness")


def _program_tree(report, limit: int = 5000) -> str:
    comp = report.compilation
    out, count = [], 0
    total = sum(comp.stepCycles().values())
    step_cycles = total.max(axis=1) if total.size else np.zeros(0)

    def node(p, depth):
        nonlocal count
        count += 1
        if count > limit:
            return ""
        kind = p.type + (f" x{p.repeatCount:,}" if p.repeatCount else "")
        label = f"{p.name} ({kind})" if p.name else kind
        if p.step is not None:
            label += f"  [step {p.step}, {step_cycles[p.step]:,.0f} cycles predicted]"
            return f"<li class='leaf'>{_e(label)}</li>"
        if depth >= MAX_TREE_DEPTH:
            return (f"<li class='leaf'>{_e(label)} ({len(p.children)} children, deeper than {MAX_TREE_DEPTH} "
                    "levels: not shown)</li>")
        if not p.children:
            return f"<li class='leaf'>{_e(label)}: empty</li>"
        kids = "".join(node(c, depth + 1) for c in p.children)
        opened = " open" if depth < 2 else ""
        n = len(p.children)
        return (f"<li><details{opened}><summary>{_e(label)}: {n:,} program{'s' if n != 1 else ''}</summary>"
                f"<ul>{kids}</ul></details></li>")
    for root in comp.controlPrograms:
        out.append(node(root, 0))
    more = f"<p>(first {limit:,} of {len(comp.programs):,} program nodes shown)</p>" if count > limit else ""
    return f"<ul class='tree'>{''.join(out)}</ul>{more}"


def _trace(report, go) -> str:
    runs = report.execution.runs
    if not runs:
        return "<p>No execution recorded (the profile has no runs).</p>"
    comp = report.compilation
    import numpy as _np
    run = runs[0]
    a = report._arrays
    idx = a[f"runs/{run._i}/trace/step"][:MAX_TRACE_STEPS].astype(_np.int64)
    end = a[f"runs/{run._i}/trace/end"][:MAX_TRACE_STEPS]
    start = _np.concatenate(([0.0], end[:-1])) if end.size else end
    cyc = comp.stepCycles()
    n_ipus = comp.target.numIPUs
    fig = go.Figure()
    names = _np.array([s[2] for s in report._data["steps"]], dtype=object)
    for ipu in range(n_ipus):
        base = start.copy()
        for cat in ("sync", "exchange", "global_exchange", "host_exchange", "compute"):
            d = cyc[cat][idx, ipu]
            keep = d > 0
            if keep.any():
                fig.add_trace(go.Bar(
                    x=d[keep], base=base[keep], y=_np.full(int(keep.sum()), f"IPU {ipu}"), orientation="h",
                    name=_LABELS[cat], legendgroup=cat, showlegend=ipu == 0, marker_color=_COLOURS[cat],
                    customdata=_np.stack([names[idx[keep]], idx[keep], _np.round(d[keep]).astype(_np.int64),
                                          _np.round(base[keep]).astype(_np.int64)], axis=1).astype(object),
                    # plotly's %{x} of a bar with a base is where the bar ends: show the duration
                    hovertemplate="%{customdata[0]} (step %{customdata[1]})<br>" + _LABELS[cat]
                                  + " %{customdata[2]:,} cycles, from cycle %{customdata[3]:,}<extra></extra>"))
            base = base + d
    fig.update_layout(title=f"Execution trace of run 0 (predicted cycles; {idx.size:,} steps"
                            f"{' shown' if idx.size == MAX_TRACE_STEPS else ''}); drag to zoom",
                      barmode="overlay", xaxis_title="cycles", height=260 + 60 * n_ipus,
                      xaxis=dict(rangeslider=dict(visible=True)))
    return _fig_html(fig, "plot-execution-trace")


def _table(headers, rows, table_id) -> str:
    h = "".join(f"<th>{_e(x)}</th>" for x in headers)
    b = "".join("<tr>" + "".join(f"<td>{_e(x)}</td>" for x in r) + "</tr>" for r in rows)
    return f"<table id='{table_id}' class='data'><thead><tr>{h}</tr></thead><tbody>{b}</tbody></table>"


def _largest(report, n: int = 25) -> tuple[str, str]:
    c = report.compilation
    vs = sorted(c.variables, key=lambda v: -v.size)[:n]
    var = _table(["variable", "bytes", "type", "shape", "tiles", "constant"],
                 [(v.name, f"{v.size:,}", v.type, "x".join(map(str, v.shape)), v.numTiles, "yes" if v.constant else "")
                  for v in vs], "table-variables")
    vt = sorted(c.vertexTypes, key=lambda v: (-v.count, v.name))[:n]
    vtx = _table(["vertex type", "instances", "state bytes", "code bytes per tile", "cycles (predicted)"],
                 [(v.name, f"{v.count:,}", f"{v.stateBytes:,.0f}", f"{v.codeBytes:,.0f}", f"{v.cycles:,.0f}") for v in vt],
                 "table-vertex-types")
    css = sorted(c.computeSets, key=lambda s: -float(s.estimatedCyclesByTile.max()) if s.estimatedCyclesByTile.size else 0)[:n]
    cst = _table(["compute set", "vertices", "tiles", "cycles on busiest tile (predicted)"],
                 [(s.name, f"{s.numVertices:,}", f"{s.numTiles:,}",
                   f"{float(s.estimatedCyclesByTile.max()) if s.estimatedCyclesByTile.size else 0:,.0f}") for s in css],
                 "table-compute-sets")
    return var, vtx + "<h3>Compute sets with the most cycles</h3>" + cst


def _operations(report, go, n: int = 200) -> str:
    """Predicted cycles and memory per ONNX op and PopLibs call (:mod:`.operations`)."""
    from openipu.popvision.operations import operations
    ops = operations(report)
    run_total = sum(o.cycles for o in ops) or 1.0
    rows = [(o.name, o.type, f"{o.cycles:,.0f}", f"{o.cycles / run_total:.1%}", f"{o.compute_cycles:,.0f}",
             f"{o.exchange_cycles:,.0f}", f"{o.variable_bytes:,}", f"{o.steps:,}", f"{o.executions:,}",
             ", ".join(f"{k} {v['cycles']:,.0f}" for k, v in sorted(o.calls.items(), key=lambda kv: -kv[1]["cycles"])))
            for o in ops[:n]]
    table = _table(["op", "ONNX type", "cycles (predicted)", "share", "compute cycles", "exchange cycles",
                    "variable bytes (all tiles)", "steps", "executions", "PopLibs calls (cycles)"], rows,
                   "table-operations")
    top = [o for o in ops if o.cycles > 0][:25][::-1]
    fig = go.Figure([go.Bar(y=[o.name for o in top], x=[o.compute_cycles for o in top], orientation="h",
                            name="compute", marker_color=_COLOURS["compute"]),
                     go.Bar(y=[o.name for o in top], x=[o.cycles - o.compute_cycles for o in top], orientation="h",
                            name="exchange and sync", marker_color=_COLOURS["exchange"])])
    fig.update_layout(title="Ops with the most predicted cycles (first run)", barmode="stack",
                      xaxis_title="cycles (predicted)", height=220 + 22 * len(top))
    more = f"<p>(the {n:,} ops with the most cycles of {len(ops):,} shown)</p>" if len(ops) > n else ""
    table = f"<div class='scroll'>{table}</div>"
    note = ("<p>Ops are found by name: what PopART makes for an op is called &lt;op type&gt;/&lt;first output&gt;"
            "[/&lt;PopLibs call&gt;]. Cycles: each step's predicted cycles on its busiest IPU, times the "
            "times it ran in the first run.</p>")
    return note + _fig_html(fig, "plot-operations") + table + more


def _peak_variables(report, n: int = 50) -> str:
    """The variables live at the liveness peak: the not-always-live ones whose def-use segments
    cover the peak step, and the always-live total."""
    c = report.compilation
    step, peak = c.livenessPeak()
    live = c.livenessPeakVariables()
    if live is None:
        return "<p>This profile does not record the variables live at the peak.</p>"
    nal = sum(v.size for v in live)
    always = sum(v.size for v in c.variables if v.alwaysLive)
    head = (f"<p id='peak-variables-summary'>At program step {step:,} (the peak, {peak:,} not-always-live bytes "
            f"over all tiles): {len(live):,} not-always-live variables hold {nal:,} B; operands received over "
            f"exchange for that step hold the rest, {max(peak - nal, 0):,} B. The always-live variables "
            f"({always:,} B) and the constants are live there too, as at every step.</p>")
    rows = [(v.name, f"{v.size:,}", v.type, "x".join(map(str, v.shape)), f"{v.numTiles:,}") for v in live[:n]]
    more = f"<p>(the {n:,} largest of {len(live):,} shown)</p>" if len(live) > n else ""
    return head + _table(["variable", "bytes", "type", "shape", "tiles"], rows, "table-peak-variables") + more


def _compare(a, b, names, go) -> str:
    fa, fb = summary_figures(a), summary_figures(b)
    rows = []
    for key, label in (("total_memory", "total memory (B)"), ("worst_tile_bytes", "worst tile (B)"),
                       ("cycles_per_run", "cycles per run (predicted)"), ("liveness_peak", "liveness peak (B)"),
                       ("biggest_compute_set_cycles", "biggest compute set (cycles)")):
        x, y = fa[key], fb[key]
        delta = "" if x in (None, 0) or y is None else f"{(y - x) / x:+.1%}"
        rows.append((label, f"{x:,}" if x is not None else "-", f"{y:,}" if y is not None else "-", delta))
    table = _table(["", names[0], names[1], "change"], rows, "table-compare")
    return (table + _histogram([a, b], names, go) + _categories([a, b], names, go) + _liveness([a, b], names, go))


_CSS = """
body{font-family:system-ui,sans-serif;margin:0;color:#222}
header{background:#263238;color:#fff;padding:10px 20px}
nav{position:sticky;top:0;background:#eceff1;padding:6px 20px;z-index:5}
nav a{margin-right:14px;color:#01579b;text-decoration:none}
section{padding:10px 20px;border-bottom:1px solid #ddd}
table{border-collapse:collapse} td,th{padding:3px 8px;border:1px solid #ddd;text-align:left;font-size:13px}
table.summary th{background:#f5f5f5}
div.scroll{max-height:640px;overflow:auto;display:inline-block}
ul.tree{font-family:monospace;font-size:12px} ul.tree ul{padding-left:18px} li.leaf{list-style:circle}
"""


def render(report, compare=None, title: str | None = None) -> str:
    """The HTML page of ``report`` (a :class:`~openipu.popvision.report.Report`), with a compare
    view against ``compare`` if given. Returns the page as a string (plotly.js inlined)."""
    import plotly
    import plotly.graph_objects as go
    title = title or f"openipu Graph Analyser report: {report.path}"
    views = [("summary", "Summary", _summary(report)),
             ("memory-heatmap", "Memory per tile", _heatmap(report, go)),
             ("memory-histogram", "Memory histogram", _histogram([report], ["this"], go)),
             ("memory-categories", "Memory by category", _categories([report], ["this"], go)),
             ("liveness", "Liveness", _liveness([report], ["this"], go)
              + "<h3>Variables live at the peak</h3>" + _peak_variables(report)),
             ("operations", "Operations", _operations(report, go)),
             ("program-tree", "Program tree", _program_tree(report)),
             ("execution-trace", "Execution trace", _trace(report, go))]
    var, vtx = _largest(report)
    views += [("largest-variables", "Largest variables", var), ("largest-vertices", "Vertices", vtx)]
    if compare is not None:
        import os
        label = lambda r: os.path.basename(os.path.dirname(os.path.abspath(r.path))) or r.path  # noqa: E731
        names = [f"A: {label(report)}", f"B: {label(compare)}"]
        views.append(("compare", "Compare", _compare(report, compare, names, go)))
    nav = "".join(f"<a href='#{i}'>{_e(t)}</a>" for i, t, _ in views)
    secs = "".join(f"<section id='{i}'><h2>{_e(t)}</h2>{body}</section>" for i, t, body in views)
    js = plotly.offline.get_plotlyjs()
    return (f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>{_e(title)}</title>"
            f"<link rel='icon' href='data:,'><style>{_CSS}</style><script>{js}</script></head><body>"
            f"<header><h1 style='margin:0;font-size:20px'>{_e(title)}</h1>"
            f"<div>All cycle and memory figures are predictions for the IPU by openipu's cost model.</div></header>"
            f"<nav>{nav}</nav>{secs}</body></html>")


def write_report(profile, out_path: str, compare=None) -> str:
    """Write the HTML report of ``profile`` (a path to ``profile.pop`` or its directory, or a
    Report) to ``out_path``; ``compare``: a second profile for the compare view. Returns
    ``out_path``.

    The page is rendered in memory, written to a temporary file beside ``out_path`` and renamed
    over it (``os.replace``), so an error leaves no partial or empty page and never destroys the
    previous one. Raises the ``pva`` errors of :func:`openipu.popvision.openReport` (a damaged
    profile, also one found while rendering, is :class:`~openipu.popvision.CorruptReport`) and
    ``OSError`` if the file cannot be written."""
    from openipu.popvision.report import Report, openReport
    r = profile if isinstance(profile, Report) else openReport(profile)
    c = None if compare is None else (compare if isinstance(compare, Report) else openReport(compare))
    page = render(r, c).encode("utf-8")
    _write_atomically(out_path, page)
    return out_path


def _write_atomically(path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file in the same directory and
    ``os.replace``; the temporary file is removed on any error. The new file gets the usual
    permissions (0666 less the umask), like ``open(path, "w")``."""
    import os
    import secrets
    path = os.fspath(path)
    directory, base = os.path.split(os.path.abspath(path))
    tmp = os.path.join(directory, f".{base}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
