"""Drop-in ``poptorch`` module: ``import poptorch`` gives :mod:`openipu.poptorch` (PopTorch's Python
API on the simulated IPU), so PopTorch scripts run unchanged."""

import sys as _sys

import openipu.poptorch as _openipu_poptorch
from openipu.poptorch import *  # noqa: F401,F403

for _name in dir(_openipu_poptorch):
    if not _name.startswith("__"):
        globals()[_name] = getattr(_openipu_poptorch, _name)
for _sub in ("optim", "enums", "options", "ops", "_impl"):
    _sys.modules[f"{__name__}.{_sub}"] = getattr(_openipu_poptorch, _sub)
del _name, _sub
