"""Drop-in ``popdist`` module: ``import popdist`` gives :mod:`openipu.popdist` (PopDist's Python
API); ``popdist.poptorch`` and ``popdist.popart`` are its PopTorch and PopART helpers."""

import importlib as _importlib

import openipu.popdist as _impl
from openipu.popdist import *  # noqa: F401,F403

for _name in dir(_impl):
    if not _name.startswith("__"):
        globals()[_name] = getattr(_impl, _name)


def __getattr__(name):
    # popdist.poptorch / .popart / .tensorflow load on first use (they import PopTorch / PopART / TF)
    if name in ("poptorch", "popart", "tensorflow"):
        return _importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module 'popdist' has no attribute {name!r}")


del _name
