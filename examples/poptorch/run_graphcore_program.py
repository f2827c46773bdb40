"""Run one of Graphcore's public PopTorch programs (a tutorial, a feature example, a PopTorch
user-guide example) unmodified, with generated stand-ins for what it would download.

Usage: ``python examples/poptorch/run_graphcore_program.py SCRIPT.py [ARGS...]``. Before
``SCRIPT.py`` runs as ``__main__`` (from its own folder, with ``sys.argv = [SCRIPT.py, ARGS...]``):

- ``tests/torchvision_stand_in`` goes first on ``sys.path`` for a program that names torchvision
  (torchvision's CUDA wheels do not load
  here and MNIST / FashionMNIST / CIFAR-10 cannot be downloaded): MNIST-shaped digits from
  scikit-learn, synthetic CIFAR-10, the ResNet-18 / MobileNetV2 architectures with random
  weights. ``TVSTUB_N`` / ``TVSTUB_NTEST`` set how many training / test digits it gives;
- ``matplotlib`` is put on the non-interactive Agg backend when it is installed;
- Hugging Face hubs are set offline (``HF_HUB_OFFLINE=1``): a program that needs a downloaded
  model fails at once instead of waiting on the network;
- for PopTorch's user-guide examples, which read ``tmp/poptorch.conf`` as the docs build lays
  it out, ``poptorch.conf`` beside the script is copied there when present.

Nothing is imported from ``poptorch`` here: the program imports it itself, in its own order.
"""

import os
import runpy
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
STAND_IN = HERE.parent.parent / "tests" / "torchvision_stand_in"


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    script = Path(sys.argv[1]).resolve()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("MPLBACKEND", "Agg")
    if "torchvision" in script.read_text(errors="replace"):
        sys.path.insert(0, str(STAND_IN))
    try:
        import matplotlib
        matplotlib.use("Agg")
    except ImportError:
        pass
    os.chdir(script.parent)
    conf = script.parent / "poptorch.conf"
    if conf.exists() and not (script.parent / "tmp" / "poptorch.conf").exists():
        (script.parent / "tmp").mkdir(exist_ok=True)
        shutil.copy(conf, script.parent / "tmp" / "poptorch.conf")
    sys.argv = [str(script), *sys.argv[2:]]
    sys.path.insert(0, str(script.parent))
    runpy.run_path(str(script), run_name="__main__")


if __name__ == "__main__":
    main()
