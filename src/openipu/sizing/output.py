"""The output of a sweep: the text table, CSV, the JSON document and the HTML plot (predicted IPU
figures; host seconds labelled as this machine's)."""

from __future__ import annotations

import csv
import io
import os

from openipu.sizing.sweeper import COLUMNS, Sweeper


def table(points) -> str:
    """The points as a text table (predicted IPU figures; host seconds last)."""
    head = ("batch", "ipu", "ipus", "prec", "partials", "AMP", "io", "fits", "latency ms", "samples/s",
            "worst tile", "of tile", "shortfall B", "host s")
    rows = []
    for p in points:
        r = p.row()
        if p.run is None:
            rows.append((r["batch"], r["ipu"], r["num_ipus"], r["precision"], r["partials_type"],
                         f"{r['available_memory_proportion']:g}", r["num_io_tiles"], "error", "", "", "", "", "",
                         f"{r['host_seconds']:.1f}"))
            continue
        rows.append((r["batch"], r["ipu"], r["num_ipus"], r["precision"], r["partials_type"],
                     f"{r['available_memory_proportion']:g}", r["num_io_tiles"], "yes" if r["fits"] else "NO",
                     f"{r['latency_ms']:,.3f}", f"{r['throughput']:,.1f}",
                     f"{r['worst_tile_bytes'] / 1024:,.1f} KiB", f"{r['tile_use']:.0%}",
                     f"{r['shortfall_bytes']:,}" if r["shortfall_bytes"] else "", f"{r['host_seconds']:.1f}"))
    width = [max(len(str(x)) for x in col) for col in zip(head, *rows)]
    fmt = lambda row: "  ".join(str(x).rjust(w) for x, w in zip(row, width))  # noqa: E731
    return "\n".join([fmt(head), fmt(["-" * w for w in width])] + [fmt(r) for r in rows])


def write_csv(points, path: str) -> None:
    """One row per point, :data:`COLUMNS` (raw numbers: seconds as ms, bytes, samples/s)."""
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=COLUMNS, lineterminator="\n")
    w.writeheader()
    for p in points:
        w.writerow(p.row())
    _write_text(path, buf.getvalue())


def document(sweeper: Sweeper, points, max_batches, host_seconds: float, interrupted: bool = False) -> dict:
    """The sweep as one JSON document: every point's ``openipu run --json`` document (or its
    error), the largest batches found and the sweep's host seconds (schema
    ``docs/sweep.schema.json``); ``interrupted``: stopped by Ctrl-C before every point was
    predicted (the points are those done)."""
    pts = []
    for p in points:
        d = {"spec": p.spec.__dict__, "host_seconds": p.host_seconds}
        if p.same_plans_as is not None:
            d["same_plans_as"] = p.same_plans_as.__dict__
        if p.run is not None:
            d["run"] = p.run.to_dict()
        else:
            d["error"] = p.error
        pts.append(d)
    return {"schema": "openipu.sweep/1", "model": sweeper.path,
            "batches_per_step": sweeper.batches_per_step, "tiles_per_ipu": sweeper.tiles_per_ipu,
            "points": pts, "interrupted": interrupted,
            "max_batch": [{"series": s.__dict__ | {"batch": None}, "batch": b} for s, b in max_batches],
            "host": {"label": "this machine running the simulation; not an IPU figure",
                     "sweep_seconds": host_seconds, "jobs": sweeper.jobs,
                     "parent_peak_rss_bytes": sweeper.parent_peak_rss,
                     "worker_peak_rss_bytes": sweeper.worker_peak_rss}}


def plot_html(sweeper: Sweeper, points, title: str | None = None) -> str:
    """A self-contained HTML page (plotly.js inlined): predicted throughput and predicted
    worst-tile memory against the batch size, one line per series, with the tile's memory as the
    fits line."""
    import html

    import plotly
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.08,
                        subplot_titles=("Predicted throughput (samples/s, IPU)",
                                        "Predicted worst-tile memory (KiB, IPU)"))
    series: dict = {}
    for p in points:
        if p.run is not None:
            series.setdefault(p.spec.others(), []).append(p)
    per_tile = None
    for i, (key, pts) in enumerate(sorted(series.items(), key=lambda kv: str(kv[0]))):
        pts = sorted(pts, key=lambda p: p.spec.batch)
        label = pts[0].spec.series_label()
        colour = plotly.colors.qualitative.Plotly[i % len(plotly.colors.qualitative.Plotly)]
        x = [p.spec.batch for p in pts]
        symbols = ["circle" if p.fits else "x" for p in pts]
        text = [f"batch {p.spec.batch}: {'fits' if p.fits else 'does not fit'}" for p in pts]
        fig.add_trace(go.Scatter(x=x, y=[p.run.throughput for p in pts], mode="lines+markers", name=label,
                                 legendgroup=label, line=dict(color=colour), marker=dict(symbol=symbols, size=9),
                                 text=text, hovertemplate="%{text}<br>%{y:,.1f} samples/s<extra>%{fullData.name}"
                                 "</extra>"), row=1, col=1)
        fig.add_trace(go.Scatter(x=x, y=[p.run.tile_bytes_max / 1024 for p in pts], mode="lines+markers",
                                 name=label, legendgroup=label, showlegend=False, line=dict(color=colour),
                                 marker=dict(symbol=symbols, size=9), text=text,
                                 hovertemplate="%{text}<br>%{y:,.1f} KiB<extra>%{fullData.name}</extra>"), row=2, col=1)
        per_tile = pts[0].run.bytes_per_tile
    if per_tile:
        fig.add_hline(y=per_tile / 1024, line=dict(color="#c62828", dash="dash"), row=2, col=1,
                      annotation_text=f"tile memory {per_tile / 1024:,.0f} KiB (fits below)",
                      annotation_position="top left")
    # ticks at the batch sizes swept (a log axis labels 2, 3, ... 9 between decades otherwise);
    # at most 16 of them, spread evenly, so a long --max-batch bisection stays readable
    batches = sorted({p.spec.batch for pts in series.values() for p in pts})
    ticks = batches if len(batches) <= 16 else batches[::-(-len(batches) // 16)]
    axis = dict(type="log", tickmode="array", tickvals=ticks, ticktext=[f"{b:,}" for b in ticks])
    fig.update_xaxes(title_text="batch size", row=2, col=1, **axis)
    fig.update_xaxes(row=1, col=1, **axis)
    fig.update_layout(height=760, template="plotly_white", margin=dict(l=70, r=20, t=50, b=50),
                      legend=dict(orientation="h", y=-0.12))
    body = fig.to_html(full_html=False, include_plotlyjs=False, div_id="sweep",
                       config={"displaylogo": False, "responsive": True})
    title = title or f"openipu sweep: {os.path.basename(sweeper.path)}"
    css = ("body{font-family:system-ui,sans-serif;margin:0;color:#222}header{background:#263238;color:#fff;"
           "padding:10px 20px}section{padding:10px 20px}p.note{color:#555;font-size:13px}")
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<link rel='icon' href='data:,'><style>{css}</style><script>{plotly.offline.get_plotlyjs()}</script>"
            f"</head><body><header><b>{html.escape(title)}</b></header><section><p class='note'>Predicted IPU "
            "figures of the cost model (not host time). Crosses: points that do not fit in tile memory; the "
            "dashed line is a tile's memory.</p>" + body + "</section></body></html>")


def _write_text(path: str, text: str) -> None:
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)
