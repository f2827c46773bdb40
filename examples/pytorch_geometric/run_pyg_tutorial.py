"""Run one of Graphcore's PyTorch Geometric tutorial scripts unmodified, with generated stand-ins
for the datasets it would download (no network here).

Usage: ``python examples/pytorch_geometric/run_pyg_tutorial.py SCRIPT.py [--scale F] [--qm9 N]
[--no-startup-hooks]``. Before ``SCRIPT.py`` runs as ``__main__`` (from its own folder, with
``matplotlib`` on the non-interactive Agg backend when installed), ``torch_geometric.datasets``'
``Planetoid``, ``TUDataset``, ``QM9`` and ``IMDB`` are replaced by :mod:`standin_datasets`
classes with the same constructor arguments, feature widths, classes and attributes, and random
(seeded, class-dependent) contents; ``--scale`` shrinks the node counts of the single-graph
datasets (Planetoid, IMDB), ``--qm9`` sets the number of generated molecules.

The ``.pth`` start-up hooks the openipu wheel installs into site-packages
(``openipu-tensorflow.pth``, ``openipu-pyg.pth``) are processed first, from ``src/`` of this
checkout (``site.addsitedir``), as they would be in an installed environment; an editable install
has no ``.pth`` files, so without this a script that builds PyG's ``ClusterData`` before
``import poptorch_geometric`` would find no partitioner. ``--no-startup-hooks`` skips them.

Nothing is imported from ``poptorch`` / ``poptorch_geometric`` here: the tutorial imports them
itself, in its own order.
"""

import argparse
import os
import runpy
import site
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main():
    p = argparse.ArgumentParser()
    p.add_argument("script")
    p.add_argument("--scale", type=float, default=1.0,
                   help="fraction of the real node count for Planetoid / IMDB stand-ins (default 1)")
    p.add_argument("--qm9", type=int, default=1270, help="number of generated QM9 molecules (default 1270)")
    p.add_argument("--no-startup-hooks", action="store_true", help="do not process src/*.pth first")
    args = p.parse_args()
    if not args.no_startup_hooks:
        site.addsitedir(str(HERE.parent.parent / "src"))
    try:
        import matplotlib
        matplotlib.use("Agg")
    except ImportError:
        pass
    sys.path.insert(0, str(HERE))
    import standin_datasets
    standin_datasets.install(scale=args.scale, qm9_molecules=args.qm9)
    script = Path(args.script).resolve()
    sys.argv = [str(script)]
    sys.path.insert(0, str(script.parent))
    os.chdir(script.parent)
    runpy.run_path(str(script), run_name="__main__")


if __name__ == "__main__":
    main()
