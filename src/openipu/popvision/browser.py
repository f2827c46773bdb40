"""Open a report page in a real headless browser (Debian's chromium driven by playwright, a test
extra; no browser download) and check it: console errors, each view rendered, screenshots.

Used by the tests and by ``scripts/popvision_screenshots.py`` (the screenshots in docs/).
"""

from __future__ import annotations

import os

#: The report's views: section id -> the element that shows it has rendered.
VIEWS = {"summary": "#total-memory", "memory-heatmap": "#plot-memory-heatmap .main-svg",
         "memory-histogram": "#plot-memory-histogram .main-svg",
         "memory-categories": "#plot-memory-categories .main-svg", "liveness": "#plot-liveness .main-svg",
         "operations": "#table-operations tbody tr",
         "program-tree": "ul.tree li", "execution-trace": "#plot-execution-trace .main-svg",
         "largest-variables": "#table-variables tbody tr", "largest-vertices": "#table-vertex-types tbody tr"}
COMPARE_VIEW = {"compare": "#plot-compare-histogram .main-svg"}
CHROMIUM = os.environ.get("OPENIPU_CHROMIUM", "/usr/bin/chromium")


def check_page(html_path: str, screenshot_dir: str | None = None, compare: bool = False,
               width: int = 1400) -> dict:
    """Load ``html_path`` in headless chromium; return ``{"errors": [console errors and page
    errors], "rendered": {view: bool}, "texts": {element id: text}, "screenshots": [paths],
    "trace_hovers": [hover text of the execution trace's first bars, as the mouse shows it],
    "tree_labels": [the program tree's labels, containers and leaves], "ops": [rows of the Operations table],
    "peak_variables": [rows of the table of variables live at the liveness peak]}``.
    Screenshots (PNG, one per view, and ``execution-trace-hover.png``: the trace with the first
    compute bar's hover shown) go to ``screenshot_dir`` if given. Raises playwright's
    errors if chromium cannot start."""
    from playwright.sync_api import sync_playwright
    views = dict(VIEWS, **(COMPARE_VIEW if compare else {}))
    out = {"errors": [], "rendered": {}, "texts": {}, "screenshots": []}
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": width, "height": 900})
            page.on("console", lambda m: out["errors"].append(f"console {m.type}: {m.text}")
                    if m.type == "error" else None)
            page.on("pageerror", lambda e: out["errors"].append(f"page error: {e}"))
            page.goto("file://" + os.path.abspath(html_path), wait_until="load")
            for view, sel in views.items():
                try:
                    page.wait_for_selector(sel, timeout=30_000)
                    out["rendered"][view] = True
                except Exception:  # noqa: BLE001 - reported as not rendered
                    out["rendered"][view] = False
            for i in ("total-memory", "worst-tile", "cycles-per-run", "liveness-peak", "biggest-compute-set",
                      "batch-size", "precision", "mode", "throughput", "host-seconds", "peak-variables-summary"):
                loc = page.locator(f"#{i}")
                if loc.count():
                    out["texts"][i] = loc.inner_text()
            hover_shot = os.path.join(screenshot_dir, "execution-trace-hover.png") if screenshot_dir else None
            if hover_shot:
                os.makedirs(screenshot_dir, exist_ok=True)
            out["trace_hovers"] = _trace_hovers(page, shot=hover_shot) if "execution-trace" in views else []
            if hover_shot and any(out["trace_hovers"]) and os.path.exists(hover_shot):
                out["screenshots"].append(hover_shot)
            out["ops"] = _rows(page, "#table-operations tbody tr")
            out["peak_variables"] = _rows(page, "#table-peak-variables tbody tr")
            out["tree_labels"] = page.locator("ul.tree summary, ul.tree li.leaf").all_text_contents()[:200]
            if screenshot_dir:
                os.makedirs(screenshot_dir, exist_ok=True)
                page.add_style_tag(content="nav{position:static !important}")   # keep it out of the shots
                for view in views:
                    path = os.path.join(screenshot_dir, f"{view}.png")
                    sec = page.locator(f"section#{view}")
                    sec.scroll_into_view_if_needed()
                    sec.screenshot(path=path)
                    out["screenshots"].append(path)
        finally:
            browser.close()
    return out


def _trace_hovers(page, n: int = 3, shot: str | None = None) -> list:
    """Move the mouse over the first ``n`` compute bars of the execution trace (the view is
    scrolled into sight) and return plotly's hover text for each; ``shot``: a PNG path for a
    screenshot of the view while the first bar's hover shows."""
    out, shot_taken = [], False
    page.locator("section#execution-trace").scroll_into_view_if_needed()
    bars = page.locator("#plot-execution-trace .cartesianlayer .subplot.xy .barlayer .trace").last.locator("path")
    for k in range(min(n, bars.count())):
        bar = bars.nth(k)
        box = bar.bounding_box()
        if not box or box["width"] < 1:
            continue
        page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
        try:
            page.wait_for_selector("#plot-execution-trace .hoverlayer .hovertext", timeout=5_000)
            out.append(page.locator("#plot-execution-trace .hoverlayer .hovertext").first.text_content() or "")
            if shot and not shot_taken:
                page.locator("section#execution-trace").screenshot(path=shot)
                shot_taken = True
        except Exception:  # noqa: BLE001 - no hover: reported as missing
            out.append("")
        page.mouse.move(0, 0)
    return out


def _rows(page, selector: str, n: int = 100) -> list:
    """The cell texts of the first ``n`` table rows matching ``selector``."""
    rows = page.locator(selector)
    return [rows.nth(k).locator("td").all_text_contents() for k in range(min(n, rows.count()))]
