"""Drop-in ``poptorch`` module: ``import poptorch`` gives :mod:`openipu.poptorch` (PopTorch's Python
API on the simulated IPU), so PopTorch scripts run unchanged."""

import sys as _sys

import openipu.poptorch as _impl
from openipu.poptorch import *  # noqa: F401,F403

for _name in dir(_impl):
    if not _name.startswith("__"):
        globals()[_name] = getattr(_impl, _name)
for _sub in ("optim", "enums", "options", "ops"):
    _sys.modules[f"{__name__}.{_sub}"] = getattr(_impl, _sub)
del _name, _sub
