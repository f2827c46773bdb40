"""Read a profile with the ``pva`` API only and print its headline figures.

    python scripts/pva_acceptance.py PROFILE_DIR [--json]

Prints: total memory (bytes over all tiles) and the worst tile, the predicted cycles per step
(the first run), the liveness peak (not-always-live bytes over all tiles, and its program step)
and the biggest compute set (the most predicted cycles on its busiest tile). Uses libpva's
attributes only (``compilation.tiles[i].memory.total.includingGaps``, ``execution.runs[0].steps``,
``compilation.livenessProgramSteps``, ``compilation.computeSets``), so it runs on Graphcore's
libpva as well as openipu's.
"""

import json
import os
import sys

import pva


def figures(profile: str) -> dict:
    path = os.path.join(profile, "profile.pop") if os.path.isdir(profile) else profile
    report = pva.openReport(path)
    tiles = report.compilation.tiles
    by_tile = [t.memory.total.includingGaps for t in tiles]
    worst = max(range(len(by_tile)), key=lambda i: (by_tile[i], -i))
    steps = report.execution.runs[0].steps
    cycles = max(s.cyclesTo for s in steps) if steps else 0
    live = report.compilation.livenessProgramSteps
    peak = max(live, key=lambda s: s.notAlwaysLiveMemory.bytes)
    big = max(report.compilation.computeSets, key=lambda c: max(c.estimatedCyclesByTile))
    return {"total_memory": int(sum(by_tile)), "worst_tile": worst, "worst_tile_bytes": int(by_tile[worst]),
            "cycles_per_step": int(round(cycles)), "liveness_peak": int(peak.notAlwaysLiveMemory.bytes),
            "liveness_peak_step": peak.index, "biggest_compute_set": big.name,
            "biggest_compute_set_cycles": int(round(float(max(big.estimatedCyclesByTile))))}


def main(argv):
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 1
    f = figures(argv[0])
    if "--json" in argv:
        print(json.dumps(f))
        return 0
    print(f"total memory        {f['total_memory']:,} B")
    print(f"worst tile          {f['worst_tile']} ({f['worst_tile_bytes']:,} B)")
    print(f"cycles per step     {f['cycles_per_step']:,} (predicted)")
    print(f"liveness peak       {f['liveness_peak']:,} B at program step {f['liveness_peak_step']}")
    print(f"biggest compute set {f['biggest_compute_set']} ({f['biggest_compute_set_cycles']:,} cycles on its busiest tile)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
