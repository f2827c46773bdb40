"""Drop-in ``popart`` module: ``import popart`` gives :mod:`openipu.popart` (PopART's Python API
on the simulated IPU), so PopART scripts run unchanged."""

import sys as _sys

import openipu.popart as _impl
from openipu.popart import *  # noqa: F401,F403

for _name in dir(_impl):
    if not _name.startswith("__"):
        globals()[_name] = getattr(_impl, _name)
for _sub in ("builder", "session", "tensorinfo"):
    _sys.modules[f"{__name__}.{_sub}"] = getattr(_impl, _sub)
del _name, _sub
