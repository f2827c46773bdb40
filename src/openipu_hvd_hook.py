"""Start-up hook that makes ``import horovod.torch`` give openipu's stand-in
(:mod:`openipu.popdist.horovod_torch`) when no real Horovod is installed.

Graphcore's PopTorch applications run under ``poprun`` import ``horovod.torch`` for host-side
metrics and the weight broadcast; Graphcore's SDK shipped a Horovod build for its ``poprun``.
Horovod does not build against the torch openipu pins (docs/scaleout.md), so openipu answers the
two names ``horovod`` and ``horovod.torch`` itself -- but only *after* every other finder:
the finder is appended to the end of ``sys.meta_path``, so a real Horovod anywhere on the path
is always found first and this hook never sees the import. ``horovod`` is then an empty package
(``horovod.is_openipu_stand_in`` is True) and ``horovod.torch`` re-exports the stand-in's
functions; any other ``horovod.*`` name is not found. ``OPENIPU_HVD_HOOK=0`` turns it off.

Installed by ``import popdist`` (most of Graphcore's applications import ``popdist`` before
``horovod.torch``; ViT's ``pretrain.py`` does not) and by ``openipu-horovod.pth`` (one ``import openipu_hvd_hook`` line in
site-packages, shipped by the wheel, or written by ``python -m openipu_hvd_hook install`` for an
editable install). It imports nothing heavy at start-up (the stand-in and torch load when
``horovod.torch`` is imported).
"""

import os
import sys

_NAMES = ("horovod", "horovod.torch")
_IMPL = "openipu.popdist.horovod_torch"


class _StandInLoader:
    """Loads ``horovod`` (an empty package) or ``horovod.torch`` (the stand-in's names)."""

    def create_module(self, spec):
        return None                         # the default module object

    def exec_module(self, module):
        module.is_openipu_stand_in = True
        if module.__name__ == "horovod":
            module.__doc__ = ("openipu's stand-in for Horovod (no Horovod is installed): only horovod.torch, "
                              "see openipu.popdist.horovod_torch")
            module.__version__ = "0.28.1+openipu"
            return
        import importlib
        impl = importlib.import_module(_IMPL)
        module.__doc__ = impl.__doc__
        for name in impl.__all__:
            setattr(module, name, getattr(impl, name))


class HorovodStandInFinder:
    """Answers ``horovod`` / ``horovod.torch`` when nothing before it in ``sys.meta_path`` did
    (``horovod.torch`` only under the stand-in ``horovod``). A ``MetaPathFinder`` by protocol."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in _NAMES or os.environ.get("OPENIPU_HVD_HOOK") == "0":
            return None
        if fullname == "horovod.torch" and not getattr(sys.modules.get("horovod"), "is_openipu_stand_in", False):
            return None
        import importlib.util
        if importlib.util.find_spec("openipu") is None:
            return None
        return importlib.util.spec_from_loader(fullname, _StandInLoader(), origin=_IMPL,
                                               is_package=fullname == "horovod")


def install() -> None:
    """Append the finder to ``sys.meta_path`` (idempotent)."""
    if not any(isinstance(f, HorovodStandInFinder) for f in sys.meta_path):
        sys.meta_path.append(HorovodStandInFinder())


def write_pth(site_dir=None) -> str:
    """Write ``openipu-horovod.pth`` into ``site_dir`` (default: this environment's
    site-packages) and return its path (:func:`openipu_pth.write_pth`)."""
    import openipu_pth
    return openipu_pth.write_pth("openipu-horovod.pth", "openipu_hvd_hook", site_dir)


install()

if __name__ == "__main__":
    import openipu_pth
    openipu_pth.main("openipu-horovod.pth", "openipu_hvd_hook")
