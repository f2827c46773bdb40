"""Start-up hook that makes ``from tensorflow.python import ipu`` import :mod:`openipu.tensorflow`.

Installed by ``openipu-tensorflow.pth`` (one ``import openipu_tf_hook`` line in site-packages, put
there by the openipu wheel, or by ``python -m openipu_tf_hook install`` for an editable install):
it runs in every interpreter of the
environment, so it imports nothing heavy (never TensorFlow) and only registers a
:class:`importlib.abc.MetaPathFinder` that answers the single name ``tensorflow.python.ipu``.

It steps aside (answers ``None``) when Graphcore's own TensorFlow is installed, i.e. when a real
``tensorflow/python/ipu`` package exists next to ``tensorflow.python``, or when the environment
variable ``OPENIPU_TF_HOOK=0`` is set.
"""

import os
import sys

_NAME = "tensorflow.python.ipu"


class IpuImportFinder:
    """Finds ``tensorflow.python.ipu`` in ``openipu/tensorflow`` (a real package directory, so its
    submodules ``config``, ``ipu_strategy``, ... load under Graphcore's module names). A
    ``MetaPathFinder`` by protocol: importing ``importlib.abc`` at start-up would cost ~0.1 s."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != _NAME or os.environ.get("OPENIPU_TF_HOOK") == "0":
            return None
        for p in path or ():
            if os.path.isdir(os.path.join(p, "ipu")):      # Graphcore's TensorFlow: use it
                return None
        import importlib.util
        spec = importlib.util.find_spec("openipu")
        if spec is None or not spec.submodule_search_locations:
            return None
        pkg = os.path.join(list(spec.submodule_search_locations)[0], "tensorflow")
        return importlib.util.spec_from_file_location(_NAME, os.path.join(pkg, "__init__.py"),
                                                      submodule_search_locations=[pkg])


def install() -> None:
    """Put the finder first in ``sys.meta_path`` (idempotent)."""
    if not any(isinstance(f, IpuImportFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, IpuImportFinder())


def write_pth(site_dir=None) -> str:
    """Write ``openipu-tensorflow.pth`` into ``site_dir`` (default: this environment's
    site-packages) and return its path (:func:`openipu_pth.write_pth`; ``make test-tensorflow``
    runs ``python -m openipu_tf_hook install`` for the editable install)."""
    import openipu_pth
    return openipu_pth.write_pth("openipu-tensorflow.pth", "openipu_tf_hook", site_dir)


install()

if __name__ == "__main__":
    import openipu_pth
    openipu_pth.main("openipu-tensorflow.pth", "openipu_tf_hook")
